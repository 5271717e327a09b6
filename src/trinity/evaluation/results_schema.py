"""How the results record (`trinity.evaluation.results`) is checked and documented: the JSON value types its
pydantic models use, pydantic's errors as paths in the file (`paired["aime"][0].outcome`), and
docs/eval_results_schema.md rendered from the models (`schema_page`; `python -m trinity.evaluation.results --schema`
writes it, and a test keeps the committed page equal to it).

This module does not import the models: `field_path`, `format_errors` and `schema_page` are given the top-level one.
"""
from __future__ import annotations

import enum
import inspect
import json
import numbers
from collections.abc import Callable, Mapping
from pathlib import Path
from types import NoneType, UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, PlainValidator, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError, PydanticKnownError

# ------------------------------------------------------------------------------------------ JSON values


def shown(value: Any) -> str:
    """A value as JSON, cut to 60 characters (for error messages)."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(wanted: str, test: Callable[[Any], bool]) -> PlainValidator:
    """A JSON scalar checked as it is and kept as written (no conversion: 1 stays 1, "1" is refused)."""
    def check(value: Any) -> Any:
        if not test(value):
            raise PydanticCustomError("kind", "expected {wanted}, got {got}", {"wanted": wanted, "got": shown(value)})
        return value
    return PlainValidator(check)


Str = Annotated[str, _kind("a string", lambda v: isinstance(v, str))]
Int = Annotated[int, _kind("an integer", lambda v: isinstance(v, numbers.Integral) and not isinstance(v, bool))]
Number = Annotated[float, _kind("a number", lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool))]
Bool = Annotated[bool, _kind("true or false", lambda v: isinstance(v, bool))]


def _pair(value: Any) -> Any:
    if not (isinstance(value, (list, tuple)) and len(value) == 2):
        raise PydanticCustomError("kind", "expected [low, high], got {got}", {"got": shown(value)})
    return value


Interval = Annotated[tuple[Number, Number], BeforeValidator(_pair)]
"""[low, high]."""

FILE = {"reading": "a file"}
"""The validation context of a file's content (`EvalResults.from_dict`): a field `= UNSTATED` must be stated."""


class _Unstated(enum.Enum):
    UNSTATED = "unstated"


UNSTATED = _Unstated.UNSTATED
"""The default of a field a file must state but Python may leave out (`Cell()`: the empty cell); give it
`validate_default=True` and `stated` as a before-validator. (An enum member: pydantic copies defaults.)"""


def stated(value: Any, info: ValidationInfo) -> Any:
    """A field's value; a file that leaves it out is refused ("missing"), Python's `Model()` reads it as None."""
    if value is UNSTATED:
        if info.context is FILE:
            raise PydanticKnownError("missing")
        return None
    return value


def _turn_keys(value: Any) -> Any:
    """{"1": {...}, "2": {...}} as {1: ..., 2: ...}."""
    if isinstance(value, Mapping):
        for turn in value:
            if not (isinstance(turn, str) and turn.isdigit()):
                raise PydanticCustomError("turn", 'turn keys are conversation turns ("1", "2", ...), got {turn}',
                                          {"turn": repr(turn)})
        return {int(turn): entry for turn, entry in value.items()}
    return value


T = TypeVar("T")
Turns = Annotated[dict[int, T], BeforeValidator(_turn_keys)]
"""Per conversation turn of a judged benchmark, keyed "1", "2", ... in the file."""


class Record(BaseModel):
    """A part of results.json: frozen; a key the model does not name is kept in the file and ignored. A field's
    docstring is its description on the page."""

    model_config = ConfigDict(frozen=True, extra="ignore", use_attribute_docstrings=True, validate_by_name=True,
                              validate_by_alias=True)


# ------------------------------------------------------------------------------------------ errors

_EXPECTED = {"model_type": "an object", "dict_type": "an object", "list_type": "a list", "tuple_type": "a list"}


def format_errors(error: ValidationError, model: type[BaseModel], most: int = 5) -> str:
    """pydantic's errors as `<path in the file>: <what is wrong>`, `; `-joined (the first `most` of them)."""
    lines = []
    for e in error.errors(include_url=False):
        if e["type"] == "missing":
            why = "missing"
        elif e["type"] in _EXPECTED:
            why = f"expected {_EXPECTED[e['type']]}, got {shown(e['input'])}"
        else:  # ours say what they got; pydantic's (a list of the wrong length, ...) are told it
            why = e["msg"] if e["type"] in ("kind", "turn") else f"{e['msg']}, got {shown(e['input'])}"
        lines.append(f"{field_path(e['loc'], model)}: {why}")
    return "; ".join(lines[:most] + ([f"and {len(lines) - most} more"] if len(lines) > most else []))


