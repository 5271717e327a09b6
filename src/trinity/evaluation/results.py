"""One results record: data/eval/results.json as `EvalResults`, the one way code reads it.

The evaluate stage writes it (`trinity.evaluation.run.summarise` computes the table; the stage adds the judge,
seeds, checkpoint, pool and call counts) and derives the DVC metrics file from it (`EvalResults.dvc_metrics`).
The report (`trinity.evaluation.report`), the W&B logging (`trinity.ops.tracking.log_eval_results`), the
Prefect table (`trinity.ops.prefect_artifacts.eval_scores_table`) and the nightly comparison (`trinity.ops.nightly`)
read it through this record. docs/eval_results_schema.md is the contract; loading checks a file against it and
names the file and the field at fault (`ResultsFormatError`).

The record keeps the file's content as read (`to_json()` returns it unchanged, so writing it back gives the same
bytes) and offers typed views of the parts readers use. Values are kept as written (an int stays an int): the
report prints them and must print what it printed from the plain dict. Fields a reader may find missing in an
older or partial file (the judge, the seeds, the compute figures, ...) are None; every field present is checked.
"""
from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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


class ResultsFormatError(ValueError):
    """results.json does not match docs/eval_results_schema.md: names the file and the field."""


# ------------------------------------------------------------------------------------------ checking fields

_KINDS = {
    "str": (lambda v: isinstance(v, str), "a string"),
    "int": (lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool), "an integer"),
    "number": (lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool), "a number"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "list": (lambda v: isinstance(v, (list, tuple)), "a list"),
    "dict": (lambda v: isinstance(v, Mapping), "an object"),
}


class _Fields:
    """Typed reads of one JSON object; a wrong or missing field raises ResultsFormatError naming the file and
    the field's path (e.g. `scores["trinity"]["math500"].ci95`)."""

    def __init__(self, obj: Any, where: str, source: str):
        self.where, self.source = where, source
        if not isinstance(obj, Mapping):
            self.fail(where, f"expected an object, got {_shown(obj)}")
        self.obj = obj

    def fail(self, where: str, why: str):
        raise ResultsFormatError(f"{self.source}: {where or 'top level'}: {why} (docs/eval_results_schema.md)")

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def check(self, where: str, value: Any, kind: str, nullable: bool = False) -> Any:
        test, wanted = _KINDS[kind]
        if value is None and nullable:
            return None
        if not test(value):
            self.fail(where, f"expected {wanted}{' or null' if nullable else ''}, got {_shown(value)}")
        return value

    def req(self, key: str, kind: str, nullable: bool = False) -> Any:
        if key not in self.obj:
            self.fail(self.path(key), "missing")
        return self.check(self.path(key), self.obj[key], kind, nullable)

    def opt(self, key: str, kind: str, nullable: bool = False) -> Any:
        """The field, or None when absent (null only where `nullable`)."""
        if key not in self.obj:
            return None
        return self.check(self.path(key), self.obj[key], kind, nullable)

    def sub(self, key: str, value: Any) -> "_Fields":
        return _Fields(value, f'{self.where}["{key}"]', self.source)

    def child(self, key: str) -> "_Fields":
        return _Fields(self.obj[key], self.path(key), self.source)

    def interval(self, key: str) -> tuple | None:
        value = self.opt(key, "list", nullable=True)
        if value is None:
            return None
        if len(value) != 2:
            self.fail(self.path(key), f"expected [low, high], got {_shown(value)}")
        for i, bound in enumerate(value):
            self.check(f"{self.path(key)}[{i}]", bound, "number")
        return tuple(value)

    def strings(self, key: str) -> tuple[str, ...] | None:
        value = self.opt(key, "list")
        if value is None:
            return None
        return tuple(self.check(f"{self.path(key)}[{i}]", v, "str") for i, v in enumerate(value))

    def per_turn(self, key: str) -> dict[int, "_Fields"]:
        """A per-turn object {"1": {...}, "2": {...}} as {1: fields, 2: fields} (empty when absent)."""
        value = self.opt(key, "dict")
        out = {}
        for turn, entry in (value or {}).items():
            if not (isinstance(turn, str) and turn.isdigit()):
                self.fail(self.path(key), f"turn keys are conversation turns (\"1\", \"2\", ...), got {turn!r}")
            out[int(turn)] = _Fields(entry, f'{self.path(key)}["{turn}"]', self.source)
        return out


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------------------ the parts


