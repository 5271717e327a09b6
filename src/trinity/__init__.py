"""Trinity: an evolved coordinator over a pool of LLMs (after TRINITY, Sakana AI, ICLR 2026)."""
import os as _os

# Before torch is imported anywhere: on a small shared CPU, OpenMP's busy-wait between parallel regions
# makes the coordinator LM 3-5x slower whenever anything else runs (llama.cpp decoding, graders).
_os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
