"""The nightly re-evaluation: the current checkpoint on the evaluation sets, compared with the previous night.

Providers change the model behind an endpoint without notice; the memo store would hide that (a stored reply is
*the* sample for its request), so a nightly run evaluates with a fresh store of its own: every call is made again.
It runs the evaluate stage's own code (`trinity.stages.evaluate`) with `NightlyPaths`, which read the pipeline's
prepared splits and checkpoint but write the results, and the store, under `data/nightly/runs/<run>/` — never
the DVC outputs under `data/eval/`.

Each evaluated night appends one record to `data/nightly/history.jsonl` (its run, checkpoint, and every method's
score per benchmark, normalised to [0, 1] by the benchmark's scale). `compare` sets tonight against the last
record: a drop of more than the threshold in any method's score on any benchmark (the coordinator's, or one
member's alone — the row that names the endpoint that changed) is flagged. flows/nightly_eval.py runs this as
a Prefect flow, publishes the comparison as artifacts and ends the run Failed when a drop is flagged.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from trinity.evaluation.results import EvalResults
from trinity.stages.paths import Paths

SUMMARY_ARTIFACT_KEY = "nightly-eval-summary"
SCORES_ARTIFACT_KEY = "nightly-eval-scores"
"""Stable Prefect artifact keys: each run adds a version, so the Artifacts page holds the history."""

ORACLE_PREFIX = "oracle:"
"""Oracle rows are derived in hindsight from the single members' rows: never compared on their own."""


@dataclass(frozen=True)
class NightlyPaths(Paths):
    """The pipeline's paths, except that the evaluation's results and its store live in `run_dir`."""

    run_dir: Path = Path("data/nightly/runs/unnamed")

    @property
    def eval_dir(self) -> Path: return self.run_dir

    @property
    def store(self) -> Path: return self.run_dir / "store.duckdb"


def nightly_dir(root: Path) -> Path:
    return Path(root) / "data" / "nightly"


def history_path(root: Path) -> Path:
    return nightly_dir(root) / "history.jsonl"


def new_run_dir(root: Path, run_name: str, now: datetime | None = None) -> Path:
    """`data/nightly/runs/<UTC time>-<run name>`: one directory per nightly run, sorted by time."""
    now = now or datetime.now(timezone.utc)
    safe = "".join(c if c.isalnum() or c in "-_" else "-" for c in run_name)[:64] or "run"
    return nightly_dir(root) / "runs" / f"{now.strftime('%Y%m%dT%H%M%SZ')}-{safe}"


def check_threshold(drop_threshold: float) -> float:
    """The drop threshold is a fraction of a benchmark's full scale (0.05 = five accuracy points)."""
    if isinstance(drop_threshold, bool) or not isinstance(drop_threshold, (int, float)) \
            or not math.isfinite(drop_threshold) or not 0 <= drop_threshold < 1:
        raise ValueError(f"drop_threshold must be a number in [0, 1) (a fraction of a benchmark's scale), "
                         f"got {drop_threshold!r}")
    return float(drop_threshold)


@dataclass(frozen=True)
class NightlyRecord:
    """One evaluated night, as kept in history.jsonl."""

    run: str
    finished_at: str
    checkpoint: dict
    splits: dict[str, str]
    """benchmark → split (in_distribution | heldout)."""
    scores: dict[str, dict[str, float]]
    """method → benchmark → score / scale (in [0, 1]); a benchmark nothing scored is left out."""
    averages: dict[str, dict[str, float]] = field(default_factory=dict)
    results_path: str = ""

    @classmethod
    def from_results(cls, results: EvalResults, run: str, results_path: Path | str = "") -> "NightlyRecord":
        scale = {b.name: b.scale for b in results.benchmarks}
        scores = {m: {b: c.score / scale[b] for b, c in per.items() if c.score is not None}
                  for m, per in results.scores.items() if not m.startswith(ORACLE_PREFIX)}
        averages = {m: {s: v for s, v in per.items() if v is not None}
                    for m, per in results.averages.items() if not m.startswith(ORACLE_PREFIX)}
        return cls(run=run, finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   checkpoint=results.checkpoint.to_json() if results.checkpoint else {},
                   splits={b.name: b.split for b in results.benchmarks}, scores=scores,
                   averages=averages, results_path=str(results_path))