@dataclass(frozen=True)
class Benchmark:
    """A benchmark as evaluated: its split, metric and scale, and what it counts."""

    name: str
    split: str
    metric: str
    scale: float
    n: int
    """Items."""
    unit: str = "item"
    """"item", or "judgement" for a benchmark scored per (item, conversation turn) judgement (MT-Bench)."""
    turns: int = 0
    """Conversation turns of a judged benchmark (unit "judgement"); 0 for one scoring unit an item."""
    units: int | None = None
    """Scoring units: items, or items x turns."""
    common_units: int | None = None
    """The units every method with a score on this benchmark scored (the averages use these)."""

    @property
    def split_key(self) -> str:
        """The benchmark's split among SPLIT_KEYS (`heldout` for a split of another name)."""
        return self.split if self.split in SPLIT_KEYS else HELDOUT

    @property
    def judged(self) -> bool:
        return self.turns > 0

    @classmethod
    def parse(cls, f: _Fields) -> "Benchmark":
        unit = f.opt("unit", "str") or "item"
        turns = f.opt("turns", "int")
        return cls(name=f.req("name", "str"), split=f.req("split", "str"), metric=f.req("metric", "str"),
                   scale=f.req("scale", "number"), n=f.req("n", "int"), unit=unit,
                   turns=(turns or 0) if unit == "judgement" else 0, units=f.opt("units", "int"),
                   common_units=f.opt("common_units", "int"))


@dataclass(frozen=True)
class Method:
    """A row of the tables: `trinity`, `alone:<member>`, `random-routing`, `oracle:best-single`."""

    id: str
    kind: str | None = None
    """coordinator | single | baseline | oracle."""
    model: str | None = None
    """The member of an `alone:` row."""
    picks: Mapping[str, str] = field(default_factory=dict)
    """The oracle's pick per benchmark."""

    @property
    def is_oracle(self) -> bool:
        return self.kind == ORACLE_KIND

    @classmethod
    def parse(cls, f: _Fields) -> "Method":
        picks = f.opt("picks", "dict") or {}
        for bench, pick in picks.items():
            f.check(f'{f.path("picks")}["{bench}"]', pick, "str")
        return cls(id=f.req("method", "str"), kind=f.opt("kind", "str", nullable=True),
                   model=f.opt("model", "str", nullable=True), picks=dict(picks))


COMPUTE_FIELDS = ("tokens_per_task", "wall_s_per_task", "cost_usd_per_task", "mean_turns")
"""A cell's compute per task (per item of the benchmark)."""
COUNT_FIELDS = ("calls_new", "failed_calls")


@dataclass(frozen=True)
class Cell:
    """One method on one benchmark (or, in `turns`, on one conversation turn of a judged benchmark). An absent
    cell reads as `Cell()`: every figure None."""

    score: float | None = None
    """Mean over the scored units; None if none scored."""
    ci95: tuple[float, float] | None = None
    n: int | None = None
    """Units scored (items; judgements for a judged benchmark)."""
    unscored: int | None = None
    small_sample: bool | None = None
    tokens_per_task: float | None = None
    wall_s_per_task: float | None = None
    cost_usd_per_task: float | None = None
    mean_turns: float | None = None
    calls_new: int | None = None
    failed_calls: int | None = None
    items: int | None = None
    """A judged benchmark: items with at least one valid judgement."""
    turns: Mapping[int, "Cell"] = field(default_factory=dict)
    """A judged benchmark: the cell of each conversation turn."""

    def turn(self, turn: int | None) -> "Cell":
        """This cell (turn None), or that conversation turn's (an empty Cell when there is none)."""
        return self if turn is None else self.turns.get(turn) or Cell()

    def figure(self, name: str) -> float | None:
        """A compute or count figure by its field name (COMPUTE_FIELDS, COUNT_FIELDS)."""
        if name not in COMPUTE_FIELDS + COUNT_FIELDS:
            raise KeyError(f"{name!r} is not a compute figure of a cell ({', '.join(COMPUTE_FIELDS + COUNT_FIELDS)})")
        return getattr(self, name)

    @classmethod
    def parse(cls, f: _Fields) -> "Cell":
        return cls(score=f.req("score", "number", nullable=True), ci95=f.interval("ci95"),
                   n=f.opt("n", "int"), unscored=f.opt("unscored", "int"),
                   small_sample=f.opt("small_sample", "bool"),
                   **{name: f.opt(name, "number", nullable=True) for name in COMPUTE_FIELDS},
                   **{name: f.opt(name, "int") for name in COUNT_FIELDS},
                   items=f.opt("items", "int"),
                   turns={k: cls.parse(turn_f) for k, turn_f in f.per_turn("turns").items()})


