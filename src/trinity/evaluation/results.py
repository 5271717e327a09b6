"""One results record: data/eval/results.json as `EvalResults`, the one way code reads it.

The evaluate stage writes it (`trinity.evaluation.summary.summarise` computes the table; the stage adds the judge,
seeds, checkpoint, pool and call counts) and derives the DVC metrics file from it (`EvalResults.dvc_metrics`).
The report, the W&B logging, the Prefect table and the nightly comparison read it through this record. Its
pydantic models are the schema: docs/eval_results_schema.md is generated from them (`python -m
trinity.evaluation.results --schema`); loading checks a file against them and names the file and the field at fault.

The record keeps the file's content as read (`to_json()` returns it unchanged, so writing it back gives the same
bytes) and offers typed views of the parts readers use. Values are kept as written (an int stays an int): the
report prints them and must print what it printed from the plain dict. A field without a default is required;
`x: Int = None` may be left out (it reads as None: an older or partial file) but not be null; `x: Int | None`
may be null. Every field present is checked; unknown fields are kept in the file and ignored.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, PrivateAttr, ValidationError, ValidationInfo, field_validator

from trinity.evaluation import results_schema
from trinity.evaluation.results_schema import FILE, UNSTATED, Bool, Int, Interval, Number, Record, Str, Turns, stated
from trinity.files import write_json

IN_DISTRIBUTION, HELDOUT, HELDOUT_OTHER = "in_distribution", "heldout", "heldout_other"
SPLIT_KEYS = (IN_DISTRIBUTION, HELDOUT, HELDOUT_OTHER)
"""The splits the averages and pooled comparisons are keyed by: the training benchmarks' items training left; the
mission's held-out benchmarks (AIME, BigCodeBench(-Hard), MT-Bench, GPQA: `trinity.data.splits.HELDOUT_SOURCES`);
every other benchmark never trained on (GSM8K, HumanEval, your own held-out benchmarks). A benchmark whose split is
none of these counts as `heldout`: the coordinator never trained on it."""

ORACLE_KIND = "oracle"
AVERAGE_METRIC_PREFIX = "avg_"
"""metrics.json: `avg_<split>` keys are the split averages; every other key of a method's row is a benchmark."""
SCHEMA_PAGE = "docs/eval_results_schema.md"


class ResultsFormatError(ValueError):
    """results.json does not match the schema (docs/eval_results_schema.md): names the file and the field."""


# ------------------------------------------------------------------------------------------ the parts


class Benchmark(Record):
    """A benchmark as evaluated: its split, metric and scale, and what it counts."""

    name: Str
    """The task source (`math500`, `aime`, `mt_bench`, ..., or your own benchmark's name)."""
    split: Str
    """`in_distribution`, `heldout` or `heldout_other`; a split of another name reads as `heldout`."""
    metric: Str
    """What a score is: "accuracy", "judge score (1-10)"."""
    scale: Number
    """The score's full scale (1 for an accuracy, 10 for a judge score): averages and pooled scores are score /
    scale."""
    n: Int
    """Items."""
    unit: Str = "item"
    """"item", or "judgement" for a benchmark scored per (item, conversation turn) judgement (MT-Bench)."""
    turns: Int = 0
    """Conversation turns of a judged benchmark (unit "judgement"); 0 for one scoring unit an item."""
    units: Int = None
    """Scoring units: items, or items x turns."""
    common_units: Int = None
    """The units every method with a score on this benchmark scored (the averages use these)."""

    @field_validator("unit")
    @classmethod
    def _unit(cls, unit: str) -> str:
        return unit or "item"

    @field_validator("turns")
    @classmethod
    def _turns_of_judged(cls, turns: int, info: ValidationInfo) -> int:
        return turns if info.data.get("unit") == "judgement" else 0

    @property
    def split_key(self) -> str:
        """The benchmark's split among SPLIT_KEYS (`heldout` for a split of another name)."""
        return self.split if self.split in SPLIT_KEYS else HELDOUT

    @property
    def judged(self) -> bool:
        return self.turns > 0


class Method(Record):
    """A row of the tables."""

    id: Str = Field(alias="method")
    """`trinity`, `router`, `alone:<member name>`, `random-routing` or `oracle:best-single`."""
    kind: Str | None = None
    """coordinator | router | single | baseline | oracle."""
    model: Str | None = None
    """The member of an `alone:` row."""
    picks: dict[str, Str] = {}
    """The oracle's pick per benchmark (benchmark → method)."""

    @property
    def is_oracle(self) -> bool:
        return self.kind == ORACLE_KIND


