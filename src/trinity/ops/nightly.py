"""The nightly re-evaluation: the current checkpoint on the evaluation sets, compared with the previous night.

Providers change the model behind an endpoint without notice; the memo store would hide that (a stored reply is
*the* sample for its request), so a nightly run evaluates with a fresh store of its own: every call is made again.
It runs the evaluate stage's own code (`trinity.stages.evaluate`) with `NightlyPaths`, which read the pipeline's
checkpoint but write the results, the store and the night's items under `data/nightly/runs/<run>/` — never the
DVC outputs under `data/eval/`.

The night's items are its own (`nightly_splits`): `items_per_benchmark` of every benchmark the evaluation names
(params `data.in_distribution`, `data.heldout`), drawn with the prepare stage's seeded draw — so the pipeline's
own evaluation items come first, and every night scores the same items — and never an item the checkpoint was
trained or selected on (the prepared train and validation splits, by id and text). The pipeline evaluates only a
few items per benchmark (2 with the shipped params), and a drop is called on at least `MIN_ITEMS_FOR_OUTCOME`
paired items (below), so on the pipeline's items the nightly could never flag one; `check_items_per_benchmark`
refuses fewer. A benchmark with fewer items than asked gives what it has (the night's first lines say so).

Each evaluated night appends one record to `data/nightly/history.jsonl` (its run, checkpoint, every method's
score per benchmark and per item, normalised to [0, 1] by the benchmark's scale, and whether it was flagged).
`compare` sets tonight against the baseline, the last night that was *not* flagged (`baseline_record`): a
flagged night never becomes the norm, so a regression keeps failing every night until it is fixed. A drop is
flagged for a (method, benchmark) — the coordinator's, or one member's alone, the row that names the endpoint
that changed — when, over the items both nights scored, the mean paired difference (tonight − baseline) is
below −threshold *and* its 95 % paired bootstrap interval lies below 0, over at least `MIN_ITEMS_FOR_OUTCOME`
items (the rule of the evaluation report, `trinity.evaluation.stats`: fewer items cannot show a difference at the
5 % level), *and* it survives Holm's correction over the night's family: every (method, benchmark) row compared on
enough items (a night of 6 methods on 9 benchmarks is 54 tests; at 5 % each, noise alone would flag some row most
nights). Each row's one-sided bootstrap p-value (share of resampled means at or above 0) is held against
DROP_ALPHA / (rows not yet rejected), smallest first, so a night of noise is flagged with probability at most
DROP_ALPHA whatever the pool's size; a single row is the plain interval rule. The price is power: with 54 rows,
10 items per benchmark flag a row when 6 of them turn wrong with none turning right, 20 or 40 items when 7 do
(one row alone: 4 of 10). A change that noise can explain is listed, not flagged. flows/nightly_eval.py runs this
as a Prefect flow, publishes the comparison as artifacts and ends the run Failed when a drop is flagged.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from trinity.evaluation.results import EvalResults
from trinity.evaluation.stats import MIN_ITEMS_FOR_OUTCOME, bootstrap_p_below_zero, holm, paired_bootstrap
from trinity.stages.paths import Paths

SUMMARY_ARTIFACT_KEY = "nightly-eval-summary"
SCORES_ARTIFACT_KEY = "nightly-eval-scores"
"""Stable Prefect artifact keys: each run adds a version, so the Artifacts page holds the history."""

ORACLE_PREFIX = "oracle:"
"""Oracle rows are derived in hindsight from the single members' rows: never compared on their own."""
DROP_RESAMPLES = 20000
"""Resamples per row: enough that the smallest p-value (1 / 20001) clears Holm's first level for ~500 rows."""
DROP_SEED = 0
DROP_ALPHA = 0.025
"""The night's family-wise error rate, one-sided: a single row is flagged exactly when its 95 % interval (two-sided,
so 2.5 % above) lies below 0."""


DEFAULT_ITEMS_PER_BENCHMARK = 10
"""flows/nightly_eval.py's default (prefect.yaml sets it too): with the default pool's 54 compared rows, a drop is
flagged on 10 items when at least 6 of them turn wrong with none turning right (a mean drop of 0.6); 20 items call
7 of 20 (0.35), 40 items 7 of 40 (0.175) (docs/operations.md)."""


