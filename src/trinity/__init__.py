"""Trinity: an evolved coordinator over a pool of LLMs (after TRINITY, Sakana AI, ICLR 2026)."""

__version__ = "0.1.0"
