"""The report renders from files only: a small, schema-complete set of pipeline outputs (no models) in, and
summary.md, traces.md and PNG plots out, with the numbers, markers and reading that the files imply."""
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.evaluation import report
from trinity.evaluation.report import format as report_format, plots, reading as report_reading, tables, traces
from trinity.evaluation.results import EvalResults

POOL = ["alpha", "beta"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

BENCHMARKS = [
    {"name": "math500", "split": "in_distribution", "metric": "accuracy", "scale": 1.0, "n": 3, "unit": "item",
     "units": 3, "common_units": 3},
    {"name": "aime", "split": "heldout", "metric": "accuracy", "scale": 1.0, "n": 2, "unit": "item", "units": 2,
     "common_units": 2},
    {"name": "mmlu", "split": "in_distribution", "metric": "accuracy", "scale": 1.0, "n": 2, "unit": "item",
     "units": 2, "common_units": 2},
    {"name": "mt_bench", "split": "heldout", "metric": "judge score (1-10)", "scale": 10.0, "n": 2,
     "unit": "judgement", "turns": 2, "units": 4, "common_units": 3},
]
"""Deliberately interleaved: the report must put in-distribution columns first."""

METHODS = [
    {"method": "oracle:best-single", "kind": "oracle",
     "picks": {"math500": "alone:alpha", "mmlu": "alone:beta", "aime": "alone:alpha", "mt_bench": "alone:alpha"}},
    {"method": "trinity", "kind": "coordinator"},
    {"method": "alone:alpha", "kind": "single", "model": "alpha"},
    {"method": "alone:beta", "kind": "single", "model": "beta"},
    {"method": "random-routing", "kind": "baseline"},
]
"""Deliberately out of order: the report must put trinity first and the oracle last."""

SCORES = {  # (score, ci95) per method and benchmark; None = nothing scored
    "trinity": {"math500": (2 / 3, [0.0, 1.0]), "mmlu": (0.5, [0.0, 1.0]), "aime": (0.0, [0.0, 0.0]),
                "mt_bench": (6.5, [5.0, 8.0])},
    "alone:alpha": {"math500": (1 / 3, [0.0, 1.0]), "mmlu": (0.0, [0.0, 0.0]), "aime": (1.0, [1.0, 1.0]),
                    "mt_bench": (7.0, [6.0, 8.0])},
    "alone:beta": {"math500": (0.0, [0.0, 0.0]), "mmlu": (0.5, [0.0, 1.0]), "aime": None,
                   "mt_bench": (4.0, [3.0, 5.0])},
    "random-routing": {"math500": (0.0, [0.0, 0.0]), "mmlu": (0.5, [0.0, 1.0]), "aime": (0.5, [0.0, 1.0]),
                       "mt_bench": (5.0, [4.0, 6.0])},
}
SCORES["oracle:best-single"] = {"math500": SCORES["alone:alpha"]["math500"], "mmlu": SCORES["alone:beta"]["mmlu"],
                                "aime": SCORES["alone:alpha"]["aime"], "mt_bench": SCORES["alone:alpha"]["mt_bench"]}

TRINITY_TURNS = {  # per benchmark, per item: (model, role, verdict) of each coordinator turn
    "math500": [[("alpha", "worker", None), ("beta", "verifier", "ACCEPT")],
                [("beta", "thinker", None), ("alpha", "worker", None), ("alpha", "worker", None)],
                [("alpha", "worker", None)]],
    "mmlu": [[("beta", "worker", None)], [("beta", "worker", None), ("beta", "verifier", "REJECT")]],
    "aime": [[("alpha", "thinker", None), ("beta", "worker", None)], [("beta", "worker", None)]],
    "mt_bench": [[("alpha", "worker", None), ("alpha", "worker", None)],
                 [("beta", "worker", None), ("beta", "worker", None)]],
}
POOLED_BEST = "best single member on the split, in hindsight"
TRINITY_ITEM_SCORES = {"math500": [1.0, 1.0, 0.0], "mmlu": [1.0, 0.0], "aime": [0.0, 0.0], "mt_bench": [8.0, 5.0]}


def _score_entry(score_ci, n: int, turns: int = 0) -> dict:
    score, ci95 = score_ci if score_ci else (None, None)
    scored = n if score_ci else 0
    entry = {"score": score, "ci95": ci95, "n": scored, "unscored": n - scored, "small_sample": scored < 30,
             "tokens_per_task": 300.0, "wall_s_per_task": 4.0, "cost_usd_per_task": 0.0, "mean_turns": 1.5,
             "calls_new": 2, "failed_calls": 0}
    if turns:  # a judged benchmark: n counts (item, turn) judgements; turn 1 scores +0.5, turn 2 -0.5
        entry |= {"n": scored * turns, "unscored": (n - scored) * turns, "items": scored, "turns": {
            str(k): {"score": None if score is None else score + (0.5 if k == 1 else -0.5),
                     "ci95": None if score is None else [score - 1.0, score + 1.0], "n": scored,
                     "unscored": n - scored, "small_sample": True} for k in range(1, turns + 1)}}
    return entry


def _results() -> dict:
    n_items = {b["name"]: b["n"] for b in BENCHMARKS}
    turns = {b["name"]: b.get("turns", 0) for b in BENCHMARKS}
    scores = {method: {bench: _score_entry(sc, n_items[bench], turns[bench]) for bench, sc in per_bench.items()}
              for method, per_bench in SCORES.items()}
    scores["trinity"]["math500"]["tokens_per_task"] = 900.0

    def pair(b, label, diff, ci, outcome, n):
        return {"a": "trinity", "b": b, "label": label, "diff": diff, "ci95": ci, "n": n, "small_sample": True,
                "outcome": outcome}

    def pooled(b, label, diff, ci, outcome, n, items, better, worse):
        return pair(b, label, diff, ci, outcome, n) | {"items": items, "a_better": better, "b_better": worse}

    return {
        "n_items": sum(n_items.values()), "benchmarks": BENCHMARKS, "methods": METHODS, "scores": scores,
        "averages": {"trinity": {"in_distribution": 0.583, "heldout": 0.325},
                     "alone:alpha": {"in_distribution": 0.167, "heldout": 0.85},
                     "alone:beta": {"in_distribution": 0.25, "heldout": 0.4},
                     "random-routing": {"in_distribution": 0.25, "heldout": 0.5},
                     "oracle:best-single": {"in_distribution": 0.417, "heldout": 0.85}},
        "paired": {
            "math500": [pair("alone:alpha", "best single member", 0.667, [0.333, 1.0], "wins", 3),
                        pair("random-routing", "random routing", 0.667, [0.333, 1.0], "wins", 3)],
            "mmlu": [pair("alone:beta", "best single member", 0.0, [-1.0, 1.0], "ties", 2),
                     pair("random-routing", "random routing", 0.0, [-1.0, 1.0], "ties", 2)],
            "aime": [pair("alone:alpha", "best single member", -1.0, [-1.0, -1.0], "loses", 2),
                     pair("random-routing", "random routing", -0.5, [-1.0, 0.0], "ties", 2)],
            # mt_bench: no paired entries (the report must say so, not crash)
        },
        "pooled_paired": {
            "in_distribution": {
                "benchmarks": ["math500", "mmlu"], "items": 5, "units": 5, "common_units": 5,
                "scores": {"trinity": 0.6, "alone:alpha": 0.2, "alone:beta": 0.2, "random-routing": 0.2},
                "best_single": "alone:alpha",
                "comparisons": [pooled("alone:alpha", POOLED_BEST, 0.4, [0.0, 0.8], "ties", 5, 5, 2, 0),
                                pooled("random-routing", "random routing", 0.4, [0.2, 0.8], "wins", 5, 5, 2, 0)]},
            "heldout": {
                "benchmarks": ["aime", "mt_bench"], "items": 4, "units": 6, "common_units": 5,
                "scores": {"trinity": 0.5, "alone:alpha": 0.8, "alone:beta": None, "random-routing": 0.4},
                "best_single": "alone:alpha",
                "comparisons": [pooled("alone:alpha", POOLED_BEST, -0.3, [-0.6, 0.0], "too few items", 5, 4, 1, 3),
                                pooled("random-routing", "random routing", 0.1, [-0.2, 0.4], "too few items", 6,
                                       4, 2, 1)]},
        },
        "judge": {"name": "beta", "model_id": "gguf:beta@sha256:00", "in_pool": True, "verdicts": 16,
                  "unparseable": 3, "failed": 1, "note": "a 1.5B judge is weak: read MT-Bench as indicative"},
        "bootstrap": {"resamples": 2000, "seed": 0, "level": 0.95, "small_sample_below": 30},
        "seeds": {"data": 0, "evolve": 0, "evaluate": 0, "random_routing": 0},
        "checkpoint": {"run_fingerprint": "f" * 64, "code_version": "c" * 16, "method": "sep_cma",
                       "generations": 2, "params_hash": "p" * 64},
        "pool": [{"name": name, "model_id": f"gguf:{name}"} for name in POOL],
        "never_trained_on": {"benchmarks": ["aime", "mt_bench"], "items": 4, "training_sources": ["math500", "mmlu"],
                             "training_items": 6, "check": "no held-out source, task id or normalised prompt text "
                                                           "in training"},
        "pool_calls": 40, "store_hits": 12, "wall_s": 90.0,
    }


def _turn(model: str, role: str, verdict, conversation_turn: int, text: str) -> dict:
    return {"conversation_turn": conversation_turn, "model": model, "role": role, "text": text, "ok": True,
            "verdict": verdict, "prompt_tokens": 100, "completion_tokens": 20, "latency_s": 1.5}


def _episodes() -> list[dict]:
    rows = []
    split = {b["name"]: b["split"] for b in BENCHMARKS}
    for bench, items in TRINITY_TURNS.items():
        for i, turns in enumerate(items):
            mt = bench == "mt_bench"
            rows.append({
                "method": "trinity", "benchmark": bench, "split": split[bench], "task_id": f"{bench}/item{i}",
                "score": TRINITY_ITEM_SCORES[bench][i], "answer": "42",
                "turns": [_turn(m, r, v, (k + 1) if mt else 1, f"{bench} item {i} turn {k} says ```code``` here")
                          for k, (m, r, v) in enumerate(turns)],
                "verifier_first": False,
                "judge": [{"turn": 1, "score": 7.0, "error": None, "prompt": "single-v1", "raw": "[[7]]"},
                          {"turn": 2, "score": None, "error": "no [[rating]]", "prompt": "single-v1", "raw": "?"}]
                if mt else [],
                "tokens": 120 * len(turns), "latency_s": 1.5 * len(turns), "cost_usd": 0.0,
                "path": [[str(POOL.index(m)), r] for m, r, _ in turns], "error": None})
            rows.append({**rows[-1], "method": "alone:alpha", "turns": [_turn("alpha", "worker", None, 1, "x")]})
    return rows


def _history() -> list[dict]:
    return [{"generation": g, "saved_fitness": 0.2 + 0.1 * g, "saved_accuracy": 0.1 * g, "mean_fitness": 0.1,
             "best_candidate_fitness": 0.5, "sigma": 0.03, "calls_made": 10 - g, "store_hits": 5 + g,
             "episodes": 42, "wall_s": 60.0, "model_usage": {"alpha": 3, "beta": 4},
             "role_usage": {"worker": 5, "thinker": 1, "verifier": 1}} for g in range(2)]


def _meta() -> dict:
    return {"pool": [{"name": name, "model_id": f"gguf:{name}"} for name in POOL], "encoder": "enc@sha256:0",
            "head_shape": [5, 64], "n_params": 320, "svf_params": 0, "svf_layer": None, "method": "sep_cma",
            "seed": 0, "generations": 2, "run_fingerprint": "f" * 64, "code_version": "c" * 16,
            "saved_fitness_episodes": 12, "train_tasks": [f"math500/t{i}" for i in range(6)]}


def _write_inputs(root: Path, results=None, history=None) -> dict[str, Path]:
    dirs = {"eval_dir": root / "data/eval", "evolve_dir": root / "data/evolve",
            "checkpoint_meta": root / "data/checkpoints/coordinator.json", "reports_dir": root / "reports"}
    for d in ("eval_dir", "evolve_dir"):
        dirs[d].mkdir(parents=True)
    dirs["checkpoint_meta"].parent.mkdir(parents=True)
    (dirs["eval_dir"] / "results.json").write_text(json.dumps(results or _results()))
    (dirs["eval_dir"] / "episodes.jsonl").write_text("\n".join(json.dumps(r) for r in _episodes()) + "\n")
    (dirs["evolve_dir"] / "history.json").write_text(json.dumps(_history() if history is None else history))
    dirs["checkpoint_meta"].write_text(json.dumps(_meta()))
    return dirs


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    """The report of the synthetic inputs, rendered once for the tests that only read it."""
    return report.write_report(**_write_inputs(tmp_path_factory.mktemp("report")))


def _main_table(summary: str) -> list[str]:
    lines = summary.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method | math500"))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[start:end]


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def test_main_table_puts_in_distribution_columns_then_held_out_each_with_its_average(rendered):
    table = _main_table(rendered["summary"].read_text())
    assert _cells(table[0]) == ["method", "math500 (n=3)", "mmlu (n=2)", "avg (in-dist.)", "aime (n=2)",
                                "mt_bench turn 1 (n=2, 1–10)", "mt_bench turn 2 (n=2, 1–10)",
                                "mt_bench all turns (n=2x2, 1–10)", "avg (held-out)"]
    assert _cells(table[2]) == ["", "**in-distribution**", "", "", "**held-out**", "", "", "", ""]
    methods = [_cells(line)[0] for line in table[3:]]
    assert methods == ["trinity", "alone:alpha", "alone:beta", "random-routing",
                       "oracle:best-single (oracle, hindsight)"]


def test_cells_show_score_interval_small_sample_marker_and_a_dash_for_no_score(rendered):
    summary = rendered["summary"].read_text()
    rows = {_cells(line)[0]: _cells(line) for line in _main_table(summary)[3:]}
    assert rows["trinity"][1] == "0.667 [0.000, 1.000]†"
    assert rows["trinity"][3] == "0.583"
    assert rows["trinity"][7] == "6.50 [5.0, 8.0]†"  # all turns
    assert rows["alone:beta"][4] == "— (2 unscored)"
    assert "† small sample (n < 30): the interval is wide and only indicative" in summary


def test_compute_tables_average_per_task_figures_over_each_splits_items(rendered):
    summary = rendered["summary"].read_text()
    compute = summary.split("## Compute per task")[1].split("## Paired")[0]
    in_distribution = compute.split("### In-distribution items (math500, mmlu: 5 items)")[1].split("###")[0]
    held_out = compute.split("### Held-out items (aime, mt_bench: 4 items)")[1]
    row = next(line for line in in_distribution.splitlines() if line.startswith("| trinity |"))
    # tokens: (3 items x 900 + 2 items x 300) / 5 items; new calls: 2 per benchmark, summed over the split
    assert _cells(row) == ["trinity", "660", "4.0", "0.0000", "1.50", "4", "0"]
    row = next(line for line in held_out.splitlines() if line.startswith("| trinity |"))
    assert _cells(row) == ["trinity", "300", "4.0", "0.0000", "1.50", "4", "0"]
    assert "oracle" not in in_distribution and "oracle" not in held_out.split("\n\n")[1]  # no calls of its own


def test_paired_table_and_reading_say_where_the_coordinator_wins_and_loses(rendered):
    summary = rendered["summary"].read_text()
    assert ("| aime | trinity − alone:alpha (best single member) | -1.000 [-1.000, -1.000] | 2† | **loses** |"
            in summary)
    assert "| mt_bench | — | — | — | no paired data |" in summary
    reading = next(line for line in summary.splitlines() if line.startswith("**Reading it.**"))
    against_best = reading.split("Against the best single member")[1].split("Against the random routing")[0]
    assert "wins on math500" in against_best and "**loses on aime (-1.000 vs `alone:alpha`)**" in against_best
    assert "ties on mmlu" in against_best
    against_random = reading.split("Against the random routing")[1].split("On the")[0]
    assert "wins on math500" in against_random and "loses on none" in against_random
    assert "held-out average the coordinator scores 0.325: below `alone:alpha` (0.850" in reading
    assert "above `alone:beta` (0.250" in reading  # the in-distribution best member alone is another member


def test_summary_renders_judge_never_trained_on_evolution_and_links(rendered):
    summary = rendered["summary"].read_text()
    assert "## MT-Bench judge" in summary and "a 1.5B judge is weak" in summary
    assert "Verdicts: 16; unparseable (no [[rating]]): 3; failed calls: 1." in summary
    assert "- held-out benchmarks: aime, mt_bench (4 items)" in summary
    assert "| 1 | 0.300 | 0.100 | 0.100 | 0.500 | 0.0300 | 9 | 6 |" in summary
    assert "Training played 84 episodes (2 generations)" in summary
    assert "Checkpoint `ffffffffffff` (code `cccccccc`)" in summary and "head 5 x 64 = 320 parameters" in summary
    for stem in ("scores", "usage", "fitness", "score_vs_compute"):
        assert f"(plots/{stem}.png)" in summary
    assert "[traces.md](traces.md)" in summary


def test_plots_are_real_pngs(rendered):
    for stem in ("scores", "usage", "fitness", "score_vs_compute"):
        path = rendered[stem]
        assert path.parent.name == "plots" and path.read_bytes().startswith(PNG_SIGNATURE)
        height, width = imread(path).shape[:2]
        assert height > 100 and width > 100


def test_usage_counts_are_the_coordinators_turns_per_benchmark_model_and_role():
    episodes = _episodes()
    counts = plots.usage_counts(episodes, POOL)
    assert sorted(counts) == sorted(TRINITY_TURNS)
    for bench, items in TRINITY_TURNS.items():
        expected = Counter((m, r) for turns in items for m, r, _ in turns)
        for (model, role), count in np.ndenumerate(counts[bench]):
            assert count == expected[(POOL[model], plots.ROLE_NAMES[role])]
    math500 = counts["math500"]
    assert math500[POOL.index("alpha"), plots.ROLE_NAMES.index("worker")] == 4  # alone:alpha rows not counted
    with pytest.raises(ValueError, match="gamma"):
        plots.usage_counts([{**episodes[0], "turns": [_turn("gamma", "worker", None, 1, "")]}], POOL)


def test_usage_heatmap_annotates_the_counts():
    counts = plots.usage_counts(_episodes(), POOL)
    figure = plots.usage_figure(counts, POOL, report_format.ordered_benchmarks(EvalResults.from_dict(_results())))
    math500 = next(ax for ax in figure.axes if ax.get_title().startswith("math500"))
    assert [int(t.get_text()) for t in math500.texts] == counts["math500"].ravel().tolist()


def test_traces_show_turns_with_model_role_verdict_and_include_a_failing_item(rendered):
    traces = rendered["traces"].read_text()
    assert "**turn 2** · `beta` as verifier · verdict **ACCEPT** · 120 tokens · 1.5 s" in traces
    assert "`math500/item2` · score 0.000 · **failing**" in traces  # the only failing math500 item, third in file
    assert "`math500/item0`" in traces and "`math500/item1`" not in traces
    assert "conversation turn 2" in traces and "Judge: conversation turn 1: 7; conversation turn 2: unscored" in traces
    assert "````text\nmath500 item 0 turn 0 says ```code``` here\n````" in traces  # the fence outlasts the text's


def test_long_turn_text_is_clipped():
    row = _episodes()[0]
    row["turns"][0]["text"] = "y" * 5000
    text = traces.traces_markdown(EvalResults.from_dict(_results()), [row])
    assert "y" * traces.TRACE_TEXT_CHARS + " … [clipped: 5000 characters in all]" in text
    assert "y" * (traces.TRACE_TEXT_CHARS + 1) not in text


def test_rerun_gives_identical_bytes(tmp_path):
    inputs = _write_inputs(tmp_path)
    first = {name: path.read_bytes() for name, path in report.write_report(**inputs).items()}
    second = {name: path.read_bytes() for name, path in report.write_report(**inputs).items()}
    assert first == second


def test_optional_parts_missing_do_not_crash(tmp_path):
    results = _results()
    results.update(judge=None, paired={})
    del results["never_trained_on"]
    written = report.write_report(**_write_inputs(tmp_path, results=results, history=[]))
    summary = written["summary"].read_text()
    assert "## MT-Bench judge" not in summary and "No generations recorded" in summary
    assert "There is no paired comparison to read." in summary
    assert written["fitness"].read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.parametrize("missing,stage", [("data/eval/results.json", "evaluate"),
                                           ("data/eval/episodes.jsonl", "evaluate"),
                                           ("data/evolve/history.json", "evolve"),
                                           ("data/checkpoints/coordinator.json", "evolve")])
def test_a_missing_input_names_the_file_and_the_stage_that_writes_it(tmp_path, missing, stage):
    inputs = _write_inputs(tmp_path)
    (tmp_path / missing).unlink()
    with pytest.raises(FileNotFoundError, match=rf"{Path(missing).name}.*`{stage}` stage"):
        report.write_report(**inputs)
    assert not inputs["reports_dir"].exists()  # nothing half-written


def test_reading_calls_no_outcome_on_too_few_items_but_says_which_way_the_estimate_points():
    results = {
        "benchmarks": [{"name": "aime", "split": "heldout", "metric": "accuracy", "scale": 1.0, "n": 2},
                       {"name": "gpqa", "split": "heldout", "metric": "accuracy", "scale": 1.0, "n": 2}],
        "methods": [{"method": "trinity", "kind": "coordinator"}], "averages": {}, "scores": {},
        "paired": {"aime": [{"a": "trinity", "b": "alone:x", "label": "best single member", "diff": -0.5,
                             "ci95": [-1.0, 0.0], "n": 2, "small_sample": True, "outcome": "too few items"}],
                   "gpqa": [{"a": "trinity", "b": "alone:x", "label": "best single member", "diff": 0.5,
                             "ci95": [0.0, 1.0], "n": 2, "small_sample": True, "outcome": "too few items"}]},
        "bootstrap": {"small_sample_below": 30}}
    text = report_reading.reading(EvalResults.from_dict(results))
    assert ("Against the best single member, on the point estimate only (too few paired items to call a win or a "
            "loss), the coordinator is ahead on gpqa (+0.500); **is behind** on aime (-0.500).") in text
    assert "loses on none" not in text and "fewer than 5 paired items none is called" in text


def test_mt_bench_renders_a_cell_per_turn_and_all_turns_and_its_paired_rows_per_turn():
    results = _results()
    comparison = {"a": "trinity", "b": "alone:alpha", "label": "best single member", "small_sample": True,
                  "outcome": "too few items"}
    results["paired"]["mt_bench"] = [comparison | {
        "diff": -0.5, "ci95": [-2.0, 1.0], "n": 3, "items": 2, "turns": {
            "1": comparison | {"diff": 0.0, "ci95": [-1.0, 1.0], "n": 2, "items": 2},
            "2": comparison | {"diff": -1.5, "ci95": [-1.5, -1.5], "n": 1, "items": 1}}}]
    summary = tables.summary_markdown(EvalResults.from_dict(results), CheckpointMeta.model_validate(_meta()),
                                      _history())
    table = _main_table(summary)
    header = _cells(table[0])
    rows = {_cells(line)[0]: _cells(line) for line in table[3:]}
    turn1, turn2, overall = (header.index(h) for h in ("mt_bench turn 1 (n=2, 1–10)", "mt_bench turn 2 (n=2, 1–10)",
                                                       "mt_bench all turns (n=2x2, 1–10)"))
    assert (rows["trinity"][turn1], rows["trinity"][turn2], rows["trinity"][overall]) == (
        "7.00 [5.5, 7.5]†", "6.00 [5.5, 7.5]†", "6.50 [5.0, 8.0]†")
    assert "Here the units every method scored are: mt_bench 3 of 4 judgements." in summary
    assert ("| mt_bench all turns | trinity − alone:alpha (best single member) | -0.50 [-2.0, 1.0] | "
            "3 judgements, 2 items† | too few items |") in summary
    assert "| mt_bench turn 1 | trinity − alone:alpha (best single member) | +0.00 [-1.0, 1.0] | 2† |" in summary
    assert "| mt_bench turn 2 | trinity − alone:alpha (best single member) | -1.50 [-1.5, -1.5] | 1† |" in summary


def test_the_pooled_paired_section_names_the_split_what_it_pools_and_n(rendered):
    summary = rendered["summary"].read_text()
    section = summary.split("## Pooled paired comparisons, per split")[1].split("\n## ")[0]
    assert "one member for the whole split" in section and "an MT-Bench judgement / 10" in section
    assert ("| in-distribution (math500, mmlu) | trinity − alone:alpha (best single member on the split, in "
            "hindsight) | +0.400 [0.000, 0.800] | 5 items† | 2 / 0 | ties |") in section
    assert ("| held-out (aime, mt_bench as (item, turn) / 10) | trinity − random-routing (random routing) | "
            "+0.100 [-0.200, 0.400] | 6 units, 4 items† | 2 / 1 | too few items |") in section
    assert ("Held-out pooled scores over the 5 units every method scored (of 6): `trinity` 0.500, `alone:alpha` "
            "0.800, `random-routing` 0.400.") in section


def test_no_answer_shares_count_items_without_an_answer_per_method_and_benchmark(rendered):
    rows = [{"method": "trinity", "benchmark": "math500", "answer": None, "error": None},
            {"method": "trinity", "benchmark": "math500", "answer": "4", "error": None},
            {"method": "trinity", "benchmark": "math500", "answer": None, "error": "outage: 503"},  # unscored
            {"method": "alone:a", "benchmark": "mbpp", "answer": "x", "error": None}]
    assert tables.no_answer_shares(rows) == {"trinity": {"math500": (1, 2)}, "alone:a": {"mbpp": (0, 1)}}
    assert "## No answer returned" in rendered["summary"].read_text()