@dataclass(frozen=True)
class NightlyPaths(Paths):
    """The pipeline's paths, except that the evaluation's items (`prepared`), results and store live in
    `run_dir`."""

    run_dir: Path = Path("data/nightly/runs/unnamed")

    @property
    def prepared(self) -> Path: return self.run_dir / "prepared"

    @property
    def eval_dir(self) -> Path: return self.run_dir

    @property
    def store(self) -> Path: return self.run_dir / "store.duckdb"


def check_items_per_benchmark(n) -> int:
    """The nightly's items per benchmark: a whole number, at least MIN_ITEMS_FOR_OUTCOME (fewer paired items can
    never show a drop)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < MIN_ITEMS_FOR_OUTCOME:
        raise ValueError(f"items_per_benchmark must be a whole number >= {MIN_ITEMS_FOR_OUTCOME} (a drop is called "
                         f"on at least {MIN_ITEMS_FOR_OUTCOME} paired items; fewer could never flag one), got {n!r}")
    return n


def nightly_splits(settings, prepared, items_per_benchmark: int):
    """The night's items (module doc): a `Splits` whose train and validation are the prepared ones (what the
    checkpoint was trained and selected on) and whose in_distribution and heldout hold up to `items_per_benchmark`
    items of each evaluation benchmark of `settings.data`, none of them a prepared train or validation item.
    Draws every item of a benchmark (-1) in the seeded order the prepare stage draws from, then keeps the first
    `items_per_benchmark`: the same prefix a draw of that many gives, so the pipeline's items come first."""
    from trinity.data.splits import Splits, _texts, assert_no_contamination, splits_from_settings

    n = check_items_per_benchmark(items_per_benchmark)
    d = settings.data
    drawn = splits_from_settings(d, in_distribution={k: -1 for k in d.in_distribution},
                                 heldout={k: -1 for k in d.heldout}, validation={})
    seen = [*prepared.train, *prepared.validation]
    excluded_ids = {t.id for t in seen}
    excluded_texts = {x for t in seen for x in _texts(t)}

    def first_n(tasks):
        kept: dict[str, list] = {}
        for t in tasks:
            if t.id in excluded_ids or _texts(t) & excluded_texts:
                continue
            per = kept.setdefault(t.source, [])
            if len(per) < n:
                per.append(t)
        return [t for per in kept.values() for t in per]

    out = Splits(train=list(prepared.train), in_distribution=first_n(drawn.in_distribution),
                 heldout=first_n(drawn.heldout), validation=list(prepared.validation))
    assert_no_contamination(out.train, [*out.in_distribution, *out.heldout, *out.validation])
    assert_no_contamination(out.validation, [*out.in_distribution, *out.heldout])
    return out


def items_by_benchmark(splits) -> dict[str, int]:
    """benchmark → number of evaluation items (in_distribution and heldout)."""
    counts: dict[str, int] = {}
    for t in [*splits.in_distribution, *splits.heldout]:
        counts[t.source] = counts.get(t.source, 0) + 1
    return counts


