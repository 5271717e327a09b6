"""The evaluation: every method on the same items, MT-Bench played turn by turn and judged through the store,
unscored items counted (never guessed), the oracle row, paired intervals; the held-out promise; bad input
named before any model is called. Scripted pool members (the protocol is under test, not model quality)."""
import json

import numpy as np
import pytest
import yaml

from fixtures.scripted_pool import HashEncoder, ScriptedModel, role_of
from trinity.stages import common as stage_common, paths as stage_paths, run_stage
from trinity.config import ConfigError, DataSettings, PoolMember, Settings, load_settings
from trinity.coordinator.episode import StateCache
from trinity.data.splits import ContaminationError, build_all_splits, save_tasks
from trinity.evaluation.items import ORACLE
from trinity.evaluation.run import evaluate
from trinity.evaluation.summary import summarise
from trinity.grading.judge import MTBenchJudge, judge_member, load_judge_prompts
from trinity.pool.runtime import Pool
from trinity.records import ChatResponse, Task
from trinity.evaluation.stats import bootstrap_mean, compare, paired_bootstrap
from trinity.store import Store

MATH = [Task(id=f"m/{i}", source="math500", prompt=(f"What is {i}+1?",), grader="math", answer=str(i + 1))
        for i in range(4)]
MT = Task(id="mt_bench/81", source="mt_bench", prompt=("Write a haiku.", "Now make it rhyme."), grader="judge",
          metadata={"category": "writing"})


def grade(task, text):
    return 1.0 if f"\\boxed{{{task.answer}}}" in (text or "") else 0.0


class EchoWorker(ScriptedModel):
    """Answers math right (or wrong), and MT-Bench turns with a text naming the turn it saw."""

    def __init__(self, name, right: bool):
        super().__init__(name, {"verifier": "Verdict: ACCEPT", "thinker": "<suggestion>go</suggestion>"})
        self.right = right
        self.seen = []

    async def chat(self, messages, sampling):
        self.calls += 1
        self.seen.append(messages)
        last = messages[-1].content
        if role_of(messages) != "worker":
            return await super().chat(messages, sampling)
        for i in range(4):
            if f"What is {i}+1?" in last:
                return ChatResponse(text=f"\\boxed{{{i + 1 if self.right else 0}}}", prompt_tokens=10,
                                    completion_tokens=5, latency_s=0.5)
        return ChatResponse(text=f"{self.name} answers: {last[:20]}", prompt_tokens=20, completion_tokens=7)


class ScriptedJudge:
    """A judge whose replies are scripted per conversation turn (a rating, or none)."""

    name, model_id = "judge", "scripted:judge"

    def __init__(self, rating_turn1="[[8]]", rating_turn2="[[6]]"):
        self.ratings, self.calls = (rating_turn1, rating_turn2), 0

    async def chat(self, messages, sampling):
        self.calls += 1
        turn2 = "<|The Start of Assistant A's Conversation with User|>" in messages[-1].content
        return ChatResponse(text=f"Explanation. Rating: {self.ratings[turn2]}")


def _settings(**evaluate):
    return Settings.model_validate({
        "pool": {"members": [{"name": n, "backend": "local", "model": "x"} for n in ("good", "bad")]},
        "coordinator": {"max_turns": 2}, "evaluate": evaluate})


def _run(store, judge_model, tasks, methods=None, right=(True, False)):
    models = [EchoWorker("good", right[0]), EchoWorker("bad", right[1])]
    pool = Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store)
    jpool = Pool([judge_model], [judge_member(PoolMember(name="judge", backend="local", model="x"), 64)], store)
    judge = MTBenchJudge(jpool, load_judge_prompts(DataSettings().resolved_root()))
    head = np.zeros(5 * 8)  # the coordinator: a zero head (argmax: model 0 as Thinker every turn, so no answer)
    run = evaluate(_settings(judge="good"), head, tasks, pool, StateCache(HashEncoder(), store), grade, judge=judge,
                   methods=methods)
    return run, models, pool, judge


@pytest.fixture(autouse=True)
def nothing_slow_on_the_http_loop():
    """Every evaluation here runs under asyncio's slow-callback check on the pool's HTTP loop: any callback that
    holds it over 1 s (an encode, a grade, a store scan run there) fails the test."""
    from trinity.pool.http_loop import watch_slow_callbacks

    with watch_slow_callbacks(1.0) as slow:
        yield
    assert slow == [], f"callbacks held the pool's HTTP loop: {slow}"