@dataclass(frozen=True)
class Comparison:
    """A paired comparison: a − b over the units both scored, with its interval and outcome."""

    a: str
    b: str
    label: str
    outcome: str
    """wins | ties | loses | too few items | no data."""
    n: int
    """Units compared."""
    diff: float | None = None
    ci95: tuple[float, float] | None = None
    items: int | None = None
    """The items the n units come from."""
    small_sample: bool | None = None
    a_better: int | None = None
    b_better: int | None = None
    turns: Mapping[int, "Comparison"] = field(default_factory=dict)
    """A judged benchmark: the comparison on each conversation turn alone."""

    @classmethod
    def parse(cls, f: _Fields) -> "Comparison":
        return cls(a=f.req("a", "str"), b=f.req("b", "str"), label=f.req("label", "str"),
                   outcome=f.req("outcome", "str"), n=f.req("n", "int"), diff=f.opt("diff", "number", nullable=True),
                   ci95=f.interval("ci95"), items=f.opt("items", "int"), small_sample=f.opt("small_sample", "bool"),
                   a_better=f.opt("a_better", "int"), b_better=f.opt("b_better", "int"),
                   turns={k: cls.parse(turn_f) for k, turn_f in f.per_turn("turns").items()})


@dataclass(frozen=True)
class PooledSplit:
    """Every unit of a split's benchmarks pooled on one scale (score / scale), and the coordinator against one
    best member (chosen on the pooled score, in hindsight) and against random routing."""

    benchmarks: tuple[str, ...]
    scores: Mapping[str, float | None]
    """Per method, the mean of score / scale over `common_units` (None: the method lacks some)."""
    comparisons: tuple[Comparison, ...]
    items: int | None = None
    units: int | None = None
    common_units: int | None = None
    best_single: str | None = None

    @classmethod
    def parse(cls, f: _Fields) -> "PooledSplit":
        scores = f.req("scores", "dict")
        comparisons = f.req("comparisons", "list")
        f.req("benchmarks", "list")
        return cls(benchmarks=f.strings("benchmarks"),
                   scores={m: f.check(f'{f.path("scores")}["{m}"]', v, "number", nullable=True)
                           for m, v in scores.items()},
                   comparisons=tuple(Comparison.parse(_Fields(c, f"{f.path('comparisons')}[{i}]", f.source))
                                     for i, c in enumerate(comparisons)),
                   items=f.opt("items", "int"), units=f.opt("units", "int"), common_units=f.opt("common_units", "int"),
                   best_single=f.opt("best_single", "str", nullable=True))


@dataclass(frozen=True)
class Judge:
    """The MT-Bench judge and what it did."""

    name: str
    model_id: str | None = None
    in_pool: bool | None = None
    max_tokens: int | None = None
    verdicts: int | None = None
    unparseable: int | None = None
    failed: int | None = None
    calls_new: int | None = None
    store_hits: int | None = None
    note: str | None = None
    """Why a local judge's scores are only indicative; None for an endpoint judge."""

    @classmethod
    def parse(cls, f: _Fields) -> "Judge":
        return cls(name=f.req("name", "str"), model_id=f.opt("model_id", "str"), in_pool=f.opt("in_pool", "bool"),
                   max_tokens=f.opt("max_tokens", "int", nullable=True),
                   **{k: f.opt(k, "int") for k in ("verdicts", "unparseable", "failed", "calls_new", "store_hits")},
                   note=f.opt("note", "str", nullable=True))