def write_nightly_splits(paths: "NightlyPaths", splits) -> None:
    """The night's splits where the evaluate stage reads them (`NightlyPaths.prepared`)."""
    from trinity.data.splits import save_tasks
    from trinity.stages.paths import SPLIT_FILES

    for split, name in SPLIT_FILES.items():
        save_tasks(paths.prepared / name, getattr(splits, split))


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
    items: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    """method → benchmark → item id → score / scale: what the paired drop test pairs (older records: empty)."""
    flagged: bool = False
    """Whether this night was flagged (a flagged night is never the baseline)."""

    @classmethod
    def from_results(cls, results: EvalResults, run: str, results_path: Path | str = "",
                     episodes: Path | None = None) -> "NightlyRecord":
        """The night's record from its results.json (`results`) and, for the per-item scores, its episodes.jsonl."""
        scale = {b.name: b.scale for b in results.benchmarks}
        scores = {m: {b: c.score / scale[b] for b, c in per.items() if c.score is not None}
                  for m, per in results.scores.items() if not m.startswith(ORACLE_PREFIX)}
        averages = {m: {s: v for s, v in per.items() if v is not None}
                    for m, per in results.averages.items() if not m.startswith(ORACLE_PREFIX)}
        items: dict[str, dict[str, dict[str, float]]] = {}
        if episodes is not None:
            for line in Path(episodes).read_text().splitlines():
                row = json.loads(line) if line.strip() else None
                if row and row.get("score") is not None and row["benchmark"] in scale \
                        and not row["method"].startswith(ORACLE_PREFIX):
                    items.setdefault(row["method"], {}).setdefault(row["benchmark"], {})[row["task_id"]] = \
                        row["score"] / scale[row["benchmark"]]
        return cls(run=run, finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                   checkpoint=results.checkpoint.to_json() if results.checkpoint else {},
                   splits={b.name: b.split for b in results.benchmarks}, scores=scores,
                   averages=averages, results_path=str(results_path), items=items)


