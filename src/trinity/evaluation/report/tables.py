"""summary.md: the setup, the main table (methods x benchmarks with their averages), compute per task, the paired
comparisons per benchmark and pooled per split with a plain-language reading (written by `report.reading`), the
judge, what training never saw, and the evolution table."""
from __future__ import annotations

from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.evaluation.report.format import (NO_VALUE, SMALL_SAMPLE_MARK, SPLITS, benchmark_columns, cell_of,
                                              fixed, method_label, ordered_benchmarks, ordered_methods,
                                              small_sample_below, score_text)
from trinity.evaluation.report.plots import PLOTS
from trinity.evaluation.report.reading import reading
from trinity.evaluation.results import Benchmark, Cell, Comparison, EvalResults, Judge

OPTIMISER_NAMES = {"sep_cma": "sep-CMA-ES", "reinforce": "REINFORCE", "random_search": "random search"}

PAPER_TRAINING_EPISODES = 60 * 33 * 16
"""The paper's training budget: 60 generations x ~33 candidates x 16 episodes (~31.7k episodes)."""


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _score_cell(entry: Cell, scale: float) -> str:
    text = score_text(entry.score, entry.ci95, scale)
    if entry.score is not None and entry.small_sample:
        text += SMALL_SAMPLE_MARK
    if entry.unscored:
        text += f" ({entry.unscored} unscored)"
    return text


# ------------------------------------------------------------------------------------------ setup


def _param_sentence(meta: CheckpointMeta) -> str:
    rows, d = meta.head_shape
    head = f"head {rows} x {d} = {rows * d} parameters"
    n_svf = meta.svf_params or 0
    if not n_svf:
        return head
    return (f"{head} + {n_svf} SVF scales of encoder block {meta.svf_layer} (one per singular value of "
            f"each of its linear layers) = {meta.n_params} parameters")


def _setup_paragraph(results: EvalResults, meta: CheckpointMeta) -> list[str]:
    benchmarks = ordered_benchmarks(results)
    sizes = "; ".join(
        f"{label}: " + ", ".join(f"{b.name} {b.n}" for b in benchmarks if b.split_key == key)
        for key, label, _ in SPLITS if any(b.split_key == key for b in benchmarks))
    never = results.never_trained_on
    training_items = (len(meta.train_tasks) if meta.train_tasks is not None else never.training_items if never
                      else None)
    training_sources = (f" ({', '.join(never.training_sources)})" if never and never.training_sources else "")
    seeds = ", ".join(f"{name} {value}" for name, value in results.seeds.items()) or "not recorded"
    optimiser = OPTIMISER_NAMES.get(meta.method, meta.method)
    paragraph = (
        f"Pool: {', '.join(meta.pool_names)}. Items per benchmark — {sizes} "
        f"({results.n_items} in all); the coordinator trained on {training_items} items{training_sources}. "
        f"Seeds: {seeds}. "
        f"Checkpoint `{meta.run_fingerprint[:12]}` (code `{meta.code_version[:8]}`): {meta.generations} "
        f"generations of {optimiser} (seed {meta.seed}), encoder `{meta.encoder}`, {_param_sentence(meta)}.")
    lines = [paragraph]
    evaluated = results.checkpoint.run_fingerprint if results.checkpoint else None
    if evaluated and evaluated != meta.run_fingerprint:
        lines += ["", f"**Warning:** results.json was evaluated with checkpoint `{evaluated[:12]}`, not the "
                      f"checkpoint described here (`{meta.run_fingerprint[:12]}`): rerun the evaluate stage."]
    return lines


# ------------------------------------------------------------------------------------------ the main table


def main_table(results: EvalResults) -> list[str]:
    """Methods x benchmarks, in-distribution columns and their average, then held-out and theirs."""
    benchmarks = ordered_benchmarks(results)
    header, group_row, columns = ["method"], [""], []
    for key, label, average_label in SPLITS:
        group = [b for b in benchmarks if b.split_key == key]
        if not group:
            continue
        group_columns = [(b, header_text, turn) for b in group for header_text, turn in benchmark_columns(b)]
        header += [header_text for _, header_text, _ in group_columns] + [average_label]
        group_row += [f"**{label}**"] + [""] * len(group_columns)
        columns += [(b.name, b.scale, turn) for b, _, turn in group_columns] + [(key, None, None)]
    rows = [group_row]
    for method in ordered_methods(results):
        name = method.id
        rows.append([method_label(method)] + [
            fixed(results.average(name, column)) if scale is None
            else _score_cell(cell_of(results, name, column).turn(turn), scale)
            for column, scale, turn in columns])
    return _table(header, rows)