def field_path(loc: tuple[str | int, ...], model: type[BaseModel]) -> str:
    """A pydantic error location as the path in the file, read along the model's types: a field `.name`, an
    object's key `["key"]`, a list's index `[i]` (`paired["aime"][0].outcome`, `scores["trinity"]["mt_bench"]
    .turns["1"].n`); "top level" for the whole file."""
    path, tp = "", model
    for part in loc:
        tp = _bare(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = next((f for name, f in tp.model_fields.items() if part in (name, f.alias)), None)
            path, tp = f"{path}.{part}" if path else str(part), field and field.annotation
        elif isinstance(part, int) and get_origin(tp) is not dict:
            path, tp = f"{path}[{part}]", (get_args(tp) or (None,))[0]
        else:
            path, tp = f'{path}["{part}"]', (get_args(tp) or (None,))[-1]
    return path or "top level"


def _bare(tp: Any) -> Any:
    """The type under `Annotated[...]` and `... | None`."""
    while get_origin(tp) in (Annotated, Union, UnionType):
        tp = get_args(tp)[0] if get_origin(tp) is Annotated else next(a for a in get_args(tp) if a is not NoneType)
    return tp


# ------------------------------------------------------------------------------------------ the page

PAGE_HEADER = """\
# Evaluation outputs: the contract between the evaluate stage, the report and the trackers

<!-- Generated by `python -m trinity.evaluation.results --schema` from the models of
src/trinity/evaluation/results.py (the prose: src/trinity/evaluation/results_schema.py). Do not edit by hand:
tests/unit/test_eval_results.py checks that this page is the generated one. -->

The evaluate stage (`trinity.stages.evaluate`, playing with `trinity.evaluation.run`, tabulating with
`trinity.evaluation.summary` and `trinity.evaluation.stats`) writes three files under `data/eval/`. The report (`trinity.evaluation.report`) and W&B logging (`trinity.ops.tracking`) only read
them; nothing else is needed to render a report (plus `data/evolve/history.json` and the checkpoint's
`data/checkpoints/coordinator.json`).

`results.json` has one reader: `trinity.evaluation.results.EvalResults`. The stage builds it from what it computed
(checked against this schema before anything is written), writes it (`EvalResults.write`: the same bytes as the dict
it holds, `to_json()`) and derives `reports/metrics/evaluate.json` from it (`EvalResults.dvc_metrics`). The report, W&B logging
(`log_eval_results`), the Prefect table (`trinity.ops.prefect_artifacts.eval_scores_table`) and the nightly comparison
(`trinity.ops.nightly.NightlyRecord.from_results`) read it through `EvalResults.read`, whose typed views are the
models below. A file off this schema is refused with `ResultsFormatError`, naming the file and the field
(`scores["trinity"]["math500"].ci95`). Values are kept as written (an integer stays an integer). In the tables
below a key marked "required" must be present; an "optional" one may be left out (an older or partial file: it
then reads as None, or as the value shown); only a type "... or null" may be null. Unknown extra fields are kept
and ignored: the stage also writes `router_checkpoint`, the learned router's checkpoint fields and its
`saved_fitness` (null: no router).

Benchmark names are task sources: in-distribution `math500`, `mmlu`, `livecodebench`; held-out `aime`,
`bigcodebench_hard`, `mt_bench`, `gpqa` (any subset may be configured; others may appear, e.g. `gsm8k`, or your own
benchmark's name, docs/user_benchmarks.md). A benchmark's `split` is `in_distribution`, `heldout` (the mission's
held-out benchmarks: `aime`, `bigcodebench`, `bigcodebench_hard`, `mt_bench`, `gpqa`) or `heldout_other` (every
other benchmark never trained on: `gsm8k`, `humaneval`, your own held-out ones); a split of another name reads as
`heldout`. Each split present gets its own average and pooled comparison.
Method ids: `trinity` (the evolved coordinator, argmax policy), `router` (the learned router: the same training with
one Worker turn, kind `router`; present when the router stage's checkpoint is), `alone:<member name>` (that member as Worker
for one turn; MT-Bench: both turns), `random-routing` (uniform random model and role, same loop, seeded),
`oracle:best-single` (per benchmark, the best `alone:` row in hindsight — derived, no calls, marked as an
oracle).

**Scoring units.** An item of an accuracy benchmark is one unit. MT-Bench (any benchmark graded by the judge) is
scored per **(item, conversation turn) judgement**, as FastChat reports it: a cell per turn over the items whose
judgement of that turn is valid, and an overall cell = the mean over every valid judgement (not a mean of per-item
means, and never an item's "mean of whichever turns were rated"). A judgement that failed or gave no `[[rating]]`
is unscored; a turn the method left unanswered scores `NO_ANSWER_SCORE` (1, the scale's minimum, no judge call)
and is a valid judgement. Intervals over judgements resample items, each with all its valid turns (a cluster
bootstrap: `stats.bootstrap_mean(..., clusters=)`); "small sample" then counts items.
"""

PAGE_FOOTER = """\
## reports/metrics/evaluate.json (the DVC metrics file: numbers only, in git)

`{"<method>": {"<benchmark>": score, "avg_in_distribution": x, "avg_heldout": y, "avg_heldout_other": z}}` (the
splits present; null-free: a missing score
is left out). `<benchmark>` is the cell's `score` (MT-Bench: the mean over all valid judgements); the averages are
results.json's `averages` (the keys `dvc exp show` and the Makefile's `EXP_SHOW` read are unchanged).

## data/eval/episodes.jsonl (one line per method x item; no oracle rows)

```json
{"method": "trinity", "benchmark": "gpqa", "split": "heldout", "task_id": "gpqa/rec123",
 "score": 1.0,                      // null = unscored (see "error"); MT-Bench: the mean of its turns only when
                                    // every turn has a valid judgement, else null (the per-turn scores are in
                                    // "judge", and the cells are computed from them)
 "answer": "...",                   // the graded answer (MT-Bench: the last conversation turn's answer); null if none
 "turns": [{"conversation_turn": 1, "model": "qwen-coder-1.5b", "role": "worker", "text": "...", "ok": true,
            "verdict": null,        // Verifier turns: "ACCEPT" | "REJECT" from the reply's verdict field; null
                                    // for other roles and for a Verifier reply without the field (no verdict:
                                    // the episode went on)
            "prompt_tokens": 210, "completion_tokens": 88, "latency_s": 9.1}],
 "verifier_first": false,
 "judge": [{"turn": 1, "score": 7.0, "error": null, "prompt": "single-v1", "raw": "..."}],   // MT-Bench only, else []
 "tokens": 298, "latency_s": 9.1, "cost_usd": 0.0,
 "path": [["2", "worker"]],          // [model index in the pool (string), role] per pool turn
 "error": null}                      // why an item is unscored / a call failed, else null (MT-Bench: which
                                    // turn has no valid judgement)
```
"""

PAGE = Path(__file__).resolve().parents[3] / "docs" / "eval_results_schema.md"


def main(argv: list[str], model: type[BaseModel]) -> int | str:
    """`--schema`: write the page; `--schema --check`: say whether the committed page is the generated one."""
    if argv[:1] != ["--schema"] or not set(argv[1:]) <= {"--check"}:
        return "usage: python -m trinity.evaluation.results --schema [--check]"
    page = schema_page(model)
    if "--check" in argv:
        return 0 if PAGE.read_text() == page else f"{PAGE} is not the page the models give: run without --check"
    PAGE.write_text(page)
    print(f"wrote {PAGE}")
    return 0


_SCALARS = {str: "string", int: "integer", float: "number", bool: "true or false", Any: "any"}


def schema_page(model: type[BaseModel], title: str = "data/eval/results.json") -> str:
    """The page: the header prose, a table of fields for the model and every model under it (the top level first,
    then in the order the fields name them), the footer prose."""
    lines = [PAGE_HEADER, f"## {title}", ""]
    for part in _models(model):
        lines += [f"### {'The top level' if part is model else part.__name__}", "", _prose(part.__doc__), "",
                  "| key | type | | description |", "|---|---|---|---|"]
        lines += [f"| `{field.alias or name}` | {_type(field.annotation)} | {_left_out(field)} | "
                  f"{_prose(field.description, cell=True)} |" for name, field in part.model_fields.items()]
        lines.append("")
    return "\n".join(lines + [PAGE_FOOTER])


def _models(model: type[BaseModel]) -> list[type[BaseModel]]:
    found = [model]
    for part in found:  # grows while it is walked: breadth first
        for field in part.model_fields.values():
            found += [m for m in _named(field.annotation) if m not in found]
    return found


def _named(tp: Any) -> list[type[BaseModel]]:
    """The models a type names, in order."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in get_args(tp) for m in _named(arg)]


def _type(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:
        return _type(args[0])
    if origin in (Union, UnionType):
        return " or ".join("null" if a is NoneType else _type(a) for a in args)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return f"[{tp.__name__}](#{tp.__name__.lower()})"
    if origin is tuple:
        return f"[{_type(args[0])}, ...]" if args[-1] is Ellipsis else f"[{', '.join(map(_type, args))}]"
    if origin is dict:
        return f"{{{'turn' if args[0] is int else _type(args[0])}: {_type(args[1])}}}"
    return _SCALARS[tp]


def _left_out(field: Any) -> str:
    """required, optional (reads as None), or optional with the value it reads as."""
    default = field.get_default(call_default_factory=True)
    if field.is_required() or default is UNSTATED:
        return "required"
    if default is None:
        return "optional"
    return f"optional (`{'{}' if isinstance(default, BaseModel) else json.dumps(_plain(default))}`)"


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _prose(text: str | None, cell: bool = False) -> str:
    """A docstring on one line (in a table cell: its `|` escaped)."""
    line = " ".join(inspect.cleandoc(text or "").split())
    return line.replace("|", "\\|") if cell else line