def test_slow_encodes_and_grades_do_not_cost_calls_against_a_real_llama_server(tmp_path, monkeypatch):
    """The evaluation against a real llama-server with the pool's connection retries off, while the encoder and the
    grader each block for 6 s per call (longer than the server's 5 s keep-alive timeout): every call succeeds and
    every item is scored (the calls run on the pool's HTTP loop, the encodes on the evaluation's, the grades on a
    thread of their own)."""
    import time

    from trinity.config import PoolSettings
    from trinity.pool import llama_server
    from trinity.pool.runtime import build_pool

    if llama_server.binary_problem() is not None:
        pytest.skip(llama_server.binary_problem())
    monkeypatch.setattr(llama_server, "CONNECTION_RETRIES", 0)

    class SlowEncoder(HashEncoder):
        def encode(self, texts):
            time.sleep(6.0)
            return super().encode(texts)

    def slow_grade(task, text):
        time.sleep(6.0)
        return grade(task, text)

    smol = {"name": "smol", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 16,
            "temperature": 0.0}
    settings = Settings.model_validate({"pool": {"members": [smol], "max_concurrency": 4},
                                        "coordinator": {"max_turns": 2}})
    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(settings.pool, store)
        run = evaluate(settings, np.zeros(4 * 8), {"in_distribution": MATH[:2]}, pool,
                       StateCache(SlowEncoder(), store), slow_grade, methods=["alone:smol", "random-routing"])
    llama_server.LLAMA_SERVERS.stop_all()  # later tests count the server starts they cause
    assert pool.stats.failures == 0 and pool.stats.calls_made >= 3
    assert all(i.error is None and i.score is not None for i in run.items), [i.error for i in run.items]
    turns = [t for i in run.items for _, t in i.turns]
    assert all(t.ok for t in turns) and max(t.latency_s for t in turns) < 5.0, [t.latency_s for t in turns]


def test_every_method_plays_the_same_items_and_mt_bench_is_judged_turn_by_turn(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        run, models, pool, judge = _run(store, ScriptedJudge(), {"in_distribution": MATH, "heldout": [MT]})
    methods = {"trinity", "alone:good", "alone:bad", "random-routing"}
    for bench, ids in (("math500", {t.id for t in MATH}), ("mt_bench", {MT.id})):
        for m in methods:
            assert {i.task.id for i in run.items if i.method == m and i.task.source == bench} == ids
    alone_good = {i.task.id: i for i in run.items if i.method == "alone:good"}
    assert all(alone_good[t.id].score == 1.0 for t in MATH)
    assert all(i.score == 0.0 for i in run.items if i.method == "alone:bad" and i.task.source == "math500")
    mt = alone_good[MT.id]
    # turn 2 was asked as a real conversation: question 1, this member's own answer 1, then question 2
    turn2_msgs = next(m for m in models[0].seen if m[-1].content.startswith("Now make it rhyme."))
    assert [(x.role, x.content) for x in turn2_msgs[1:3]] == [("user", "Write a haiku."),
                                                            ("assistant", mt.turns[0][1].text)]
    assert [k for k, _ in mt.turns] == [1, 2] and mt.answer == mt.turns[1][1].text
    assert [j["score"] for j in mt.judge] == [8.0, 6.0] and mt.score == 7.0  # the mean of the two turns
    # The zero-head coordinator answers no turn (Thinker every turn): each answerless turn scores the scale's
    # minimum and costs no judge call; every answered turn is judged.
    from trinity.evaluation.run import NO_ANSWER_SCORE
    mt_items = [i for i in run.items if i.task.source == "mt_bench"]
    answered = sum(1 for i in mt_items for tr in i.judge if tr["prompt"] is not None)
    trinity_mt = next(i for i in mt_items if i.method == "trinity")
    assert trinity_mt.answer is None and [j["score"] for j in trinity_mt.judge] == [NO_ANSWER_SCORE] * 2
    assert trinity_mt.score == NO_ANSWER_SCORE
    assert answered >= 4 and judge.stats()["verdicts"] == answered and judge.stats()["unparseable"] == 0
    row = mt.row()
    assert row["benchmark"] == "mt_bench" and row["split"] == "heldout" and row["tokens"] == 54
    json.dumps(row)


def test_methods_run_at_the_same_time_and_each_is_charged_its_own_calls(tmp_path):
    """Every (benchmark, method) run goes at once, so a member's server batches every method's calls (two members
    alone are in flight together); each run's calls_new is what it paid (`Pool.tally`), adding up to the pool's."""
    import asyncio

    in_flight, seen_together = set(), []

    class Overlapping(EchoWorker):
        async def chat(self, messages, sampling):
            in_flight.add(self.name)
            seen_together.append(set(in_flight))
            await asyncio.sleep(0.02)
            in_flight.discard(self.name)
            return await super().chat(messages, sampling)

    models = [Overlapping("good", True), Overlapping("bad", False)]
    with Store(tmp_path / "s.duckdb") as store:
        pool = Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store)
        run = evaluate(_settings(), np.zeros(5 * 8), {"in_distribution": MATH[:2]}, pool,
                       StateCache(HashEncoder(), store), grade, methods=["alone:good", "alone:bad"])
    assert {"good", "bad"} in seen_together  # one method after another never had both members in flight
    assert run.calls == {("alone:good", "math500"): {"calls_new": 2, "failed_calls": 0},
                         ("alone:bad", "math500"): {"calls_new": 2, "failed_calls": 0}}
    assert pool.stats.calls_made == 4 and [i.method for i in run.items] == ["alone:good"] * 2 + ["alone:bad"] * 2
    assert [i.score for i in run.items] == [1.0, 1.0, 0.0, 0.0]