def _judged_note(results: EvalResults) -> str:
    judged = [b for b in ordered_benchmarks(results) if b.judged]
    if not judged:
        return ""
    names = ", ".join(b.name for b in judged)
    return (f" {names}: scored per (item, conversation turn) judgement, as FastChat reports MT-Bench — a column per "
            f"turn (the mean over the items whose judgement of that turn is valid) and `all turns` (the mean over "
            f"every valid judgement, its interval resampling items with their turns); (k unscored) there counts "
            f"judgements that failed or gave no [[rating]] (a turn the method left unanswered scores the scale's "
            f"minimum without a judge call, and counts).")


def _average_basis(results: EvalResults) -> str:
    """Which units the averages rest on, where that is not every unit of a benchmark."""
    partial = [f"{b.name} {b.common_units} of {b.units} {'judgements' if b.judged else 'items'}"
               for b in ordered_benchmarks(results)
               if b.common_units is not None and b.units is not None and b.common_units < b.units]
    return (" Here the units every method scored are: " + "; ".join(partial) + "." if partial
            else " Here every method scored every unit, so each term is the benchmark's cell / scale."
            if any(b.common_units is not None for b in results.benchmarks) else "")


def _main_table_notes(results: EvalResults) -> str:
    bootstrap = results.bootstrap
    resamples = "?" if bootstrap.resamples is None else bootstrap.resamples
    seed = "?" if bootstrap.seed is None else bootstrap.seed
    metrics = ", ".join(f"{b.name} {b.metric}" for b in ordered_benchmarks(results))
    below = small_sample_below(results)
    return (
        f"Cells: mean score [95% interval: percentile bootstrap over items, {resamples} "
        f"resamples, seed {seed}]. Metrics: {metrics}.{_judged_note(results)} The averages "
        f"are means over the split's benchmarks of score / scale (a 1–10 score counts as score / 10), each "
        f"benchmark's term taken over the units every method with a score there scored (items; MT-Bench: (item, "
        f"turn) judgements), so every row's average rests on the same items and turns.{_average_basis(results)} "
        f"{SMALL_SAMPLE_MARK} small sample (n < {below}): the interval is wide and only "
        f"indicative (for judgements: fewer than {below} items). {NO_VALUE}: no scored "
        f"item; (k unscored): items without a score (an outage; MT-Bench: judgements, see above). "
        f"`trinity` = the evolved coordinator (argmax policy); `alone:<member>` = that member as "
        f"Worker for one turn (MT-Bench: both conversation turns); `random-routing` = a uniform random model and "
        f"role each turn (same episode loop, seeded); `oracle:best-single` = per benchmark, the best `alone:` row "
        f"chosen in hindsight (no calls of its own: an upper bound for picking one member, not a method).")


# ------------------------------------------------------------------------------------------ compute


COMPUTE_COLUMNS = (("tokens_per_task", "tokens / task", 0), ("wall_s_per_task", "seconds / task", 1),
                   ("cost_usd_per_task", "cost (USD) / task", 4), ("mean_turns", "mean turns", 2))
"""(field of a score entry, column label, decimals) of the compute table."""


def compute_table(results: EvalResults, split: str | None = None) -> list[str]:
    """Compute per task of each method, averaged over the items of `split`'s benchmarks (None: every benchmark)."""
    header = ["method"] + [label for _, label, _ in COMPUTE_COLUMNS] + ["new LLM calls", "failed calls"]
    rows = []
    for method in ordered_methods(results):
        if method.is_oracle:
            continue
        name = method.id
        cells = [fixed(results.mean_per_item(name, figure, split), digits) for figure, _, digits in COMPUTE_COLUMNS]
        rows.append([method_label(method)] + cells
                    + [str(results.total(name, "calls_new", split)), str(results.total(name, "failed_calls", split))])
    return _table(header, rows)