def _records(root: Path) -> list[NightlyRecord]:
    path = history_path(root)
    if not path.exists():
        return []
    out = []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(NightlyRecord(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}, line {i}: not a nightly record ({e}); fix or remove that line") from None
    return out


def last_record(root: Path) -> NightlyRecord | None:
    """The previous night's record (the last line of history.jsonl), or None before the first night."""
    records = _records(root)
    return records[-1] if records else None


def baseline_record(root: Path) -> NightlyRecord | None:
    """What tonight is compared with: the last night that was not flagged (None before the first such night)."""
    return next((r for r in reversed(_records(root)) if not r.flagged), None)


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
    paired: tuple[float, float, float, int] | None = None
    """(mean of tonight − baseline, 95 % interval low, high, items) over the items both nights scored."""
    p_drop: float | None = None
    """One-sided bootstrap p-value of "tonight is below the baseline" over those items (None: no paired items)."""

    @property
    def delta(self) -> float | None:
        return None if self.previous is None or self.current is None else self.current - self.previous


@dataclass(frozen=True)
class Comparison:
    """Tonight against the baseline night: every (method, benchmark) score and the drops flagged (module doc)."""

    threshold: float
    previous_run: str | None
    checkpoint_changed: bool
    changes: list[ScoreChange]
    drops: list[ScoreChange]
    family: int = 0
    """Rows compared on enough paired items: the size of the Holm family."""

    @property
    def flagged(self) -> bool:
        return bool(self.drops)

    def message(self) -> str:
        if self.previous_run is None:
            return "first nightly evaluation: nothing to compare with yet"
        if not self.drops:
            return (f"no score dropped by more than {self.threshold:.3f} (with a paired 95 % interval below 0, "
                    f"Holm-corrected over {self.family} rows) since {self.previous_run}")
        def paired(d: ScoreChange) -> str:
            return f" (paired {d.paired[0]:+.3f} [{d.paired[1]:+.3f}, {d.paired[2]:+.3f}], {d.paired[3]} items)" \
                if d.paired else ""

        worst = ", ".join(f"{d.method} on {d.benchmark} {d.previous:.3f} -> {d.current:.3f}{paired(d)}"
                          for d in self.drops)
        return f"score drop beyond {self.threshold:.3f} since {self.previous_run}: {worst}"


def _paired(previous: NightlyRecord, current: NightlyRecord, method: str, bench: str):
    """((mean, low, high, items), p-value) of tonight − baseline over the items both scored, or (None, None)."""
    mine = current.items.get(method, {}).get(bench, {})
    theirs = previous.items.get(method, {}).get(bench, {})
    both = sorted(set(mine) & set(theirs))
    if not both:
        return None, None
    a, b = [mine[i] for i in both], [theirs[i] for i in both]
    iv = paired_bootstrap(a, b, n_resamples=DROP_RESAMPLES, seed=DROP_SEED)
    p = bootstrap_p_below_zero([x - y for x, y in zip(a, b)], n_resamples=DROP_RESAMPLES, seed=DROP_SEED)
    return (float(iv.estimate), float(iv.low), float(iv.high), len(both)), p


def compare(previous: NightlyRecord | None, current: NightlyRecord, threshold: float) -> Comparison:
    """Tonight (`current`) against the baseline (`previous`, see `baseline_record`): a drop is flagged when the
    paired mean over at least MIN_ITEMS_FOR_OUTCOME shared items is below −threshold, its interval lies below 0 and
    its p-value survives Holm's correction over the night's rows (module doc); records without per-item scores
    (older ones) fall back to the benchmark scores alone."""
    threshold = check_threshold(threshold)
    changes = []
    for method, per in current.scores.items():
        prev = previous.scores.get(method, {}) if previous else {}
        for bench in sorted(set(per) | set(prev)):
            split = current.splits.get(bench) or (previous.splits.get(bench, "") if previous else "")
            paired, p = _paired(previous, current, method, bench) if previous else (None, None)
            changes.append(ScoreChange(method, bench, split, prev.get(bench), per.get(bench), paired, p))
    family = [c for c in changes if c.paired is not None and c.paired[3] >= MIN_ITEMS_FOR_OUTCOME]
    significant = {(c.method, c.benchmark) for c, r in zip(family, holm([c.p_drop for c in family], DROP_ALPHA))
                   if r}

    def dropped(c: ScoreChange) -> bool:
        # a small tolerance: a score equal to the threshold's edge is not a drop because of float rounding
        if c.paired is not None:
            return -c.paired[0] > threshold + 1e-9 and c.paired[2] < 0 and (c.method, c.benchmark) in significant
        return c.delta is not None and -c.delta > threshold + 1e-9

    drops = [c for c in changes if dropped(c)]
    return Comparison(threshold=threshold, previous_run=previous.run if previous else None,
                      checkpoint_changed=bool(previous) and previous.checkpoint.get("run_fingerprint")
                      != current.checkpoint.get("run_fingerprint"),
                      changes=changes, drops=drops, family=len(family))


def _fmt(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def scores_table(comparison: Comparison) -> list[dict]:
    """The per-benchmark table artifact: one row per method and benchmark."""
    dropped = {(d.method, d.benchmark) for d in comparison.drops}
    return [{"method": c.method, "benchmark": c.benchmark, "split": c.split, "score": c.current,
             "previous": c.previous, "delta": None if c.delta is None else round(c.delta, 4),
             "paired_low": None if c.paired is None else round(c.paired[1], 4),
             "paired_high": None if c.paired is None else round(c.paired[2], 4),
             "paired_items": None if c.paired is None else c.paired[3],
             "p_drop": None if c.p_drop is None else round(c.p_drop, 5),
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
             f"- baseline: {comparison.previous_run or 'none'} (the last night that was not flagged)",
             f"- drop threshold: {comparison.threshold:.3f} of a benchmark's scale, with the paired 95 % interval "
             f"of (tonight − baseline) below 0 and its one-sided p-value significant after Holm's correction over "
             f"the {comparison.family} rows compared (family-wise {DROP_ALPHA}); every method is compared (a "
             "member's own row names the endpoint that changed)",
             f"- results: `{current.results_path}`", "",
             "| method | benchmark | split | score | baseline | delta | paired 95 % interval (items) | p (one-sided) |",
             "|---|---|---|---|---|---|---|---|"]
    dropped = {(d.method, d.benchmark) for d in comparison.drops}
    for c in comparison.changes:
        mark = " **drop**" if (c.method, c.benchmark) in dropped else ""
        iv = "—" if c.paired is None else f"[{c.paired[1]:+.3f}, {c.paired[2]:+.3f}] ({c.paired[3]})"
        lines.append(f"| {c.method} | {c.benchmark} | {c.split} | {_fmt(c.current)} | {_fmt(c.previous)} | "
                     f"{'—' if c.delta is None else f'{c.delta:+.3f}'}{mark} | {iv} | "
                     f"{'—' if c.p_drop is None else f'{c.p_drop:.4f}'} |")
    return "\n".join(lines) + "\n"