COMPUTE_FIELDS = ("tokens_per_task", "wall_s_per_task", "cost_usd_per_task", "mean_turns")
"""A cell's compute per task (per item of the benchmark)."""
COUNT_FIELDS = ("calls_new", "failed_calls")


class Cell(Record):
    """One method on one benchmark (or, in `turns`, on one conversation turn of a judged benchmark). An absent
    cell reads as `Cell()`: every figure None."""

    score: Number | None = Field(UNSTATED, validate_default=True)
    """Mean over the scored units (an accuracy in [0, 1]; MT-Bench: 1-10, over every valid judgement); null if none
    scored."""
    ci95: Interval | None = None
    """Percentile bootstrap of the mean (judged: resampling items, each with its valid turns); null if none scored."""
    n: Int = None
    """Units scored (items; valid judgements for a judged benchmark)."""
    unscored: Int = None
    """Units without a score (an outage; judged: an outage item has all its turns unscored)."""
    small_sample: Bool = None
    """Fewer than `bootstrap.small_sample_below` items."""
    tokens_per_task: Number | None = None
    """Prompt + completion tokens of the item's pool calls (not the judge's)."""
    wall_s_per_task: Number | None = None
    """Summed latency of those calls, as recorded when they were paid."""
    cost_usd_per_task: Number | None = None
    mean_turns: Number | None = None
    """Pool turns per item (MT-Bench: both conversation turns)."""
    calls_new: Int = None
    """Calls not in the store when this run asked."""
    failed_calls: Int = None
    items: Int = None
    """A judged benchmark: items with at least one valid judgement."""
    turns: Turns[Cell] = {}
    """A judged benchmark: the cell of each conversation turn."""

    _score_stated = field_validator("score", mode="before")(stated)  # a file states it; `Cell()` need not

    def turn(self, turn: int | None) -> Cell:
        """This cell (turn None), or that conversation turn's (an empty Cell when there is none)."""
        return self if turn is None else self.turns.get(turn) or Cell()

    def figure(self, name: str) -> float | None:
        """A compute or count figure by its field name (COMPUTE_FIELDS, COUNT_FIELDS)."""
        if name not in COMPUTE_FIELDS + COUNT_FIELDS:
            raise KeyError(f"{name!r} is not a compute figure of a cell ({', '.join(COMPUTE_FIELDS + COUNT_FIELDS)})")
        return getattr(self, name)


class Comparison(Record):
    """A paired comparison: a − b over the units both scored (MT-Bench: the (item, turn) judgements both have
    valid, resampled by item), with its interval and outcome."""

    a: Str
    """The coordinator (`trinity`)."""
    b: Str
    """The method compared with (best single member: oracle:best-single's pick on the benchmark)."""
    label: Str
    """"best single member", "learned router", "random routing", ..."""
    outcome: Str
    """wins | ties | loses (the interval against 0) | too few items (fewer than stats.MIN_ITEMS_FOR_OUTCOME) |
    no data."""
    n: Int
    """Units compared."""
    diff: Number | None = None
    """a − b in the benchmark's own unit (pooled: in score / scale); null with no unit to compare."""
    ci95: Interval | None = None
    items: Int = None
    """The items the n units come from."""
    small_sample: Bool = None
    a_better: Int = None
    """Units where a scored higher."""
    b_better: Int = None
    """Units where b scored higher."""
    turns: Turns[Comparison] = {}
    """A judged benchmark: the comparison on each conversation turn alone."""


class PooledSplit(Record):
    """Every unit of a split's benchmarks pooled on one scale (score / scale: an MT-Bench judgement / 10, each
    judgement one unit), and the coordinator against one best member (chosen on the pooled score, in hindsight)
    and against the baselines, resampled by item."""

    benchmarks: tuple[Str, ...]
    """The split's benchmarks."""
    scores: dict[str, Number | None]
    """Per method, the mean of score / scale over `common_units` (null: the method lacks some)."""
    comparisons: tuple[Comparison, ...]
    items: Int = None
    units: Int = None
    """Scoring units of the split's benchmarks."""
    common_units: Int = None
    """The units every method scored: the pooled scores are over these."""
    best_single: Str | None = None
    """The `alone:` row with the best pooled score: one member for the whole split (not the per-benchmark picks)."""


class Judge(Record):
    """The MT-Bench judge and what it did."""

    name: Str
    """The judge's name (evaluate.judge)."""
    model_id: Str = None
    in_pool: Bool = None
    """The judge is also a member of the pool."""
    max_tokens: Int | None = None
    """Cap on a judge reply."""
    verdicts: Int = None
    """Judgements with a rating."""
    unparseable: Int = None
    """Judgements without a parseable rating."""
    failed: Int = None
    """Failed judge calls."""
    calls_new: Int = None
    store_hits: Int = None
    note: Str | None = None
    """Why a local judge's scores are only indicative; null for an endpoint judge."""


