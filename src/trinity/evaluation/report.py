"""The evaluation report, rendered from files only.

Reads what the pipeline wrote (the contract is docs/eval_results_schema.md):

- `data/eval/results.json`, `data/eval/episodes.jsonl` (the evaluate stage),
- `data/evolve/history.json`, `data/checkpoints/coordinator.json` (the evolve stage),

and writes `summary.md`, `traces.md` and PNG plots under `plots/`. Nothing here calls a model, opens the store
or reads settings, and nothing is timestamped: the same files render the same bytes.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from trinity.coordinator.roles import ROLES
from trinity.evaluation.stats import MIN_ITEMS_FOR_OUTCOME

ROLE_NAMES = tuple(role.value for role in ROLES)
"""Columns of the usage heatmap, in the order of the head's role logits."""

OPTIMISER_NAMES = {"sep_cma": "sep-CMA-ES", "reinforce": "REINFORCE", "random_search": "random search"}

PAPER_TRAINING_EPISODES = 60 * 33 * 16
"""The paper's training budget: 60 generations x ~33 candidates x 16 episodes (~31.7k episodes)."""

SMALL_SAMPLE_MARK = "†"
NO_VALUE = "—"
TRACES_PER_BENCHMARK = 2
TRACE_TEXT_CHARS = 600
"""What a trace shows of each turn's text; the rest is clipped (the full text is in episodes.jsonl)."""

DPI = 110
PNG_METADATA = {"Software": None}
"""No version text chunk in the PNGs (Agg writes no timestamp): a rerun on the same files gives the same bytes."""

SPLITS = (("in_distribution", "in-distribution", "avg (in-dist.)"), ("heldout", "held-out", "avg (held-out)"))
"""(key in results.json averages, label, label of the average column). A benchmark whose split is not
`in_distribution` is counted as held-out: the coordinator never trained on it."""

_SPLIT_LABELS = {key: label for key, label, _ in SPLITS}

_KIND_ORDER = {"coordinator": 0, "single": 1, "baseline": 2, "oracle": 4}
"""Row order of the tables: the coordinator, each member alone, the baselines, other methods, the oracle last."""