@dataclass(frozen=True)
class Bootstrap:
    """How the intervals were drawn."""

    resamples: int | None = None
    seed: int | None = None
    level: float | None = None
    small_sample_below: int | None = None

    @classmethod
    def parse(cls, f: _Fields) -> "Bootstrap":
        return cls(resamples=f.opt("resamples", "int"), seed=f.opt("seed", "int"), level=f.opt("level", "number"),
                   small_sample_below=f.opt("small_sample_below", "int"))


CHECKPOINT_FIELDS = ("run_fingerprint", "code_version", "method", "generations", "params_hash")


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint that was evaluated (from its data/checkpoints/coordinator.json)."""

    run_fingerprint: str | None = None
    code_version: str | None = None
    method: str | None = None
    generations: int | None = None
    params_hash: str | None = None

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in CHECKPOINT_FIELDS}

    @classmethod
    def parse(cls, f: _Fields) -> "Checkpoint":
        return cls(**{k: f.opt(k, "int" if k == "generations" else "str", nullable=True) for k in CHECKPOINT_FIELDS})


@dataclass(frozen=True)
class NeverTrainedOn:
    """What the coordinator never saw in training, and the check that says so."""

    benchmarks: tuple[str, ...] | None = None
    items: int | None = None
    training_sources: tuple[str, ...] | None = None
    training_items: int | None = None
    in_distribution_items: int | None = None
    guarded_sources: tuple[str, ...] | None = None
    check: str | None = None

    @classmethod
    def parse(cls, f: _Fields) -> "NeverTrainedOn":
        return cls(benchmarks=f.strings("benchmarks"), items=f.opt("items", "int"),
                   training_sources=f.strings("training_sources"), training_items=f.opt("training_items", "int"),
                   in_distribution_items=f.opt("in_distribution_items", "int"),
                   guarded_sources=f.strings("guarded_sources"), check=f.opt("check", "str"))


@dataclass(frozen=True)
class PoolMember:
    name: str
    model_id: str | None = None


# ------------------------------------------------------------------------------------------ the record


@dataclass(frozen=True)
class EvalResults:
    """data/eval/results.json (docs/eval_results_schema.md), checked and typed. Build it with `read` (a file) or
    `from_dict` (what the evaluate stage computed); `to_json()` is the content it was built from, unchanged."""

    benchmarks: tuple[Benchmark, ...]
    """In file order (the evaluate stage writes in-distribution first)."""
    methods: tuple[Method, ...]
    scores: Mapping[str, Mapping[str, Cell]]
    """method → benchmark → cell, in file order."""
    averages: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    """method → split → mean over the split's benchmarks of score / scale on their common units (None: no term)."""
    paired: Mapping[str, tuple[Comparison, ...]] = field(default_factory=dict)
    """benchmark → the coordinator against the best single member and against random routing."""
    pooled_paired: Mapping[str, PooledSplit] = field(default_factory=dict)
    """split → the pooled comparisons."""
    n_items: int | None = None
    bootstrap: Bootstrap = field(default_factory=Bootstrap)
    judge: Judge | None = None
    seeds: Mapping[str, Any] = field(default_factory=dict)
    checkpoint: Checkpoint | None = None
    pool: tuple[PoolMember, ...] = ()
    never_trained_on: NeverTrainedOn | None = None
    eval_code_version: str | None = None
    pool_calls: int | None = None
    store_hits: int | None = None
    failed_calls: int | None = None
    transient_failures: int | None = None
    wall_s: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The content as read or computed: what `to_json` returns and `write` writes."""
    source: str = field(default="results.json", repr=False, compare=False)

    # ---------------------------------------------------------------------------------- reading and writing

    @classmethod
    def read(cls, path: Path | str) -> "EvalResults":
        """Load and check a results.json; a file that is not JSON or not the schema names the file and field."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ResultsFormatError(f"{path}: not JSON ({e})") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "results.json") -> "EvalResults":
        f = _Fields(data, "", source)
        benchmarks = tuple(Benchmark.parse(_Fields(b, f"benchmarks[{i}]", source))
                           for i, b in enumerate(f.req("benchmarks", "list")))
        methods = tuple(Method.parse(_Fields(m, f"methods[{i}]", source))
                        for i, m in enumerate(f.req("methods", "list")))
        f.req("scores", "dict")
        scores_f = f.child("scores")
        scores = {}
        for method, per in scores_f.obj.items():
            per_f = scores_f.sub(method, per)
            scores[method] = {bench: Cell.parse(per_f.sub(bench, cell)) for bench, cell in per.items()}
        averages = {}
        if f.opt("averages", "dict") is not None:
            averages_f = f.child("averages")
            for method, per in averages_f.obj.items():
                per_f = averages_f.sub(method, per)
                averages[method] = {split: per_f.check(f'{per_f.where}["{split}"]', v, "number", nullable=True)
                                    for split, v in per.items()}
        paired = {}
        if f.opt("paired", "dict") is not None:
            paired_f = f.child("paired")
            for bench, comparisons in paired_f.obj.items():
                paired_f.check(f'paired["{bench}"]', comparisons, "list", nullable=True)
                paired[bench] = tuple(Comparison.parse(_Fields(c, f'paired["{bench}"][{i}]', source))
                                      for i, c in enumerate(comparisons or []))
        pooled = {}
        if f.opt("pooled_paired", "dict") is not None:
            pooled_f = f.child("pooled_paired")
            pooled = {split: PooledSplit.parse(pooled_f.sub(split, entry)) for split, entry in pooled_f.obj.items()}
        seeds = f.opt("seeds", "dict", nullable=True) or {}
        pool = []
        for i, member in enumerate(f.opt("pool", "list", nullable=True) or []):
            member_f = _Fields(member, f"pool[{i}]", source)
            pool.append(PoolMember(name=member_f.req("name", "str"), model_id=member_f.opt("model_id", "str")))

        def part(key: str, kind):
            """A section of its own (the judge, the checkpoint, ...); null, absent or {} reads as None."""
            return kind.parse(f.child(key)) if f.opt(key, "dict", nullable=True) else None

        return cls(benchmarks=benchmarks, methods=methods, scores=scores, averages=averages, paired=paired,
                   pooled_paired=pooled, n_items=f.opt("n_items", "int"),
                   bootstrap=part("bootstrap", Bootstrap) or Bootstrap(), judge=part("judge", Judge),
                   seeds=dict(seeds), checkpoint=part("checkpoint", Checkpoint),
                   pool=tuple(pool),
                   never_trained_on=part("never_trained_on", NeverTrainedOn),
                   eval_code_version=f.opt("eval_code_version", "str", nullable=True),
                   **{k: f.opt(k, "int") for k in ("pool_calls", "store_hits", "failed_calls", "transient_failures")},
                   wall_s=f.opt("wall_s", "number"), raw=data, source=source)

    def to_json(self) -> Mapping[str, Any]:
        """The content this record was built from, unchanged: what results.json holds."""
        return self.raw

    def write(self, path: Path | str) -> None:
        """results.json (trinity.files.write_json: indented, sorted keys, atomic)."""
        write_json(path, self.raw)

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


__all__ = ["AVERAGE_METRIC_PREFIX", "Benchmark", "Bootstrap", "COMPUTE_FIELDS", "COUNT_FIELDS", "Cell", "Checkpoint",
           "Comparison", "EvalResults", "HELDOUT", "HELDOUT_OTHER", "IN_DISTRIBUTION", "Judge", "Method", "NeverTrainedOn",
           "PoolMember", "PooledSplit", "ResultsFormatError", "SPLIT_KEYS", "metrics_average", "metrics_benchmarks"]