def test_an_unparseable_judgement_is_counted_never_scored(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        run, _, _, judge = _run(store, ScriptedJudge("no rating", "[[4]]"), {"heldout": [MT]}, methods=["alone:good"])
        item = run.items[0]
        # turn 1 unrated: the item has no score of its own (not its turn-2 rating alone); turn 2 counts in its cell
        assert item.score is None and item.judge[0]["error"] == "no [[rating]] in the judge's reply"
        assert item.unit_scores() == {1: None, 2: 4.0} and "turn 2 rated" in item.error
        assert judge.stats()["unparseable"] == 1
        cell = summarise(run, resamples=200, seed=0)["scores"]["alone:good"]["mt_bench"]
        assert (cell["score"], cell["n"], cell["unscored"]) == (4.0, 1, 1)
        assert cell["turns"]["1"]["score"] is None and cell["turns"]["2"]["score"] == 4.0
    with Store(tmp_path / "t.duckdb") as store:
        run, _, _, judge = _run(store, ScriptedJudge("none", "none"), {"heldout": [MT]}, methods=["alone:good"])
        item = run.items[0]
        assert item.score is None and item.error.startswith("judge gave no rating")
        table = summarise(run, resamples=200, seed=0)
        cell = table["scores"]["alone:good"]["mt_bench"]
        assert cell["score"] is None and cell["n"] == 0 and cell["unscored"] == 2  # both judgements


def test_a_rerun_pays_nothing_not_even_the_judge(tmp_path):
    first_judge = ScriptedJudge()
    with Store(tmp_path / "s.duckdb") as store:
        run1, models1, _, _ = _run(store, first_judge, {"in_distribution": MATH[:2], "heldout": [MT]})
    second_judge = ScriptedJudge()
    with Store(tmp_path / "s.duckdb") as store:
        run2, models2, pool2, judge2 = _run(store, second_judge, {"in_distribution": MATH[:2], "heldout": [MT]})
    assert first_judge.calls > 0 and sum(m.calls for m in models1) > 0
    assert second_judge.calls == 0 and sum(m.calls for m in models2) == 0 and pool2.stats.calls_made == 0
    assert [i.row() for i in run1.items] == [i.row() for i in run2.items]


def test_the_table_oracle_and_paired_intervals(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        run, *_ = _run(store, ScriptedJudge(), {"in_distribution": MATH, "heldout": [MT]})
    t = summarise(run, resamples=500, seed=0)
    assert [b["name"] for b in t["benchmarks"]] == ["math500", "mt_bench"]
    assert t["benchmarks"][1] | {} == {"name": "mt_bench", "split": "heldout", "metric": "judge score (1-10)",
                                       "scale": 10.0, "n": 1, "unit": "judgement", "turns": 2, "units": 2,
                                       "common_units": 2}
    oracle = next(m for m in t["methods"] if m["method"] == ORACLE)
    assert oracle["kind"] == "oracle" and oracle["picks"]["math500"] == "alone:good"
    assert t["scores"][ORACLE]["math500"]["score"] == 1.0 and t["scores"][ORACLE]["math500"]["calls_new"] == 0
    assert t["scores"]["alone:bad"]["math500"]["ci95"] == [0.0, 0.0]
    good = t["scores"]["alone:good"]
    assert t["averages"]["alone:good"] == {"in_distribution": 1.0, "heldout": good["mt_bench"]["score"] / 10}
    assert good["math500"]["tokens_per_task"] == 15 and good["math500"]["wall_s_per_task"] == 0.5
    vs_best, vs_random = t["paired"]["math500"]
    assert vs_best["b"] == "alone:good" and vs_random["b"] == "random-routing" and vs_best["n"] == 4
    trinity = {i.task.id: i.score for i in run.items if i.method == "trinity" and i.task.source == "math500"}
    assert vs_best["diff"] == pytest.approx(np.mean(list(trinity.values())) - 1.0)
    assert vs_best["outcome"] == compare(paired_bootstrap(list(trinity.values()), [1.0] * 4, n_resamples=500))


def test_held_out_items_split_into_the_missions_benchmarks_and_the_others_each_with_its_average(tmp_path):
    """GSM8K, HumanEval or your own held-out benchmark is its own block beside the mission's four (AIME,
    BigCodeBench-Hard, MT-Bench, GPQA): an average, a pooled comparison and a block in the report tables each."""
    from trinity.evaluation.report import tables
    from trinity.evaluation.results import EvalResults
    from trinity.evaluation.run import evaluation_splits

    gsm = [Task(id=f"gsm8k/{i}", source="gsm8k", prompt=(f"What is {i}+1?",), grader="math", answer=str(i + 1))
           for i in range(3)]
    tasks = evaluation_splits(MATH[:2], [MT, *gsm])
    assert {k: [t.source for t in ts] for k, ts in tasks.items()} == {
        "in_distribution": ["math500"] * 2, "heldout": ["mt_bench"], "heldout_other": ["gsm8k"] * 3}
    assert list(evaluation_splits(MATH[:2], gsm)) == ["in_distribution", "heldout_other"]
    with Store(tmp_path / "s.duckdb") as store:
        run, *_ = _run(store, ScriptedJudge(), tasks)
    t = summarise(run, resamples=200, seed=0)
    assert [(b["name"], b["split"]) for b in t["benchmarks"]] == [
        ("math500", "in_distribution"), ("mt_bench", "heldout"), ("gsm8k", "heldout_other")]
    good = t["averages"]["alone:good"]
    assert set(good) == {"in_distribution", "heldout", "heldout_other"} and good["heldout_other"] == 1.0
    assert t["averages"]["alone:bad"]["heldout_other"] == 0.0
    other = t["pooled_paired"]["heldout_other"]
    assert other["benchmarks"] == ["gsm8k"] and other["items"] == 3 and other["best_single"] == "alone:good"
    assert t["pooled_paired"]["heldout"]["benchmarks"] == ["mt_bench"]
    results = EvalResults.from_dict(t)
    assert [b.name for b in results.in_split(None)] == ["math500", "mt_bench", "gsm8k"]
    header = next(line for line in tables.main_table(results) if line.startswith("| method"))
    assert header.endswith("| gsm8k (n=3) | avg (held-out, other) |")
    assert any("held-out, other benchmarks" in line for line in tables.pooled_table(results))
    assert results.dvc_metrics()["alone:good"]["avg_heldout_other"] == 1.0


def test_bootstrap_intervals():
    assert bootstrap_mean([1, 1, 1]).as_dict() | {} == {"estimate": 1.0, "ci95": [1.0, 1.0], "n": 3,
                                                       "small_sample": True}
    iv = bootstrap_mean([0, 1] * 50, seed=3)
    assert iv.low < 0.5 < iv.high and 0.35 < iv.low and iv.high < 0.65 and not iv.small_sample
    assert bootstrap_mean([0, 1] * 50, seed=3) == iv  # seeded: the same interval on a rerun
    assert compare(paired_bootstrap([1] * 40, [0] * 40)) == "wins"
    assert compare(paired_bootstrap([0] * 40, [1] * 40)) == "loses"
    assert compare(paired_bootstrap([0, 1] * 20, [1, 0] * 20)) == "ties"
    with pytest.raises(ValueError, match="equal-length"):
        paired_bootstrap([1, 0], [1])


# ------------------------------------------------------------------ the held-out promise, bad input
def test_in_distribution_items_are_never_training_items(root):
    s = build_all_splits(root, {"math500": 40, "mmlu": 20}, {"math500": 30, "mmlu": 20}, {"gpqa": 2}, seed=0,
                         math500_max_level=2)
    assert not {t.id for t in s.train} & {t.id for t in s.in_distribution}
    assert {t.source for t in s.in_distribution} == {"math500", "mmlu"} and len(s.in_distribution) == 50
    again = build_all_splits(root, {"math500": 40, "mmlu": 20}, {"math500": 30, "mmlu": 20}, {"gpqa": 2}, seed=0,
                             math500_max_level=2)
    assert [t.id for t in again.in_distribution] == [t.id for t in s.in_distribution]
    with pytest.raises(ValueError, match=r"data.in_distribution.gpqa: gpqa is a held-out benchmark"):
        build_all_splits(root, {"math500": 2}, {"gpqa": 2}, {}, seed=0)
    with pytest.raises(ValueError, match=r"data.in_distribution: unknown benchmark 'nope'"):
        build_all_splits(root, {"math500": 2}, {"nope": 2}, {}, seed=0)


def test_a_heldout_item_in_training_fails_the_stage_loudly(tmp_path, root):
    paths = stage_paths.Paths(tmp_path)
    s = build_all_splits(root, {"math500": 3}, {"math500": 2}, {"gpqa": 2}, seed=0)
    paths.prepared.mkdir(parents=True)
    save_tasks(paths.prepared / "train.jsonl", [*s.train, s.heldout[0]])  # someone edited the prepared file
    save_tasks(paths.prepared / "in_distribution.jsonl", s.in_distribution)
    save_tasks(paths.prepared / "heldout.jsonl", s.heldout)
    save_tasks(paths.prepared / "validation.jsonl", s.validation)
    with pytest.raises(ContaminationError, match="held-out benchmarks in the training set: \\['gpqa'\\]"):
        stage_common.load_tasks(paths)
    # the same prompt text under another id is caught too (normalised text, not only ids)
    copy = Task(id="math500/copy", source="math500", prompt=(s.in_distribution[0].prompt[0].upper() + "  ",),
                grader="math", answer="1")
    save_tasks(paths.prepared / "train.jsonl", [*s.train, copy])
    with pytest.raises(ContaminationError, match="same prompt text"):
        stage_common.load_tasks(paths)


def test_a_judge_outside_the_pool_or_a_missing_judge_is_named(tmp_path):
    base = yaml.safe_load(open(stage_paths.PROJECT_ROOT / "params.yaml"))
    bad = {**base, "evaluate": {**base["evaluate"], "judge": "gpt-9"}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match="evaluate.judge: 'gpt-9' is not a pool member"):
        load_settings(tmp_path / "p.yaml")
    none = {**base, "evaluate": {**base["evaluate"], "judge": None}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(none))
    with pytest.raises(ConfigError, match="evaluate.judge: MT-Bench is evaluated"):
        load_settings(tmp_path / "p.yaml")
    endpoint = {**base, "evaluate": {**base["evaluate"], "judge": {
        "name": "gpt-judge", "backend": "openai", "model": "gpt-4", "base_url": "http://127.0.0.1:9/v1"}}}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(endpoint))
    assert load_settings(tmp_path / "p.yaml").evaluate.judge.name == "gpt-judge"


def test_the_evaluate_stage_checks_before_calling_a_model(tmp_path, root, monkeypatch):
    """A missing judge-prompt file is named before any model is built or called."""
    monkeypatch.setenv("TRINITY_DATA_DIR", str(tmp_path / "no-benchmarks"))
    settings = load_settings(stage_paths.PROJECT_ROOT / "params.yaml")
    paths = stage_paths.Paths(tmp_path)
    s = build_all_splits(root, {"math500": 2}, {}, {"mt_bench": 1}, seed=0)
    paths.prepared.mkdir(parents=True)
    for split, name in stage_paths.SPLIT_FILES.items():
        save_tasks(paths.prepared / name, getattr(s, split))
    from trinity.coordinator.checkpoint_meta import CheckpointMeta
    from trinity.coordinator.policy import save_checkpoint

    save_checkpoint(paths.checkpoint, np.zeros(4), CheckpointMeta.model_validate(
        {"pool": [{"name": m.name} for m in settings.pool.members], "svf_layer": None, "encoder": "x"}))
    built = []
    monkeypatch.setattr("trinity.pool.runtime.build_pool", lambda *a, **k: built.append(1))
    with pytest.raises(Exception, match="judge_prompts.jsonl: judge prompts file not found"):
        run_stage("evaluate", settings, paths)
    assert not built


def _profile(block_name: str) -> Settings:
    """params.yaml with a Makefile profile's `dvc exp run -S` overrides applied. Every key it sets must exist in
    params.yaml (DVC would add a misspelt key silently; the settings check would then reject it)."""
    import re

    text = (stage_paths.PROJECT_ROOT / "Makefile").read_text()
    block = re.search(rf"^{block_name} := (.*?)\n(?!\t)", text, re.S | re.M).group(1)
    overrides = re.findall(r"([\w.]+)=(-?\d+)", block)
    assert overrides, f"Makefile {block_name} sets nothing"
    params = yaml.safe_load((stage_paths.PROJECT_ROOT / "params.yaml").read_text())
    for key, value in overrides:
        *parents, leaf = key.split(".")
        node = params
        for p in parents:
            node = node[p]
        assert leaf in node, f"Makefile {block_name} sets {key}, which params.yaml does not have"
        node[leaf] = int(value)
    return Settings.model_validate(params)


def test_the_every_item_profile_overrides_existing_keys_to_every_item(root):
    """`make run-every-item`: every evaluation item of every benchmark, MATH-500 at all levels."""
    full = _profile("EVERY_ITEM")
    evaluated = {**full.data.in_distribution, **full.data.heldout}
    assert set(evaluated.values()) == {-1} and full.data.math500_max_level == 5
    assert set(evaluated) == set(load_settings(stage_paths.PROJECT_ROOT / "params.yaml").data.in_distribution) | set(
        load_settings(stage_paths.PROJECT_ROOT / "params.yaml").data.heldout)
    s = build_all_splits(root, {"math500": 3}, {}, {"aime": -1, "gpqa": -1}, seed=0)
    assert {t.source: 0 for t in s.heldout} and len(s.heldout) == 60 + 198


def test_the_full_profile_evaluates_enough_items_to_decide_and_trains_at_least_the_default_budget(root):
    """`make run-full` (issue 27): at least 30 in-distribution items per training benchmark and 50 each of GSM8K and
    HumanEval held out, on the same training benchmarks, with no less training than the default run; every item
    exists in the staged data (a draw larger than a benchmark would silently shrink it)."""
    default = Settings.model_validate(yaml.safe_load((stage_paths.PROJECT_ROOT / "params.yaml").read_text()))
    full = _profile("FULL_TRAIN")
    assert set(full.data.train) == set(default.data.train) == set(full.data.in_distribution)
    budget = lambda s: s.evolve.popsize * s.evolve.episodes_per_candidate * s.evolve.generations  # noqa: E731
    assert budget(full) >= budget(default)
    assert min(full.data.in_distribution.values()) >= 30
    assert full.data.heldout["gsm8k"] >= 50 and full.data.heldout["humaneval"] >= 50
    s = build_all_splits(root, full.data.train, full.data.in_distribution,
                         {"gsm8k": full.data.heldout["gsm8k"], "humaneval": full.data.heldout["humaneval"]},
                         seed=full.data.seed, math500_max_level=full.data.math500_max_level)
    assert len(s.in_distribution) == sum(full.data.in_distribution.values())
    assert len(s.heldout) == full.data.heldout["gsm8k"] + full.data.heldout["humaneval"]


# ------------------------------------------------------------------ MT-Bench per turn; pooled paired per split
def _task(tid: str, source: str, judged: bool = False) -> Task:
    if judged:
        return Task(id=tid, source=source, prompt=("q1", "q2"), grader="judge")
    return Task(id=tid, source=source, prompt=("q",), grader="math", answer="1")


def _item(method: str, task: Task, split: str, score=None, turn_scores=None):
    """A hand-made ItemResult: `score` for a one-unit item; `turn_scores` (None = no valid judgement) for a judged
    one, recorded as _judge_items records them."""
    from trinity.evaluation.items import ItemResult

    judge, error = [], None
    if turn_scores is not None:
        judge = [{"turn": k, "score": s, "error": None if s is not None else "no [[rating]] in the judge's reply",
                  "prompt": "single-v1", "raw": ""} for k, s in enumerate(turn_scores, start=1)]
        score = None if None in turn_scores else float(np.mean(turn_scores))
        error = None if score is not None else "judge gave no rating on a turn"
    return ItemResult(method=method, task=task, split=split, score=score, answer="a", turns=[], path=[],
                      judge=judge, error=error)


MT_A, MT_B = _task("mt_bench/1", "mt_bench", True), _task("mt_bench/2", "mt_bench", True)
MT_TURNS = {  # per method, per MT-Bench item: (turn 1, turn 2) judgements, None = not valid
    "trinity": {MT_A: (8.0, None), MT_B: (6.0, 2.0)},
    "alone:x": {MT_A: (7.0, 5.0), MT_B: (8.0, None)},
    "alone:y": {MT_A: (5.0, 5.0), MT_B: (5.0, 5.0)},
    "random-routing": {MT_A: (3.0, 3.0), MT_B: (2.0, 2.0)},
}


def _mt_items(methods=tuple(MT_TURNS)):
    return [_item(m, t, "heldout", turn_scores=MT_TURNS[m][t]) for m in methods for t in (MT_A, MT_B)]


def test_mt_bench_is_scored_per_turn_and_paired_on_the_item_turn_units_both_have():
    from trinity.evaluation.items import EvalRun

    t = summarise(EvalRun(_mt_items(("trinity", "alone:x", "random-routing")), {}, 1.0), resamples=300, seed=0)
    trinity = t["scores"]["trinity"]["mt_bench"]
    # per turn: over the items whose judgement of that turn is valid
    assert trinity["turns"]["1"] | {} == {"score": 7.0, "ci95": trinity["turns"]["1"]["ci95"], "n": 2,
                                         "unscored": 0, "small_sample": True}
    assert (trinity["turns"]["2"]["score"], trinity["turns"]["2"]["n"], trinity["turns"]["2"]["unscored"]) == \
        (2.0, 1, 1)
    # overall: the mean over every valid (item, turn) judgement (FastChat), not over per-item means (8, 4 → 6.0)
    assert trinity["score"] == pytest.approx((8 + 6 + 2) / 3)
    assert (trinity["n"], trinity["items"], trinity["unscored"]) == (3, 2, 1)
    assert t["benchmarks"][0]["common_units"] == 2  # (A, 1) and (B, 1): every method has them valid
    # the held-out average counts MT-Bench over those common units / 10: the same units for every row
    assert t["averages"]["trinity"]["heldout"] == pytest.approx((8 + 6) / 2 / 10)
    assert t["averages"]["alone:x"]["heldout"] == pytest.approx((7 + 8) / 2 / 10)
    # paired: only the (item, turn) units both methods have valid — (A, 1) and (B, 1) here
    vs_best, vs_random = t["paired"]["mt_bench"]
    assert vs_best["b"] == "alone:x" and vs_best["n"] == 2 and vs_best["items"] == 2
    assert vs_best["diff"] == pytest.approx(((8 - 7) + (6 - 8)) / 2)
    assert vs_best["turns"]["1"]["diff"] == pytest.approx(-0.5) and vs_best["turns"]["1"]["n"] == 2
    assert vs_best["turns"]["2"]["n"] == 0 and vs_best["turns"]["2"]["diff"] is None
    assert vs_best["turns"]["2"]["outcome"] == "no data"
    # vs random routing: (A, 1), (B, 1), (B, 2) — two turns of item B resampled together
    assert vs_random["n"] == 3 and vs_random["items"] == 2
    assert vs_random["diff"] == pytest.approx(((8 - 3) + (6 - 2) + (2 - 2)) / 3)
    assert vs_random["ci95"] == pytest.approx(paired_bootstrap([8, 6, 2], [3, 2, 2], n_resamples=300, seed=0,
                                                               clusters=["A", "B", "B"]).as_dict()["ci95"])
    assert vs_random["turns"]["2"]["n"] == 1 and vs_random["turns"]["2"]["diff"] == 0.0


def test_pooled_paired_per_split_against_one_best_member_chosen_on_the_pooled_score():
    from trinity.evaluation.items import EvalRun

    plan = {  # in-distribution: math500, mmlu; held-out: gpqa (+ MT-Bench)
        "math500": {"trinity": [1, 1, 0], "alone:x": [1, 0, 0], "alone:y": [0, 0, 1], "random-routing": [0, 0, 0]},
        "mmlu": {"trinity": [1, 1], "alone:x": [0, 0], "alone:y": [1, 1], "random-routing": [None, 1]},
        "gpqa": {"trinity": [0, 1], "alone:x": [1, 1], "alone:y": [0, 0], "random-routing": [0, 0]},
    }
    items = []
    for bench, per in plan.items():
        split = "heldout" if bench == "gpqa" else "in_distribution"
        for method, scores in per.items():
            items += [_item(method, _task(f"{bench}/{i}", bench), split, s) for i, s in enumerate(scores)]
    items += _mt_items()
    t = summarise(EvalRun(items, {}, 1.0), resamples=400, seed=0)
    pooled = t["pooled_paired"]
    ind = pooled["in_distribution"]
    assert ind["benchmarks"] == ["math500", "mmlu"] and (ind["items"], ind["units"]) == (5, 5)
    # pooled scores over the units every method scored (mmlu/0 is unscored for random routing): 4 units
    assert ind["common_units"] == 4
    assert ind["scores"]["trinity"] == pytest.approx(3 / 4) and ind["scores"]["alone:y"] == pytest.approx(2 / 4)
    assert ind["scores"]["alone:x"] == pytest.approx(1 / 4)
    # one member, the best on the pooled score (not math500's pick x mixed with mmlu's pick y)
    assert ind["best_single"] == "alone:y" and t["methods"][-1]["picks"]["math500"] == "alone:x"
    vs_best, vs_random = ind["comparisons"]
    assert vs_best["b"] == "alone:y" and vs_best["label"] == "best single member on the split, in hindsight"
    diffs = [1, 1, -1, 0, 0]  # math500/0..2, mmlu/0..1
    assert vs_best["n"] == 5 and vs_best["diff"] == pytest.approx(sum(diffs) / 5)
    assert (vs_best["a_better"], vs_best["b_better"]) == (2, 1)
    assert vs_best["ci95"] == paired_bootstrap([1, 1, 0, 1, 1], [0, 0, 1, 1, 1], n_resamples=400,
                                               seed=0).as_dict()["ci95"]
    assert vs_random["n"] == 4 and vs_random["diff"] == pytest.approx((1 + 1 + 0 + 0) / 4)
    # held out: gpqa items and MT-Bench (item, turn) judgements / 10 on one scale
    ho = pooled["heldout"]
    assert ho["benchmarks"] == ["gpqa", "mt_bench"] and (ho["items"], ho["units"], ho["common_units"]) == (4, 6, 4)
    assert ho["best_single"] == "alone:x" and ho["scores"]["alone:x"] == pytest.approx((1 + 1 + 0.7 + 0.8) / 4)
    vs_best, vs_random = ho["comparisons"]
    assert vs_best["n"] == 4 and vs_best["diff"] == pytest.approx((-1 + 0 + 0.1 - 0.2) / 4)
    assert vs_random["n"] == 5 and vs_random["items"] == 4
    assert vs_random["diff"] == pytest.approx((0 + 1 + 0.5 + 0.4 + 0) / 5)
    assert vs_random["ci95"] == pytest.approx(paired_bootstrap(
        [0, 1, 0.8, 0.6, 0.2], [0, 0, 0.3, 0.2, 0.2], n_resamples=400, seed=0,
        clusters=["g0", "g1", "A", "B", "B"]).as_dict()["ci95"])
    json.dumps(t)
    # the report reads what summarise wrote (as the checked record): the per-turn columns and the pooled rows
    from trinity.evaluation.report import tables
    from trinity.evaluation.results import EvalResults

    results = EvalResults.from_dict(t)
    assert results.to_json() is t
    rendered = "\n".join(tables.main_table(results) + tables.pooled_table(results))
    assert "mt_bench turn 2 (n=2, 1–10)" in rendered and "mt_bench all turns (n=2x2, 1–10)" in rendered
    assert "| in-distribution (math500, mmlu) | trinity − alone:y (best single member on the split" in rendered


def test_a_cluster_bootstrap_of_one_unit_per_item_is_the_plain_bootstrap():
    values = [0, 1, 1, 0, 1, 1, 0, 0, 1, 1]
    assert bootstrap_mean(values, clusters=list(range(10)), seed=4) == bootstrap_mean(values, seed=4)
    iv = bootstrap_mean([1, 0, 1, 1], clusters=["a", "a", "b", "b"], seed=0)
    assert (iv.n, iv.clusters, iv.resampled, iv.estimate) == (4, 2, 2, 0.75)
    assert compare(paired_bootstrap([1] * 8, [0] * 8, clusters=[i // 2 for i in range(8)])) == "too few items"