class Bootstrap(Record):
    """How the intervals were drawn."""

    resamples: Int = None
    seed: Int = None
    level: Number = None
    """The intervals' confidence level (0.95)."""
    small_sample_below: Int = None
    """Cells and comparisons over fewer items are marked small samples."""


class Checkpoint(Record):
    """The checkpoint that was evaluated (from its data/checkpoints/coordinator.json)."""

    run_fingerprint: Str | None = None
    code_version: Str | None = None
    method: Str | None = None
    generations: Int | None = None
    params_hash: Str | None = None

    def to_json(self) -> dict:
        return self.model_dump()


CHECKPOINT_FIELDS = tuple(Checkpoint.model_fields)


class NeverTrainedOn(Record):
    """What the coordinator never saw in training, and the check that says so."""

    benchmarks: tuple[Str, ...] = None
    """The held-out benchmarks evaluated."""
    items: Int = None
    """Their items."""
    training_sources: tuple[Str, ...] = None
    training_items: Int = None
    in_distribution_items: Int = None
    guarded_sources: tuple[Str, ...] = None
    """The sources training may never draw from (trinity.data.splits.HELDOUT_SOURCES)."""
    check: Str = None
    """What was checked."""


class PoolMember(Record):
    """A member of the pool."""

    name: Str
    model_id: Str = None


# ------------------------------------------------------------------------------------------ the record

_SECTIONS = ("bootstrap", "judge", "checkpoint", "never_trained_on")