def _items_phrase(benchmarks: list[Benchmark]) -> str:
    """'math500, mmlu, mbpp: 30 items'."""
    return f"{', '.join(b.name for b in benchmarks)}: {sum(b.n for b in benchmarks)} items"


def compute_section(results: EvalResults) -> list[str]:
    """One compute table per split, under a heading naming the items it averages over."""
    lines = ["## Compute per task", ""]
    for key, label, _ in SPLITS:
        group = results.in_split(key)
        if group:
            lines += [f"### {label.capitalize()} items ({_items_phrase(group)})", ""] + compute_table(results, key)
            lines += [""]
    return lines + [_compute_notes(results), ""]


def _compute_notes(results: EvalResults) -> str:
    minutes = f"{results.wall_s / 60:.1f} min" if results.wall_s is not None else "an unrecorded time"
    pool_calls = "?" if results.pool_calls is None else results.pool_calls
    store_hits = "?" if results.store_hits is None else results.store_hits
    return (
        "Per task = per item of the split's benchmarks named in the heading (every item weighs the same; an MT-Bench "
        "item is its whole conversation, both turns). Tokens: prompt + completion of every pool call of the item "
        "(the MT-Bench judge not included); seconds: the summed latency of those calls as recorded when they were "
        "paid, from a free slot of the pool's limits to the reply (a stored reply keeps its original figure; one "
        "paid before commit 835f365 counts its wait for the slot too); mean turns: pool turns per item; new LLM "
        "calls: calls "
        "not already in the response store when this run asked, summed over the split's benchmarks. "
        f"This evaluation made {pool_calls} new pool calls ({store_hits} "
        f"store hits) in {minutes}. The oracle is left out: it makes no calls of its own.")


# ------------------------------------------------------------------------------------------ paired comparisons


def paired_table(results: EvalResults) -> list[str]:
    rows = []
    for benchmark in ordered_benchmarks(results):
        name, scale = benchmark.name, benchmark.scale
        comparisons = results.comparisons(name)
        if not comparisons:
            rows.append([name, NO_VALUE, NO_VALUE, NO_VALUE, "no paired data"])
        judged = benchmark.judged
        for c in comparisons:
            rows.append(_paired_row(f"{name} all turns" if judged else name, c, scale, judged))
        for turn in range(1, benchmark.turns + 1):
            for c in comparisons:
                if turn in c.turns:
                    rows.append(_paired_row(f"{name} turn {turn}", c.turns[turn], scale, False))
    return _table(["benchmark", "comparison", "difference [95% interval]", "n", "outcome"], rows)


def _n_text(c: Comparison, units: str | None) -> str:
    """'30†', or for units other than items '7 judgements, 4 items†'."""
    mark = SMALL_SAMPLE_MARK if c.small_sample else ""
    if units is None or c.items is None or c.items == c.n:
        return f"{c.n}{mark}" if units is None else f"{c.n} items{mark}"
    return f"{c.n} {units}, {c.items} items{mark}"


def _outcome_text(c: Comparison) -> str:
    return f"**{c.outcome}**" if c.outcome == "loses" else c.outcome


def _paired_row(name: str, c: Comparison, scale: float, judged: bool) -> list[str]:
    return [name, f"{c.a} − {c.b} ({c.label})", score_text(c.diff, c.ci95, scale, signed=True),
            _n_text(c, "judgements") if judged else _n_text(c, None), _outcome_text(c)]


def pooled_table(results: EvalResults) -> list[str]:
    """Per split: the coordinator minus one best member, the learned router and random routing over every unit both
    scored."""
    rows = []
    for key, label, _ in SPLITS:
        entry = results.pooled_paired.get(key)
        if not entry:
            continue
        names = []
        for n in entry.benchmarks:
            benchmark = results.benchmark(n)
            names.append(f"{n} as (item, turn) / {benchmark.scale:g}" if benchmark is not None and benchmark.judged
                         else n)
        where = f"{label} ({', '.join(names)})"
        if not entry.comparisons:
            rows.append([where, NO_VALUE, NO_VALUE, NO_VALUE, NO_VALUE, "no paired data"])
        for c in entry.comparisons:
            better = "?" if c.a_better is None else c.a_better
            worse = "?" if c.b_better is None else c.b_better
            rows.append([where, f"{c.a} − {c.b} ({c.label})", score_text(c.diff, c.ci95, 1.0, signed=True),
                         _n_text(c, "units"), f"{better} / {worse}", _outcome_text(c)])
    return _table(["split (benchmarks pooled)", "comparison", "difference [95% interval]", "n",
                   "units trinity higher / lower", "outcome"], rows)


