"""Rows, columns and numbers as every part of the report shows them: the order of benchmarks and methods, split
labels, the column headers of a benchmark, and how a score with its interval is written."""
from __future__ import annotations

from trinity.evaluation.results import HELDOUT, HELDOUT_OTHER, IN_DISTRIBUTION, Benchmark, Cell, EvalResults, Method

SMALL_SAMPLE_MARK = "†"
NO_VALUE = "—"

SPLITS = ((IN_DISTRIBUTION, "in-distribution", "avg (in-dist.)"), (HELDOUT, "held-out", "avg (held-out)"),
          (HELDOUT_OTHER, "held-out, other benchmarks", "avg (held-out, other)"))
"""(key in results.json averages, label, label of the average column), in SPLIT_KEYS order. "held-out": the
mission's held-out benchmarks; "held-out, other benchmarks": every other benchmark never trained on."""

_SPLIT_LABELS = {key: label for key, label, _ in SPLITS}

_KIND_ORDER = {"coordinator": 0, "router": 1, "single": 2, "baseline": 3, "oracle": 5}
"""Row order of the tables: the coordinator, the learned router, each member alone, the baselines, other methods,
the oracle last."""


def ordered_benchmarks(results: EvalResults) -> list[Benchmark]:
    """Split by split (in-distribution, held-out, held-out other), each group in the order results.json lists them."""
    return results.in_split(None)


def ordered_methods(results: EvalResults) -> list[Method]:
    return sorted(results.methods, key=lambda m: _KIND_ORDER.get(m.kind, 4))


def method_label(method: Method) -> str:
    return f"{method.id} (oracle, hindsight)" if method.is_oracle else method.id


def split_label(benchmark: Benchmark) -> str:
    return _SPLIT_LABELS[benchmark.split_key]


def cell_of(results: EvalResults, method: str, benchmark: str) -> Cell:
    """The method's cell on the benchmark; an empty Cell (every figure None) when it has none."""
    return results.cell(method, benchmark) or Cell()


def benchmark_header(benchmark: Benchmark, turn: int | None = None) -> str:
    """'math500 (n=10)'; a judged benchmark's columns: 'mt_bench turn 1 (n=2, 1–10)', 'mt_bench all turns (n=2x2,
    1–10)' (items x conversation turns: the overall cell is over (item, turn) judgements)."""
    scale = "" if benchmark.scale <= 1 else f", 1–{benchmark.scale:g}"
    if not benchmark.judged:
        return f"{benchmark.name} (n={benchmark.n}{scale})"
    if turn is not None:
        return f"{benchmark.name} turn {turn} (n={benchmark.n}{scale})"
    return f"{benchmark.name} all turns (n={benchmark.n}x{benchmark.turns}{scale})"


def benchmark_columns(benchmark: Benchmark) -> list[tuple[str, int | None]]:
    """(header, turn or None) of a benchmark's main-table columns: one, or per turn then all turns."""
    turns = [*range(1, benchmark.turns + 1), None] if benchmark.judged else [None]
    return [(benchmark_header(benchmark, turn), turn) for turn in turns]


def _decimals(scale: float) -> tuple[int, int]:
    """Decimals of a score and of its interval bounds: accuracies in [0, 1] 3 and 3, scores on 1–10 2 and 1."""
    return (3, 3) if scale <= 1 else (2, 1)


def score_text(score: float | None, ci95, scale: float, *, signed: bool = False) -> str:
    """'0.333 [0.000, 1.000]' (accuracy), '6.50 [5.0, 8.0]' (a 1–10 score); '—' without a score."""
    if score is None:
        return NO_VALUE
    digits, ci_digits = _decimals(scale)
    text = f"{score:+.{digits}f}" if signed else f"{score:.{digits}f}"
    if ci95:
        text += f" [{ci95[0]:.{ci_digits}f}, {ci95[1]:.{ci_digits}f}]"
    return text


def fixed(value: float | None, digits: int = 3) -> str:
    return NO_VALUE if value is None else f"{value:.{digits}f}"


def small_sample_below(results: EvalResults) -> int:
    below = results.bootstrap.small_sample_below
    return 30 if below is None else below