_OTHER_METHOD_COLOURS = ("tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                         "tab:cyan")

# ------------------------------------------------------------------------------------------ inputs


def _require(path: Path, stage: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the `{stage}` stage writes it (run that stage first)")
    return path


def _read_json(path: Path, stage: str):
    return json.loads(_require(path, stage).read_text())


def _read_jsonl(path: Path, stage: str) -> list[dict]:
    return [json.loads(line) for line in _require(path, stage).read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------ rows and columns


def split_key(benchmark: dict) -> str:
    return "in_distribution" if benchmark["split"] == "in_distribution" else "heldout"


def ordered_benchmarks(results: dict) -> list[dict]:
    """In-distribution benchmarks first, then held-out, each group in the order results.json lists them."""
    return sorted(results["benchmarks"], key=lambda b: split_key(b) != "in_distribution")


def ordered_methods(results: dict) -> list[dict]:
    return sorted(results["methods"], key=lambda m: _KIND_ORDER.get(m.get("kind"), 3))


def method_label(method: dict) -> str:
    return f"{method['method']} (oracle, hindsight)" if method.get("kind") == "oracle" else method["method"]


def _score_entry(results: dict, method: str, benchmark: str) -> dict:
    return results["scores"].get(method, {}).get(benchmark) or {}


def _split_label(benchmark: dict) -> str:
    return _SPLIT_LABELS[split_key(benchmark)]


def _benchmark_header(benchmark: dict, turn: int | None = None) -> str:
    """'math500 (n=10)'; a judged benchmark's columns: 'mt_bench turn 1 (n=2, 1–10)', 'mt_bench all turns (n=2x2,
    1–10)' (items x conversation turns: the overall cell is over (item, turn) judgements)."""
    scale = "" if benchmark["scale"] <= 1 else f", 1–{benchmark['scale']:g}"
    if not _turns(benchmark):
        return f"{benchmark['name']} (n={benchmark['n']}{scale})"
    if turn is not None:
        return f"{benchmark['name']} turn {turn} (n={benchmark['n']}{scale})"
    return f"{benchmark['name']} all turns (n={benchmark['n']}x{_turns(benchmark)}{scale})"


def _turns(benchmark: dict) -> int:
    """Conversation turns of a benchmark scored per (item, turn) judgement (MT-Bench: 2); 0 for one unit an item."""
    return (benchmark.get("turns") or 0) if benchmark.get("unit") == "judgement" else 0


def _benchmark_columns(benchmark: dict) -> list[tuple[str, int | None]]:
    """(header, turn or None) of a benchmark's main-table columns: one, or per turn then all turns."""
    turns = [*range(1, _turns(benchmark) + 1), None] if _turns(benchmark) else [None]
    return [(_benchmark_header(benchmark, turn), turn) for turn in turns]


def _turn_entry(entry: dict, turn: int | None) -> dict:
    return entry if turn is None else (entry.get("turns") or {}).get(str(turn)) or {}


def _decimals(scale: float) -> tuple[int, int]:
    """Decimals of a score and of its interval bounds: accuracies in [0, 1] 3 and 3, scores on 1–10 2 and 1."""
    return (3, 3) if scale <= 1 else (2, 1)


def score_text(score: float | None, ci95: list[float] | None, scale: float, *, signed: bool = False) -> str:
    """'0.333 [0.000, 1.000]' (accuracy), '6.50 [5.0, 8.0]' (a 1–10 score); '—' without a score."""
    if score is None:
        return NO_VALUE
    digits, ci_digits = _decimals(scale)
    text = f"{score:+.{digits}f}" if signed else f"{score:.{digits}f}"
    if ci95:
        text += f" [{ci95[0]:.{ci_digits}f}, {ci95[1]:.{ci_digits}f}]"
    return text


def _score_cell(entry: dict, scale: float) -> str:
    text = score_text(entry.get("score"), entry.get("ci95"), scale)
    if entry.get("score") is not None and entry.get("small_sample"):
        text += SMALL_SAMPLE_MARK
    if entry.get("unscored"):
        text += f" ({entry['unscored']} unscored)"
    return text


def _average(results: dict, method: str, split: str) -> float | None:
    return (results.get("averages") or {}).get(method, {}).get(split)


def _fixed(value: float | None, digits: int = 3) -> str:
    return NO_VALUE if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _small_sample_below(results: dict) -> int:
    return (results.get("bootstrap") or {}).get("small_sample_below", 30)


# ------------------------------------------------------------------------------------------ summary.md


def _param_sentence(meta: dict) -> str:
    rows, d = meta["head_shape"]
    head = f"head {rows} x {d} = {rows * d} parameters"
    n_svf = meta.get("svf_params") or 0
    if not n_svf:
        return head
    return (f"{head} + {n_svf} SVF scales of encoder block {meta.get('svf_layer')} (one per singular value of "
            f"each of its linear layers) = {meta['n_params']} parameters")


def _setup_paragraph(results: dict, meta: dict) -> list[str]:
    benchmarks = ordered_benchmarks(results)
    sizes = "; ".join(
        f"{label}: " + ", ".join(f"{b['name']} {b['n']}" for b in benchmarks if split_key(b) == key)
        for key, label, _ in SPLITS if any(split_key(b) == key for b in benchmarks))
    never = results.get("never_trained_on") or {}
    training_items = len(meta["train_tasks"]) if "train_tasks" in meta else never.get("training_items")
    training_sources = f" ({', '.join(never['training_sources'])})" if never.get("training_sources") else ""
    seeds = ", ".join(f"{name} {value}" for name, value in (results.get("seeds") or {}).items()) or "not recorded"
    optimiser = OPTIMISER_NAMES.get(meta.get("method"), meta.get("method"))
    paragraph = (
        f"Pool: {', '.join(p['name'] for p in meta['pool'])}. Items per benchmark — {sizes} "
        f"({results['n_items']} in all); the coordinator trained on {training_items} items{training_sources}. "
        f"Seeds: {seeds}. "
        f"Checkpoint `{meta['run_fingerprint'][:12]}` (code `{meta['code_version'][:8]}`): {meta['generations']} "
        f"generations of {optimiser} (seed {meta['seed']}), encoder `{meta['encoder']}`, {_param_sentence(meta)}.")
    lines = [paragraph]
    evaluated = (results.get("checkpoint") or {}).get("run_fingerprint")
    if evaluated and evaluated != meta["run_fingerprint"]:
        lines += ["", f"**Warning:** results.json was evaluated with checkpoint `{evaluated[:12]}`, not the "
                      f"checkpoint described here (`{meta['run_fingerprint'][:12]}`): rerun the evaluate stage."]
    return lines


def main_table(results: dict) -> list[str]:
    """Methods x benchmarks, in-distribution columns and their average, then held-out and theirs."""
    benchmarks = ordered_benchmarks(results)
    header, group_row, columns = ["method"], [""], []
    for key, label, average_label in SPLITS:
        group = [b for b in benchmarks if split_key(b) == key]
        if not group:
            continue
        group_columns = [(b, header_text, turn) for b in group for header_text, turn in _benchmark_columns(b)]
        header += [header_text for _, header_text, _ in group_columns] + [average_label]
        group_row += [f"**{label}**"] + [""] * len(group_columns)
        columns += [(b["name"], b["scale"], turn) for b, _, turn in group_columns] + [(key, None, None)]
    rows = [group_row]
    for method in ordered_methods(results):
        name = method["method"]
        rows.append([method_label(method)] + [
            _fixed(_average(results, name, column)) if scale is None
            else _score_cell(_turn_entry(_score_entry(results, name, column), turn), scale)
            for column, scale, turn in columns])
    return _table(header, rows)


def _judged_note(results: dict) -> str:
    judged = [b for b in ordered_benchmarks(results) if _turns(b)]
    if not judged:
        return ""
    names = ", ".join(b["name"] for b in judged)
    return (f" {names}: scored per (item, conversation turn) judgement, as FastChat reports MT-Bench — a column per "
            f"turn (the mean over the items whose judgement of that turn is valid) and `all turns` (the mean over "
            f"every valid judgement, its interval resampling items with their turns); (k unscored) there counts "
            f"judgements that failed or gave no [[rating]] (a turn the method left unanswered scores the scale's "
            f"minimum without a judge call, and counts).")


def _average_basis(results: dict) -> str:
    """Which units the averages rest on, where that is not every unit of a benchmark."""
    partial = [f"{b['name']} {b['common_units']} of {b['units']} {'judgements' if _turns(b) else 'items'}"
               for b in ordered_benchmarks(results)
               if b.get("common_units") is not None and b.get("units") is not None and b["common_units"] < b["units"]]
    return (" Here the units every method scored are: " + "; ".join(partial) + "." if partial
            else " Here every method scored every unit, so each term is the benchmark's cell / scale."
            if any("common_units" in b for b in results["benchmarks"]) else "")


def _main_table_notes(results: dict) -> str:
    bootstrap = results.get("bootstrap") or {}
    metrics = ", ".join(f"{b['name']} {b['metric']}" for b in ordered_benchmarks(results))
    return (
        f"Cells: mean score [95% interval: percentile bootstrap over items, {bootstrap.get('resamples', '?')} "
        f"resamples, seed {bootstrap.get('seed', '?')}]. Metrics: {metrics}.{_judged_note(results)} The averages "
        f"are means over the split's benchmarks of score / scale (a 1–10 score counts as score / 10), each "
        f"benchmark's term taken over the units every method with a score there scored (items; MT-Bench: (item, "
        f"turn) judgements), so every row's average rests on the same items and turns.{_average_basis(results)} "
        f"{SMALL_SAMPLE_MARK} small sample (n < {_small_sample_below(results)}): the interval is wide and only "
        f"indicative (for judgements: fewer than {_small_sample_below(results)} items). {NO_VALUE}: no scored "
        f"item; (k unscored): items without a score (an outage; MT-Bench: judgements, see above). "
        f"`trinity` = the evolved coordinator (argmax policy); `alone:<member>` = that member as "
        f"Worker for one turn (MT-Bench: both conversation turns); `random-routing` = a uniform random model and "
        f"role each turn (same episode loop, seeded); `oracle:best-single` = per benchmark, the best `alone:` row "
        f"chosen in hindsight (no calls of its own: an upper bound for picking one member, not a method).")


COMPUTE_COLUMNS = (("tokens_per_task", "tokens / task", 0), ("wall_s_per_task", "seconds / task", 1),
                   ("cost_usd_per_task", "cost (USD) / task", 4), ("mean_turns", "mean turns", 2))
"""(field of a score entry, column label, decimals) of the compute table."""


def _split_benchmarks(results: dict, split: str | None) -> list[dict]:
    return [b for b in ordered_benchmarks(results) if split is None or split_key(b) == split]


def mean_per_item(results: dict, method: str, field: str, split: str | None = None) -> float | None:
    """The mean over the items of a split's benchmarks (every item weighs the same: a benchmark's per-task figure
    weighted by its item count) of a per-task figure; None if no benchmark has it. split None: all benchmarks."""
    pairs = [(_score_entry(results, method, b["name"]).get(field), b["n"]) for b in _split_benchmarks(results, split)]
    pairs = [(v, n) for v, n in pairs if v is not None and n]
    return float(np.average([v for v, _ in pairs], weights=[n for _, n in pairs])) if pairs else None


def _total_over_benchmarks(results: dict, method: str, field: str, split: str | None = None) -> int:
    return sum(_score_entry(results, method, b["name"]).get(field) or 0 for b in _split_benchmarks(results, split))


def compute_table(results: dict, split: str | None = None) -> list[str]:
    """Compute per task of each method, averaged over the items of `split`'s benchmarks (None: every benchmark)."""
    header = ["method"] + [label for _, label, _ in COMPUTE_COLUMNS] + ["new LLM calls", "failed calls"]
    rows = []
    for method in ordered_methods(results):
        if method.get("kind") == "oracle":
            continue
        name = method["method"]
        cells = [_fixed(mean_per_item(results, name, field, split), digits) for field, _, digits in COMPUTE_COLUMNS]
        rows.append([method_label(method)] + cells
                    + [str(_total_over_benchmarks(results, name, "calls_new", split)),
                       str(_total_over_benchmarks(results, name, "failed_calls", split))])
    return _table(header, rows)


def _items_phrase(benchmarks: list[dict]) -> str:
    """'math500, mmlu, mbpp: 30 items'."""
    return f"{', '.join(b['name'] for b in benchmarks)}: {sum(b['n'] for b in benchmarks)} items"


def compute_section(results: dict) -> list[str]:
    """One compute table per split, under a heading naming the items it averages over."""
    lines = ["## Compute per task", ""]
    for key, label, _ in SPLITS:
        group = _split_benchmarks(results, key)
        if group:
            lines += [f"### {label.capitalize()} items ({_items_phrase(group)})", ""] + compute_table(results, key)
            lines += [""]
    return lines + [_compute_notes(results), ""]


def _compute_notes(results: dict) -> str:
    minutes = f"{results['wall_s'] / 60:.1f} min" if results.get("wall_s") is not None else "an unrecorded time"
    return (
        "Per task = per item of the split's benchmarks named in the heading (every item weighs the same; an MT-Bench "
        "item is its whole conversation, both turns). Tokens: prompt + completion of every pool call of the item "
        "(the MT-Bench judge not included); seconds: the summed latency of those calls as recorded when they were "
        "paid (a stored reply keeps its original figure); mean turns: pool turns per item; new LLM calls: calls "
        "not already in the response store when this run asked, summed over the split's benchmarks. "
        f"This evaluation made {results.get('pool_calls', '?')} new pool calls ({results.get('store_hits', '?')} "
        f"store hits) in {minutes}. The oracle is left out: it makes no calls of its own.")


def paired_table(results: dict) -> list[str]:
    paired = results.get("paired") or {}
    rows = []
    for benchmark in ordered_benchmarks(results):
        name, scale = benchmark["name"], benchmark["scale"]
        comparisons = paired.get(name) or []
        if not comparisons:
            rows.append([name, NO_VALUE, NO_VALUE, NO_VALUE, "no paired data"])
        judged = bool(_turns(benchmark))
        for c in comparisons:
            rows.append(_paired_row(f"{name} all turns" if judged else name, c, scale, judged))
        for turn in range(1, _turns(benchmark) + 1):
            for c in comparisons:
                if str(turn) in (c.get("turns") or {}):
                    rows.append(_paired_row(f"{name} turn {turn}", c["turns"][str(turn)], scale, False))
    return _table(["benchmark", "comparison", "difference [95% interval]", "n", "outcome"], rows)


def _n_text(c: dict, units: str | None) -> str:
    """'30†', or for units other than items '7 judgements, 4 items†'."""
    mark = SMALL_SAMPLE_MARK if c.get("small_sample") else ""
    if units is None or c.get("items") is None or c["items"] == c["n"]:
        return f"{c['n']}{mark}" if units is None else f"{c['n']} items{mark}"
    return f"{c['n']} {units}, {c['items']} items{mark}"


def _outcome_text(c: dict) -> str:
    return f"**{c['outcome']}**" if c["outcome"] == "loses" else c["outcome"]


def _paired_row(name: str, c: dict, scale: float, judged: bool) -> list[str]:
    return [name, f"{c['a']} − {c['b']} ({c['label']})", score_text(c.get("diff"), c.get("ci95"), scale, signed=True),
            _n_text(c, "judgements") if judged else _n_text(c, None), _outcome_text(c)]


def pooled_table(results: dict) -> list[str]:
    """Per split: the coordinator minus one best member and minus random routing over every unit both scored."""
    pooled = results.get("pooled_paired") or {}
    benchmarks = {b["name"]: b for b in results["benchmarks"]}
    rows = []
    for key, label, _ in SPLITS:
        entry = pooled.get(key)
        if not entry:
            continue
        names = [f"{n} as (item, turn) / {benchmarks[n]['scale']:g}" if n in benchmarks and _turns(benchmarks[n])
                 else n for n in entry.get("benchmarks", [])]
        where = f"{label} ({', '.join(names)})"
        if not entry.get("comparisons"):
            rows.append([where, NO_VALUE, NO_VALUE, NO_VALUE, NO_VALUE, "no paired data"])
        for c in entry.get("comparisons") or []:
            rows.append([where, f"{c['a']} − {c['b']} ({c['label']})",
                         score_text(c.get("diff"), c.get("ci95"), 1.0, signed=True), _n_text(c, "units"),
                         f"{c.get('a_better', '?')} / {c.get('b_better', '?')}", _outcome_text(c)])
    return _table(["split (benchmarks pooled)", "comparison", "difference [95% interval]", "n",
                   "units trinity higher / lower", "outcome"], rows)


def _pooled_scores_sentence(results: dict) -> str:
    pooled = results.get("pooled_paired") or {}
    sentences = []
    for key, label, _ in SPLITS:
        entry = pooled.get(key)
        if not entry:
            continue
        scores = [(m["method"], (entry.get("scores") or {}).get(m["method"])) for m in ordered_methods(results)
                  if m.get("kind") != "oracle"]
        scores = ", ".join(f"`{m}` {v:.3f}" for m, v in scores if v is not None)
        if scores:
            sentences.append(f"{label.capitalize()} pooled scores over the {entry.get('common_units')} units every "
                             f"method scored (of {entry.get('units')}): {scores}.")
    return " ".join(sentences)


def pooled_section(results: dict) -> list[str]:
    if not results.get("pooled_paired"):
        return []
    judged = [b["name"] for b in ordered_benchmarks(results) if _turns(b)]
    per_turn = (f" {', '.join(judged)} per turn: the `turn k` rows of the per-benchmark table above." if judged else "")
    return ["## Pooled paired comparisons, per split", "",
            "Per split, every item of the split's benchmarks that both methods scored, pooled on one scale (score / "
            "scale: an accuracy as is, an MT-Bench judgement / 10, each (item, turn) judgement one unit), the "
            "coordinator's score minus another method's; the bootstrap resamples items (an MT-Bench item with its "
            "turns). The best single member here is one member for the whole split: the `alone:` row with the best "
            "pooled score on the units every method scored, chosen in hindsight (not the per-benchmark picks "
            "mixed). n: the units compared (and the items they come from, where an item gives more than one); the "
            "outcome as above." + per_turn, ""] + pooled_table(results) + ["", _pooled_scores_sentence(results), ""]


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _outcome_sentence(label: str, comparisons: list[tuple[dict, dict]]) -> str:
    """'Against the random routing, the coordinator wins on a (+0.500); **loses on b (-0.300)**.' from
    (benchmark, comparison) pairs; the opponent is named when it changes from benchmark to benchmark (as the best
    single member does)."""
    name_opponent = len({c["b"] for _, c in comparisons}) > 1
    by_outcome: dict[str, list[str]] = {}
    for benchmark, c in comparisons:
        detail = score_text(c.get("diff"), None, benchmark["scale"], signed=True)
        if name_opponent:
            detail += f" vs `{c['b']}`"
        outcome = c["outcome"]
        if outcome == "too few items":  # no call at this size: say which way the point estimate points
            diff = c.get("diff") or 0.0
            outcome = "behind" if diff < 0 else "ahead" if diff > 0 else "level"
        by_outcome.setdefault(outcome, []).append(f"{benchmark['name']} ({detail})")
    called = [f"{outcome} on {_join(by_outcome[outcome])}" for outcome in ("wins", "ties") if outcome in by_outcome]
    if "loses" in by_outcome:
        called.append(f"**loses on {_join(by_outcome['loses'])}**")
    elif called:
        called.append("loses on none")
    if "no data" in by_outcome:
        called.append(f"has no data on {_join(by_outcome['no data'])}")
    point = [f"{word} on {_join(by_outcome[key])}" for key, word in
             (("ahead", "is ahead"), ("behind", "**is behind**"), ("level", "is level")) if key in by_outcome]
    sentences = [f"Against the {label}, the coordinator " + "; ".join(called) + "."] if called else []
    if point:
        lead = "On the point estimate only" if called else f"Against the {label}, on the point estimate only"
        sentences.append(f"{lead} (too few paired items to call a win or a loss), the coordinator "
                         + "; ".join(point) + ".")
    return " ".join(sentences)


def _averages_sentence(results: dict, split: str, split_label: str) -> str | None:
    mine = _average(results, "trinity", split)
    if mine is None:
        return None
    singles = [(m["method"], _average(results, m["method"], split)) for m in results["methods"]
               if m.get("kind") == "single"]
    singles = [(name, value) for name, value in singles if value is not None]
    others = []  # (who, their average, what the figure in brackets says besides the value)
    if singles:
        best_name, best = max(singles, key=lambda s: s[1])
        others.append((f"`{best_name}`", best, ", the best member alone on this average"))
    random_routing = _average(results, "random-routing", split)
    if random_routing is not None:
        others.append(("random routing", random_routing, ""))
    comparisons = [f"{'above' if mine > value else 'below' if mine < value else 'equal to'} {who} ({value:.3f}{note})"
                   for who, value, note in others]
    oracle = [_average(results, m["method"], split) for m in results["methods"] if m.get("kind") == "oracle"]
    oracle_note = f"; the hindsight oracle reaches {oracle[0]:.3f}" if oracle and oracle[0] is not None else ""
    return (f"On the {split_label} average the coordinator scores {mine:.3f}"
            + (": " + _join(comparisons) if comparisons else "") + oracle_note + ".")


def reading(results: dict) -> str:
    """Plain-language reading computed from this run's outcomes and averages (no fixed verdict)."""
    by_label: dict[str, list[tuple[dict, dict]]] = {}
    for benchmark in ordered_benchmarks(results):
        for c in (results.get("paired") or {}).get(benchmark["name"]) or []:
            by_label.setdefault(c["label"], []).append((benchmark, c))
    sentences = [_outcome_sentence(label, comparisons) for label, comparisons in by_label.items()]
    if not sentences:
        sentences.append("There is no paired comparison to read.")
    sentences += [s for key, label, _ in SPLITS if (s := _averages_sentence(results, key, label))]
    sentences.append("Wins and losses are per benchmark: the paired 95% interval of the difference lies above or "
                     f"below 0; with n < {_small_sample_below(results)} items most differences read as ties, and with "
                     f"fewer than {MIN_ITEMS_FOR_OUTCOME} paired items none is called (even if every item went the same "
                     "way, a sign test could not tell at the 5% level).")
    return "**Reading it.** " + " ".join(sentences)


def _judge_section(judge: dict | None) -> list[str]:
    if judge is None:
        return []
    membership = "a member of the pool it judges" if judge.get("in_pool") else "not in the pool"
    return ["## MT-Bench judge", "",
            f"Judge: `{judge['name']}` (`{judge.get('model_id', '?')}`), {membership}. "
            f"Verdicts: {judge.get('verdicts', 0)}; unparseable (no [[rating]]): {judge.get('unparseable', 0)}; "
            f"failed calls: {judge.get('failed', 0)}." + (f" Note: {judge['note']}" if judge.get("note") else ""), ""]


def _never_trained_on_section(results: dict) -> list[str]:
    never = results.get("never_trained_on")
    if not never:
        return []
    return ["## Never seen in training", "",
            f"- held-out benchmarks: {', '.join(never.get('benchmarks', [])) or 'none'} "
            f"({never.get('items', '?')} items)",
            f"- training sources: {', '.join(never.get('training_sources', []))} "
            f"({never.get('training_items', '?')} items)",
            f"- check: {never.get('check', 'not recorded')}", ""]


def _history_cell(row: dict, key: str, digits: int) -> str:
    value = row.get(key)
    if value is None:
        return NO_VALUE
    return str(value) if digits == 0 else f"{value:.{digits}f}"


EVOLUTION_COLUMNS = (("generation", "generation", 0), ("saved_fitness", "saved vector fitness", 3),
                     ("saved_accuracy", "saved vector accuracy", 3), ("mean_fitness", "candidates mean", 3),
                     ("best_candidate_fitness", "best candidate", 3), ("sigma", "sigma", 4),
                     ("calls_made", "new LLM calls", 0), ("store_hits", "store hits", 0))
"""(key of a history.json row, column label, decimals; 0 = printed as is)."""


def _evolution_section(meta: dict, history: list[dict]) -> list[str]:
    lines = ["## Evolution", "",
             f"Saved vector = the parameters the run saves after that generation (CMA-ES: the distribution mean), "
             f"scored on the same {meta.get('saved_fitness_episodes', '?')} sampled training episodes every "
             f"generation. Candidates = that generation's sampled population on its minibatch; their best is a "
             f"noisy maximum, not the saved vector's score.", ""]
    if not history:
        return lines + ["No generations recorded (history.json is empty).", ""]
    lines += _table([label for _, label, _ in EVOLUTION_COLUMNS],
                    [[_history_cell(row, key, digits) for key, _, digits in EVOLUTION_COLUMNS] for row in history])
    episodes = sum(int(row.get("episodes") or 0) for row in history)
    if episodes:
        lines += ["", f"Training played {episodes:,} episodes ({len(history)} generations); the paper trains on "
                      f"about {PAPER_TRAINING_EPISODES:,} (60 generations x ~33 candidates x 16 tasks). To train "
                      f"further, raise `evolve.generations` (a finished run carries on from its last generation) "
                      f"and `evolve.episodes_per_candidate` / `data.train`."]
    return lines + [""]


PLOTS = (("scores", "Scores with 95% intervals, per benchmark"),
         ("usage", "The coordinator's turns: model x role, per benchmark"),
         ("fitness", "Fitness over generations"),
         ("score_vs_compute", "Average score against tokens per task"))
"""(file stem under plots/, caption) of the report's figures, in the order summary.md shows them."""


def summary_markdown(results: dict, meta: dict, history: list[dict]) -> str:
    lines = ["# Trinity — evaluation", ""]
    lines += _setup_paragraph(results, meta) + [""]
    lines += main_table(results) + ["", _main_table_notes(results), ""]
    lines += compute_section(results)
    lines += ["## Paired comparisons, per benchmark", "",
              "Per benchmark, the coordinator's score minus another method's on the same units (the units are "
              "resampled in pairs), in the benchmark's own unit; MT-Bench pairs the (item, turn) judgements both "
              "methods have valid: all turns (resampling items with their turns), then each turn.", ""]
    lines += paired_table(results) + ["", reading(results), ""]
    lines += pooled_section(results)
    lines += _judge_section(results.get("judge"))
    lines += _never_trained_on_section(results)
    lines += _evolution_section(meta, history)
    lines += ["## Plots and traces", ""]
    lines += [f"![{caption}](plots/{stem}.png)" for stem, caption in PLOTS]
    lines += ["", "Episode traces of the coordinator, a few per benchmark: [traces.md](traces.md)."]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ traces.md


def _is_failing(row: dict, scale: float) -> bool:
    """Unscored, or scored below half the benchmark's scale (accuracy 0; an MT-Bench rating under 5)."""
    return row.get("score") is None or row["score"] < scale / 2


def pick_traces(rows: list[dict], scale: float, count: int) -> list[dict]:
    """The first `count` rows in file order, one of them failing when any row fails."""
    failing = next((r for r in rows if _is_failing(r, scale)), None)
    chosen = rows[:count]
    if failing is not None and failing not in chosen and chosen:
        chosen = chosen[:-1] + [failing]
    return chosen


def _fenced(text: str) -> list[str]:
    """`text` in a code fence longer than any backtick run inside it, so no reply can break the page."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", text, fence]


def _clip(text: str) -> str:
    if len(text) <= TRACE_TEXT_CHARS:
        return text
    return f"{text[:TRACE_TEXT_CHARS]} … [clipped: {len(text)} characters in all]"


def _turn_lines(number: int, turn: dict, multi_turn: bool) -> list[str]:
    facts = [f"**turn {number}**"]
    if multi_turn:
        facts.append(f"conversation turn {turn.get('conversation_turn', '?')}")
    facts.append(f"`{turn['model']}` as {turn['role']}")
    if turn.get("verdict"):
        facts.append(f"verdict **{turn['verdict']}**")
    tokens = (turn.get("prompt_tokens") or 0) + (turn.get("completion_tokens") or 0)
    facts.append(f"{tokens} tokens")
    if turn.get("latency_s") is not None:
        facts.append(f"{turn['latency_s']:.1f} s")
    if turn.get("ok") is False:
        facts.append("**the call failed**")
    return [" · ".join(facts), ""] + _fenced(_clip(turn.get("text") or "")) + [""]


def _trace_lines(row: dict, benchmark: dict) -> list[str]:
    scale = benchmark["scale"]
    verdict = " · **failing**" if _is_failing(row, scale) else ""
    lines = [f"### {benchmark['name']} · `{row['task_id']}` · score {score_text(row.get('score'), None, scale)}"
             f"{verdict}", ""]
    if row.get("error"):
        lines += [f"Error: {row['error']}", ""]
    multi_turn = bool(row.get("judge"))
    for number, turn in enumerate(row.get("turns") or [], start=1):
        lines += _turn_lines(number, turn, multi_turn)
    if row.get("judge"):
        ratings = [f"conversation turn {j['turn']}: "
                   + (f"{j['score']:g}" if j.get("score") is not None else f"unscored ({j.get('error')})")
                   for j in row["judge"]]
        lines += ["Judge: " + "; ".join(ratings) + ".", ""]
    return lines


def traces_markdown(results: dict, episodes: list[dict], per_benchmark: int = TRACES_PER_BENCHMARK) -> str:
    lines = ["# Trinity — episode traces", "",
             f"A few episodes of the evolved coordinator (`trinity`, argmax policy) per benchmark: the first "
             f"{per_benchmark} items in file order, one of them failing (unscored, or scored below half the scale) "
             f"when any fails. Each turn: the model, its role, the Verifier's verdict, the tokens of the call and "
             f"what it said (clipped to {TRACE_TEXT_CHARS} characters; the full text is in "
             f"data/eval/episodes.jsonl).", ""]
    for benchmark in ordered_benchmarks(results):
        lines += [f"## {benchmark['name']} ({_split_label(benchmark)})", ""]
        rows = [r for r in episodes if r["method"] == "trinity" and r["benchmark"] == benchmark["name"]]
        if not rows:
            lines += ["No coordinator episode recorded.", ""]
        for row in pick_traces(rows, benchmark["scale"], per_benchmark):
            lines += _trace_lines(row, benchmark)
    return "\n".join(lines).rstrip("\n") + "\n"


# ------------------------------------------------------------------------------------------ plots


def usage_counts(rows: list[dict], pool_names: list[str], method: str = "trinity") -> dict[str, np.ndarray]:
    """Per benchmark, how many of `method`'s turns went to each (model, role): an array of shape
    (len(pool_names), len(ROLE_NAMES)), rows in pool order, columns in ROLE_NAMES order."""
    counts: dict[str, np.ndarray] = {}
    for row in rows:
        if row["method"] != method:
            continue
        table = counts.setdefault(row["benchmark"], np.zeros((len(pool_names), len(ROLE_NAMES)), dtype=int))
        for turn in row.get("turns") or []:
            if turn["model"] not in pool_names or turn["role"] not in ROLE_NAMES:
                raise ValueError(f"{row['task_id']}: turn by {turn['model']!r} as {turn['role']!r} is outside the "
                                 f"pool {pool_names} / roles {ROLE_NAMES} (episodes of another checkpoint?)")
            table[pool_names.index(turn["model"]), ROLE_NAMES.index(turn["role"])] += 1
    return counts


PANELS_PER_ROW = 4


def _grid_shape(n_panels: int) -> tuple[int, int]:
    """(rows, columns) of a grid of `n_panels` panels, at most PANELS_PER_ROW a row."""
    columns = max(1, min(PANELS_PER_ROW, n_panels))
    return max(1, -(-n_panels // columns)), columns


def _panels(figure: Figure, n_panels: int, **subplot_kw) -> list:
    """`n_panels` axes in a grid, row-major; the unused cells of the last row are hidden."""
    axes = list(figure.subplots(*_grid_shape(n_panels), squeeze=False, **subplot_kw).ravel())
    for unused in axes[n_panels:]:
        unused.set_visible(False)
    return axes[:n_panels]


def method_colours(methods: list[dict]) -> dict[str, str]:
    """A colour per method, the same in every plot: the coordinator blue, the oracle light grey, the rest in turn."""
    others = iter(_OTHER_METHOD_COLOURS * (1 + len(methods) // len(_OTHER_METHOD_COLOURS)))
    return {m["method"]: "tab:blue" if m.get("kind") == "coordinator" else "lightgrey" if m.get("kind") == "oracle"
            else next(others) for m in methods}


def scores_figure(results: dict) -> Figure:
    """One panel per benchmark (in-distribution first): each method's score as a bar with its 95% interval;
    the oracle grey and hatched."""
    benchmarks, methods = ordered_benchmarks(results), ordered_methods(results)
    rows, columns = _grid_shape(len(benchmarks))
    figure = Figure(figsize=(3.4 * columns + 2.2, (0.38 * len(methods) + 1.2) * rows), layout="constrained")
    positions = np.arange(len(methods))[::-1]
    colours = method_colours(methods)
    for ax, benchmark in zip(_panels(figure, len(benchmarks), sharey=True), benchmarks):
        for y, method in zip(positions, methods):
            entry = _score_entry(results, method["method"], benchmark["name"])
            score, ci95 = entry.get("score"), entry.get("ci95")
            if score is None:
                ax.text(0, y, " no score", va="center", fontsize=8, color="dimgrey")
                continue
            oracle = method.get("kind") == "oracle"
            ax.barh(y, score, color=colours[method["method"]], hatch="//" if oracle else None,
                    edgecolor="dimgrey" if oracle else "none")
            error = [[max(0.0, score - ci95[0])], [max(0.0, ci95[1] - score)]] if ci95 else None
            ax.errorbar(score, y, xerr=error, fmt="o", markersize=3, color="black", capsize=3)
        ax.set_xlim(0, benchmark["scale"])
        ax.set_title(f"{benchmark['name']} — {_split_label(benchmark)}\nn={benchmark['n']}, {benchmark['metric']}",
                     fontsize=9)
        ax.set_yticks(positions, [method_label(m) for m in methods], fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    figure.suptitle("Scores with 95% bootstrap intervals (grey hatched: oracle, chosen in hindsight)", fontsize=10)
    return figure


def usage_figure(counts: dict[str, np.ndarray], pool_names: list[str], benchmarks: list[dict]) -> Figure:
    """Per benchmark, a model x role heatmap of the coordinator's turns, each cell annotated with its count."""
    rows, columns = _grid_shape(len(benchmarks))
    figure = Figure(figsize=(3.3 * columns + 1.0, (0.45 * len(pool_names) + 1.4) * rows), layout="constrained")
    for ax, benchmark in zip(_panels(figure, len(benchmarks)), benchmarks):
        table = counts.get(benchmark["name"], np.zeros((len(pool_names), len(ROLE_NAMES)), dtype=int))
        ax.imshow(table, cmap="Blues", vmin=0, vmax=max(1, int(table.max())), aspect="auto")
        for (model, role), count in np.ndenumerate(table):
            ax.text(role, model, str(count), ha="center", va="center", fontsize=9,
                    color="white" if count > table.max() / 2 else "black")
        ax.set_xticks(range(len(ROLE_NAMES)), ROLE_NAMES, fontsize=8)
        ax.set_yticks(range(len(pool_names)), pool_names, fontsize=8)
        ax.set_title(f"{benchmark['name']} ({_split_label(benchmark)}), {int(table.sum())} turns", fontsize=9)
    figure.suptitle("The coordinator's turns: model x role", fontsize=10)
    return figure


FITNESS_CURVES = (("saved_fitness", "saved vector (same episodes each generation)", "-", "o"),
                  ("mean_fitness", "candidates mean", "--", "s"),
                  ("best_candidate_fitness", "best candidate (noisy max)", ":", "^"))
"""(key of a history.json row, legend label, line style, marker)."""


def fitness_figure(history: list[dict]) -> Figure:
    figure = Figure(figsize=(6.4, 3.8), layout="constrained")
    ax = figure.subplots()
    if history:
        generations = [row.get("generation") for row in history]
        for key, label, style, marker in FITNESS_CURVES:
            values = [np.nan if row.get(key) is None else row[key] for row in history]
            ax.plot(generations, values, linestyle=style, marker=marker, label=label)
        ax.set_xticks(generations)
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no generations recorded", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("generation")
    ax.set_ylabel("fitness (shaped reward)")
    ax.set_title("Fitness over generations", fontsize=10)
    ax.grid(alpha=0.3)
    return figure


def score_vs_compute_figure(results: dict) -> Figure:
    """Each method at (tokens per task, average normalised score), per split (tokens per task over that split's
    items): held-out filled circles, in-distribution hollow triangles, one colour per method named in the legend
    (labels beside the points would overlap)."""
    figure = Figure(figsize=(7.6, 4.4), layout="constrained")
    ax = figure.subplots()
    methods = ordered_methods(results)
    colours = method_colours(methods)
    tokens_of = {(m["method"], split): mean_per_item(results, m["method"], "tokens_per_task", split)
                 for m in methods for split in ("in_distribution", "heldout")}
    plotted = [m for m in methods if any(tokens_of[(m["method"], split)] is not None
                                         for split in ("in_distribution", "heldout"))]
    for method in plotted:
        name, colour = method["method"], colours[method["method"]]
        in_distribution, held_out = _average(results, name, "in_distribution"), _average(results, name, "heldout")
        if in_distribution is not None and tokens_of[(name, "in_distribution")] is not None:
            ax.scatter(tokens_of[(name, "in_distribution")], in_distribution, marker="^", facecolors="none",
                       edgecolors=colour, s=70, linewidths=1.5)
        if held_out is not None and tokens_of[(name, "heldout")] is not None:
            ax.scatter(tokens_of[(name, "heldout")], held_out, marker="o", color=colour, edgecolors="dimgrey", s=70)
        ax.scatter([], [], marker="s", color=colour, label=method_label(method))
    ax.scatter([], [], marker="o", color="grey", edgecolors="dimgrey", label="held-out average")
    ax.scatter([], [], marker="^", facecolors="none", edgecolors="grey", linewidths=1.5,
               label="in-distribution average")
    shown = [v for v in tokens_of.values() if v is not None]
    smallest = min(shown, default=0)
    if smallest > 0 and max(shown) > 10 * smallest:
        ax.set_xscale("log")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))
    ax.set_xlabel("tokens per task (mean over the split's items)")
    ax.set_ylabel("average score / scale")
    ax.set_title("Score against compute", fontsize=10)
    ax.grid(alpha=0.3)
    return figure


# ------------------------------------------------------------------------------------------ the report


def write_report(eval_dir: Path, evolve_dir: Path, checkpoint_meta: Path, reports_dir: Path, *,
                 traces_per_benchmark: int = TRACES_PER_BENCHMARK) -> dict[str, Path]:
    """Render the evaluation report from the pipeline's files: reports_dir/summary.md, reports_dir/traces.md and
    reports_dir/plots/*.png. Returns {name: path}: "summary", "traces" and the plot stems of PLOTS."""
    results = _read_json(Path(eval_dir) / "results.json", "evaluate")
    episodes = _read_jsonl(Path(eval_dir) / "episodes.jsonl", "evaluate")
    history = _read_json(Path(evolve_dir) / "history.json", "evolve")
    meta = _read_json(Path(checkpoint_meta), "evolve")

    pool_names = [p["name"] for p in meta["pool"]]
    figures = {"scores": scores_figure(results),
               "usage": usage_figure(usage_counts(episodes, pool_names), pool_names, ordered_benchmarks(results)),
               "fitness": fitness_figure(history),
               "score_vs_compute": score_vs_compute_figure(results)}
    reports_dir = Path(reports_dir)
    plots_dir = reports_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = {"summary": reports_dir / "summary.md", "traces": reports_dir / "traces.md"}
    written["summary"].write_text(summary_markdown(results, meta, history))
    written["traces"].write_text(traces_markdown(results, episodes, traces_per_benchmark))
    for stem, _ in PLOTS:
        written[stem] = plots_dir / f"{stem}.png"
        figures[stem].savefig(written[stem], dpi=DPI, metadata=PNG_METADATA)
    return written
