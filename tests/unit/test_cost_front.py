"""scripts/cost_front.py's arithmetic: each method's place on the accuracy / seconds front (right-or-wrong benchmarks
only, seconds per item), the goal check against the best member, and the table and figure it writes. Scripted
members with recorded latencies; the training and evaluation it drives are the stages' own (tested there)."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from fixtures.scripted_pool import HashEncoder, ScriptedModel
from trinity.config import PoolMember, Settings
from trinity.coordinator.episode import StateCache
from trinity.evaluation.results import EvalResults
from trinity.evaluation.run import evaluate
from trinity.evaluation.summary import summarise
from trinity.pool.runtime import Pool
from trinity.records import ChatResponse, Task
from trinity.store import Store

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "cost_front.py"
spec = importlib.util.spec_from_file_location("cost_front", SCRIPT)
cost_front = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cost_front)

MATH = [Task(id=f"m/{i}", source="math500", prompt=(f"What is {i}+1?",), grader="math", answer=str(i + 1))
        for i in range(4)]


class Timed(ScriptedModel):
    def __init__(self, name, right, seconds):
        super().__init__(name, {"verifier": "Verdict: ACCEPT", "thinker": "<suggestion>go</suggestion>"})
        self.right, self.seconds = right, seconds

    async def chat(self, messages, sampling):
        last = messages[-1].content
        i = next((i for i in range(4) if f"What is {i}+1?" in last), 0)
        text = f"\\boxed{{{i + 1 if self.right and i < 3 else 0}}}"  # `slow` is right on 3 of 4
        return ChatResponse(text=text, prompt_tokens=10, completion_tokens=5, latency_s=self.seconds)


def grade(task, text):
    return 1.0 if f"\\boxed{{{task.answer}}}" in (text or "") else 0.0


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    models = [Timed("fast", False, 1.0), Timed("slow", True, 8.0)]
    settings = Settings.model_validate({"pool": {"members": [{"name": m.name, "backend": "local", "model": "x"}
                                                             for m in models]}})
    with Store(tmp_path_factory.mktemp("s") / "s.duckdb") as store:
        pool = Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store)
        run = evaluate(settings, np.zeros(5 * 8), {"in_distribution": MATH}, pool, StateCache(HashEncoder(), store),
                       grade, methods=["trinity", "alone:fast", "alone:slow"])
    return cost_front.front_points(EvalResults.from_dict(summarise(run, resamples=100, seed=0)), ["in_distribution"])


def test_a_methods_point_is_its_average_and_its_recorded_seconds_per_task(base):
    assert base["alone:slow"]["in_distribution"]["score"] == 0.75
    assert base["alone:slow"]["in_distribution"]["s_per_task"] == 8.0
    assert base["alone:fast"]["in_distribution"] == {"score": 0.0, "s_per_task": 1.0, "benchmarks": ["math500"]}
    assert set(base) == {"trinity", "alone:fast", "alone:slow"}  # the oracle is no point of its own


def test_the_goal_is_a_weight_near_the_unweighted_score_at_no_more_seconds_than_the_best_member(base, tmp_path):
    unweighted = dict(base["trinity"]["in_distribution"])
    base = {**base, "trinity": {"in_distribution": {"score": 0.75, "s_per_task": 12.0}}}
    swept = {0.01: {"in_distribution": {"score": 0.74, "s_per_task": 7.5}},   # within 0.02, cheaper than `slow`
             0.05: {"in_distribution": {"score": 0.50, "s_per_task": 2.0}}}   # cheap but 0.25 worse
    g = cost_front.goal_check(base, swept, "in_distribution")
    assert g["met"] and g["weights_meeting"] == [0.01] and g["best_member"] == "alone:slow"
    g = cost_front.goal_check(base, {0.05: swept[0.05]}, "in_distribution")
    assert g["met"] is False and g["best_member_s_per_task"] == 8.0
    full = {w: {"points": p} for w, p in swept.items()}
    text = cost_front.render(base, full, [cost_front.goal_check(base, swept, "in_distribution")], ["in_distribution"],
                             0.0)
    assert "| trinity | 0.01 | 0.740 | 7.5 |" in text and "**met** at weight 0.01" in text
    cost_front.plot(base, full, ["in_distribution"], 0.0, tmp_path / "front.png")
    assert (tmp_path / "front.png").read_bytes()[:4] == b"\x89PNG"
    assert unweighted["benchmarks"] == ["math500"]


def test_the_goal_is_not_decided_where_the_unweighted_coordinator_scores_nothing(base):
    """An unweighted average of 0 is met by a coordinator that answers nothing (a Verifier first ends the episode at
    0 s): the check says so instead of calling it met."""
    base = {**base, "trinity": {"in_distribution": {"score": 0.0, "s_per_task": 12.0}}}
    g = cost_front.goal_check(base, {0.01: {"in_distribution": {"score": 0.0, "s_per_task": 0.0}}}, "in_distribution")
    assert g["met"] is None and "answers nothing" in g["why"]


def test_bad_weights_are_refused_before_anything_runs():
    with pytest.raises(SystemExit, match="give weights > 0"):
        cost_front.main(["--weights", "0,0.01"])
    with pytest.raises(SystemExit, match="comma-separated numbers"):
        cost_front.main(["--weights", "cheap"])