def _pooled_scores_sentence(results: EvalResults) -> str:
    sentences = []
    for key, label, _ in SPLITS:
        entry = results.pooled_paired.get(key)
        if not entry:
            continue
        scores = [(m.id, entry.scores.get(m.id)) for m in ordered_methods(results) if not m.is_oracle]
        scores = ", ".join(f"`{m}` {v:.3f}" for m, v in scores if v is not None)
        if scores:
            sentences.append(f"{label.capitalize()} pooled scores over the {entry.common_units} units every "
                             f"method scored (of {entry.units}): {scores}.")
    return " ".join(sentences)


def pooled_section(results: EvalResults) -> list[str]:
    if not results.pooled_paired:
        return []
    judged = [b.name for b in ordered_benchmarks(results) if b.judged]
    per_turn = (f" {', '.join(judged)} per turn: the `turn k` rows of the per-benchmark table above." if judged else "")
    return ["## Pooled paired comparisons, per split", "",
            "Per split, every item of the split's benchmarks that both methods scored, pooled on one scale (score / "
            "scale: an accuracy as is, an MT-Bench judgement / 10, each (item, turn) judgement one unit), the "
            "coordinator's score minus another method's; the bootstrap resamples items (an MT-Bench item with its "
            "turns). The best single member here is one member for the whole split: the `alone:` row with the best "
            "pooled score on the units every method scored, chosen in hindsight (not the per-benchmark picks "
            "mixed). n: the units compared (and the items they come from, where an item gives more than one); the "
            "outcome as above." + per_turn, ""] + pooled_table(results) + ["", _pooled_scores_sentence(results), ""]


# ------------------------------------------------------------------------------------------ judge, training, evolution


def _judge_section(judge: Judge | None) -> list[str]:
    if judge is None:
        return []
    membership = "a member of the pool it judges" if judge.in_pool else "not in the pool"
    model_id = "?" if judge.model_id is None else judge.model_id
    return ["## MT-Bench judge", "",
            f"Judge: `{judge.name}` (`{model_id}`), {membership}. "
            f"Verdicts: {judge.verdicts or 0}; unparseable (no [[rating]]): {judge.unparseable or 0}; "
            f"failed calls: {judge.failed or 0}." + (f" Note: {judge.note}" if judge.note else ""), ""]


def _never_trained_on_section(results: EvalResults) -> list[str]:
    never = results.never_trained_on
    if not never:
        return []
    items = "?" if never.items is None else never.items
    training_items = "?" if never.training_items is None else never.training_items
    return ["## Never seen in training", "",
            f"- held-out benchmarks: {', '.join(never.benchmarks or ()) or 'none'} ({items} items)",
            f"- training sources: {', '.join(never.training_sources or ())} ({training_items} items)",
            f"- check: {'not recorded' if never.check is None else never.check}", ""]


def _history_cell(row: dict, key: str, digits: int) -> str:
    value = row.get(key)
    if value is None:
        return NO_VALUE
    return str(value) if digits == 0 else f"{value:.{digits}f}"


EVOLUTION_COLUMNS = (("generation", "generation", 0), ("saved_fitness", "CMA mean fitness", 3),
                     ("saved_accuracy", "CMA mean accuracy", 3), ("mean_fitness", "candidates mean", 3),
                     ("best_candidate_fitness", "best candidate", 3), ("sigma", "sigma", 4),
                     ("validation_mean", "mean on validation", 3), ("validation_best_candidate",
                                                                   "best candidate on validation", 3),
                     ("validation_selected", "saved so far, validation", 3),
                     ("validation_best_member", "best member, validation", 3),
                     ("calls_made", "new LLM calls", 0), ("store_hits", "store hits", 0))