class EvalResults(Record):
    """data/eval/results.json, checked and typed. Build it with `read` (a file) or `from_dict` (what the evaluate
    stage computed); `to_json()` is the content it was built from, unchanged."""

    benchmarks: tuple[Benchmark, ...]
    """In file order (the evaluate stage writes in-distribution first)."""
    methods: tuple[Method, ...]
    scores: dict[str, dict[str, Cell]]
    """method → benchmark → cell, in file order."""
    averages: dict[str, dict[str, Number | None]] = {}
    """method → split → the mean over the split's benchmarks (each weighs the same) of score / scale, each term
    over the benchmark's `common_units` (so rows compare); null when a benchmark has no term for the method."""
    paired: dict[str, tuple[Comparison, ...]] = {}
    """benchmark → the coordinator against the best single member and the baselines (a null list: none)."""
    pooled_paired: dict[str, PooledSplit] = {}
    """split → the pooled comparisons."""
    n_items: Int = None
    """Distinct items evaluated."""
    bootstrap: Bootstrap = Bootstrap()
    judge: Judge | None = None
    """null (or {}) when nothing is judged."""
    seeds: dict[str, Any] = {}
    """data, evolve, evaluate, random_routing."""
    checkpoint: Checkpoint | None = None
    pool: tuple[PoolMember, ...] = ()
    never_trained_on: NeverTrainedOn | None = None
    eval_code_version: Str | None = None
    """trinity.code_version of the code that evaluated."""
    pool_calls: Int = None
    """Calls the pool made (new: not in the response store)."""
    store_hits: Int = None
    """Calls answered from the response store."""
    failed_calls: Int = None
    transient_failures: Int = None
    wall_s: Number = None
    """Wall-clock seconds of the evaluation."""

    _raw: Mapping[str, Any] = PrivateAttr(default_factory=dict)
    _source: str = PrivateAttr(default="results.json")

    @field_validator("paired", mode="before")
    @classmethod
    def _null_lists(cls, value: Any) -> Any:
        return {k: [] if v is None else v for k, v in value.items()} if isinstance(value, Mapping) else value

    @field_validator("seeds", "pool", *_SECTIONS, mode="before")
    @classmethod
    def _null_reads_as_default(cls, value: Any, info: ValidationInfo) -> Any:
        """null reads as the field's default (no seeds, no pool, no judge, ...), and so does a section's {}."""
        if value is None or (info.field_name in _SECTIONS and isinstance(value, Mapping) and not value):
            return cls.model_fields[info.field_name].get_default(call_default_factory=True)
        return value

    def __eq__(self, other: object) -> bool:
        """The same typed content, wherever it was read from."""
        return type(other) is type(self) and self.__dict__ == other.__dict__

    # ---------------------------------------------------------------------------------- reading and writing

    @classmethod
    def read(cls, path: Path | str) -> EvalResults:
        """Load and check a results.json; a file that is not JSON or not the schema names the file and field."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ResultsFormatError(f"{path}: not JSON ({e})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "results.json") -> EvalResults:
        try:
            results = cls.model_validate(data, context=FILE)
        except ValidationError as e:
            raise ResultsFormatError(f"{source}: {results_schema.format_errors(e, cls)} ({SCHEMA_PAGE})") from None
        results._raw, results._source = data, source
        return results

    @property
    def raw(self) -> Mapping[str, Any]:
        """The content as read or computed: what `to_json` returns and `write` writes."""
        return self._raw

    @property
    def source(self) -> str:
        return self._source

    def to_json(self) -> Mapping[str, Any]:
        """The content this record was built from, unchanged: what results.json holds."""
        return self._raw

    def write(self, path: Path | str) -> None:
        """results.json (trinity.files.write_json: indented, sorted keys, atomic)."""
        write_json(path, self._raw)

    # ---------------------------------------------------------------------------------- lookups

    def benchmark(self, name: str) -> Benchmark | None:
        return next((b for b in self.benchmarks if b.name == name), None)

    def in_split(self, split: str | None) -> list[Benchmark]:
        """The benchmarks of a split key (SPLIT_KEYS) in file order; None: every benchmark, split by split in the
        order of SPLIT_KEYS."""
        if split is None:
            return [b for key in SPLIT_KEYS for b in self.in_split(key)]
        return [b for b in self.benchmarks if b.split_key == split]

    def cell(self, method: str, benchmark: str) -> Cell | None:
        """The method's cell on the benchmark; None when it has none."""
        return self.scores.get(method, {}).get(benchmark)

    def average(self, method: str, split: str) -> float | None:
        return self.averages.get(method, {}).get(split)

    def comparisons(self, benchmark: str) -> tuple[Comparison, ...]:
        return self.paired.get(benchmark) or ()

    # ---------------------------------------------------------------------------------- derived figures

    def mean_per_item(self, method: str, figure: str, split: str | None = None) -> float | None:
        """The mean over the items of a split's benchmarks (every item weighs the same: a benchmark's per-task
        figure weighted by its item count) of a per-task figure (COMPUTE_FIELDS); None if no benchmark has it.
        split None: all benchmarks."""
        pairs = [((self.cell(method, b.name) or Cell()).figure(figure), b.n) for b in self.in_split(split)]
        pairs = [(v, n) for v, n in pairs if v is not None and n]
        return float(np.average([v for v, _ in pairs], weights=[n for _, n in pairs])) if pairs else None

    def total(self, method: str, figure: str, split: str | None = None) -> int:
        """A count (COUNT_FIELDS: new calls, failed calls) summed over a split's benchmarks (None: all)."""
        return sum((self.cell(method, b.name) or Cell()).figure(figure) or 0 for b in self.in_split(split))

    def dvc_metrics(self) -> dict[str, dict[str, float]]:
        """reports/metrics/evaluate.json, the DVC metrics file: {method: {benchmark: score, avg_in_distribution,
        avg_heldout}}, numbers only (a missing score or average is left out)."""
        out = {}
        for method, per in self.scores.items():
            row = {b: c.score for b, c in per.items() if c.score is not None}
            row |= {f"{AVERAGE_METRIC_PREFIX}{split}": v for split, v in self.averages.get(method, {}).items()
                    if v is not None}
            out[method] = row
        return out


# ------------------------------------------------------------------------------------------ metrics.json rows


def metrics_benchmarks(row: Mapping[str, Any]) -> list[str]:
    """The benchmarks of one method's row of metrics.json (`EvalResults.dvc_metrics`), in row order."""
    return [k for k in row if not k.startswith(AVERAGE_METRIC_PREFIX)]


def metrics_average(row: Mapping[str, Any], split: str) -> float | None:
    """A split's average in one method's row of metrics.json; None when the row has none."""
    return row.get(f"{AVERAGE_METRIC_PREFIX}{split}")


def schema_page() -> str:
    """docs/eval_results_schema.md as these models say it (`results_schema.schema_page`)."""
    return results_schema.schema_page(EvalResults)


__all__ = ["AVERAGE_METRIC_PREFIX", "Benchmark", "Bootstrap", "COMPUTE_FIELDS", "COUNT_FIELDS", "Cell", "Checkpoint",
           "Comparison", "EvalResults", "HELDOUT", "HELDOUT_OTHER", "IN_DISTRIBUTION", "Judge", "Method", "NeverTrainedOn",
           "PoolMember", "PooledSplit", "ResultsFormatError", "SPLIT_KEYS", "metrics_average", "metrics_benchmarks",
           "schema_page"]

if __name__ == "__main__":  # python -m trinity.evaluation.results --schema [--check]: writes (checks) the page
    sys.exit(results_schema.main(sys.argv[1:], EvalResults))