def last_record(root: Path) -> NightlyRecord | None:
    """The previous night's record (the last line of history.jsonl), or None before the first night."""
    path = history_path(root)
    if not path.exists():
        return None
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        return None
    try:
        return NightlyRecord(**json.loads(lines[-1]))
    except (json.JSONDecodeError, TypeError) as e:
        raise ValueError(f"{path}, line {len(lines)}: not a nightly record ({e}); fix or remove that line") from None


def append_record(root: Path, record: NightlyRecord) -> Path:
    path = history_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(asdict(record), sort_keys=True) + "\n")
    return path


@dataclass(frozen=True)
class ScoreChange:
    method: str
    benchmark: str
    split: str
    previous: float | None
    current: float | None

    @property
    def delta(self) -> float | None:
        return None if self.previous is None or self.current is None else self.current - self.previous


@dataclass(frozen=True)
class Comparison:
    """Tonight against the previous night: every (method, benchmark) score and the drops beyond the threshold."""

    threshold: float
    previous_run: str | None
    checkpoint_changed: bool
    changes: list[ScoreChange]
    drops: list[ScoreChange]

    @property
    def flagged(self) -> bool:
        return bool(self.drops)

    def message(self) -> str:
        if self.previous_run is None:
            return "first nightly evaluation: nothing to compare with yet"
        if not self.drops:
            return f"no score dropped by more than {self.threshold:.3f} since {self.previous_run}"
        worst = ", ".join(f"{d.method} on {d.benchmark} {d.previous:.3f} -> {d.current:.3f}" for d in self.drops)
        return f"score drop beyond {self.threshold:.3f} since {self.previous_run}: {worst}"


def compare(previous: NightlyRecord | None, current: NightlyRecord, threshold: float) -> Comparison:
    threshold = check_threshold(threshold)
    changes = []
    for method, per in current.scores.items():
        prev = previous.scores.get(method, {}) if previous else {}
        for bench in sorted(set(per) | set(prev)):
            split = current.splits.get(bench) or (previous.splits.get(bench, "") if previous else "")
            changes.append(ScoreChange(method, bench, split, prev.get(bench), per.get(bench)))
    # a small tolerance: a score equal to the threshold's edge is not a drop because of float rounding
    drops = [c for c in changes if c.delta is not None and -c.delta > threshold + 1e-9]
    return Comparison(threshold=threshold, previous_run=previous.run if previous else None,
                      checkpoint_changed=bool(previous) and previous.checkpoint.get("run_fingerprint")
                      != current.checkpoint.get("run_fingerprint"),
                      changes=changes, drops=drops)


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def scores_table(comparison: Comparison) -> list[dict]:
    """The per-benchmark table artifact: one row per method and benchmark."""
    dropped = {(d.method, d.benchmark) for d in comparison.drops}
    return [{"method": c.method, "benchmark": c.benchmark, "split": c.split, "score": c.current,
             "previous": c.previous, "delta": None if c.delta is None else round(c.delta, 4),
             "dropped": (c.method, c.benchmark) in dropped} for c in comparison.changes]


def summary_markdown(current: NightlyRecord, comparison: Comparison) -> str:
    """The markdown artifact: verdict, checkpoint, and the coordinator's scores against the previous night."""
    verdict = ("**DROP FLAGGED** — " if comparison.flagged else "OK — ") + comparison.message()
    ckpt = current.checkpoint
    lines = [f"# Nightly evaluation {current.run}", "", verdict, "",
             f"- finished: {current.finished_at}",
             f"- checkpoint: run `{ckpt.get('run_fingerprint')}`, method {ckpt.get('method')}, "
             f"code `{ckpt.get('code_version')}`"
             + (" (**changed since the previous night**)" if comparison.checkpoint_changed else ""),
             f"- drop threshold: {comparison.threshold:.3f} of a benchmark's scale; every method is compared "
             "(a member's own row names the endpoint that changed)",
             f"- results: `{current.results_path}`", "",
             "| method | benchmark | split | score | previous | delta |", "|---|---|---|---|---|---|"]
    dropped = {(d.method, d.benchmark) for d in comparison.drops}
    for c in comparison.changes:
        mark = " **drop**" if (c.method, c.benchmark) in dropped else ""
        lines.append(f"| {c.method} | {c.benchmark} | {c.split} | {_fmt(c.current)} | {_fmt(c.previous)} | "
                     f"{'—' if c.delta is None else f'{c.delta:+.3f}'}{mark} |")
    return "\n".join(lines) + "\n"