"""(key of a history.json row, column label, decimals; 0 = printed as is)."""


def _evolution_section(meta: CheckpointMeta, history: list[dict]) -> list[str]:
    lines = ["## Evolution", "",
             f"CMA mean = the optimiser's answer after that generation (the distribution mean), scored on the same "
             f"{'?' if meta.saved_fitness_episodes is None else meta.saved_fitness_episodes} sampled training episodes every generation (the training "
             f"curve); with a validation slice, the run saves the best vector there instead (below). Candidates = that generation's sampled population on its minibatch; their best is a "
             f"noisy maximum, not the saved vector's score.", ""]
    sel = meta.selection
    if sel:
        verdict = ("the coordinator beats it" if sel.beats_best_member else
                   "**the coordinator does not beat it** (equal or worse on validation)")
        lines += [f"Selection on validation ({sel.items} items of the training benchmarks, in neither training nor "
                  f"evaluation; start: {sel.warm_start}): the saved coordinator is the "
                  f"{sel.selected_from} vector, {sel.selected:.3f} on validation; the best member alone "
                  f"({sel.best_member}) scores {sel.best_member_score:.3f} there: {verdict}. Members alone: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in sel.members.items()) + ".", ""]
    if not history:
        return lines + ["No generations recorded (history.json is empty).", ""]
    columns = [c for c in EVOLUTION_COLUMNS  # validation columns only for a run with a validation slice
               if not c[0].startswith("validation_") or any(row.get(c[0]) is not None for row in history)]
    lines += _table([label for _, label, _ in columns],
                    [[_history_cell(row, key, digits) for key, _, digits in columns] for row in history])
    episodes = sum(int(row.get("episodes") or 0) for row in history)
    if episodes:
        lines += ["", f"Training played {episodes:,} episodes ({len(history)} generations); the paper trains on "
                      f"about {PAPER_TRAINING_EPISODES:,} (60 generations x ~33 candidates x 16 tasks). To train "
                      f"further, raise `evolve.generations` (a finished run carries on from its last generation) "
                      f"and `evolve.episodes_per_candidate` / `data.train`."]
    return lines + [""]


# ------------------------------------------------------------------------------------------ summary.md


def no_answer_shares(episodes: list[dict]) -> dict[str, dict[str, tuple[int, int]]]:
    """{method: {benchmark: (items with no answer returned, items scored)}} from data/eval/episodes.jsonl rows;
    items an outage left unscored are not counted."""
    out: dict[str, dict[str, list[int]]] = {}
    for row in episodes:
        if (row.get("error") or "").startswith("outage: "):
            continue
        cell = out.setdefault(row["method"], {}).setdefault(row["benchmark"], [0, 0])
        cell[0] += row.get("answer") is None
        cell[1] += 1
    return {m: {b: (c[0], c[1]) for b, c in per.items()} for m, per in out.items()}


def no_answer_section(results: EvalResults, episodes: list[dict]) -> list[str]:
    shares = no_answer_shares(episodes)
    benchmarks = [b.name for b in ordered_benchmarks(results)]
    lines = ["## No answer returned", "",
             "Per method and benchmark, the share of items whose episode returned no answer (no Worker reply "
             "succeeded); a no-answer item scores 0.", ""]
    rows = [[m] + [(f"{per[b][0] / per[b][1]:.0%} ({per[b][0]}/{per[b][1]})" if b in per and per[b][1] else NO_VALUE)
                   for b in benchmarks] for m, per in shares.items()]
    return lines + _table(["method", *benchmarks], rows) + [""]


def summary_markdown(results: EvalResults, meta: CheckpointMeta, history: list[dict], episodes: list[dict] | None = None) -> str:
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
    if episodes is not None:
        lines += no_answer_section(results, episodes)
    lines += _judge_section(results.judge)
    lines += _never_trained_on_section(results)
    lines += _evolution_section(meta, history)
    lines += ["## Plots and traces", ""]
    lines += [f"![{caption}](plots/{stem}.png)" for stem, caption in PLOTS]
    lines += ["", "Episode traces of the coordinator, a few per benchmark: [traces.md](traces.md)."]
    return "\n".join(lines) + "\n"
