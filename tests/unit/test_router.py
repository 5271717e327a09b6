"""The learned router baseline: the coordinator cut to one turn and the Worker role (`coordinator.roles`), trained by
the same sep-CMA-ES loop, evaluated as the method `router` with the coordinator compared against it. Scripted pool
members (the protocol is under test, not model quality)."""
import asyncio

import numpy as np
import pytest

from fixtures.scripted_pool import HashEncoder, ScriptedModel, role_of
from trinity.config import PoolMember, Settings
from trinity.coordinator.episode import Episode, StateCache, episode_rng, play_episodes
from trinity.coordinator.roles import ROLES, Role, allowed_roles
from trinity.coordinator.router import ROUTER, router_settings
from trinity.evaluation.run import evaluate
from trinity.evaluation.summary import summarise
from trinity.evolve.loop import evolve
from trinity.pool.runtime import Pool
from trinity.records import ChatResponse, Task
from trinity.store import Store

TASKS = [Task(id=f"t/{i}", source="toy", prompt=(f"What is {i}+1?",), grader="math", answer=str(i + 1))
         for i in range(6)]


def grade(task, text):
    return 1.0 if f"\\boxed{{{task.answer}}}" in (text or "") else 0.0


class Member(ScriptedModel):
    """Right (or wrong) on every toy question as Worker; a Thinker that always suggests the Verifier."""

    def __init__(self, name, right):
        super().__init__(name, {"verifier": "Verdict: ACCEPT",
                                "thinker": "<suggestion>check it</suggestion>\nsuggested_role: verifier"})
        self.right = right

    async def chat(self, messages, sampling):
        last = messages[-1].content
        if role_of(messages) != "worker":
            return await super().chat(messages, sampling)
        self.calls += 1
        i = next(i for i in range(len(TASKS)) if f"What is {i}+1?" in last)
        return ChatResponse(text=f"\\boxed{{{i + 1 if self.right else 0}}}", prompt_tokens=10, completion_tokens=5)


def _settings(**evolve):
    return Settings.model_validate({
        "pool": {"members": [{"name": n, "backend": "local", "model": "x"} for n in ("bad", "good")]},
        "coordinator": {"max_turns": 3, "feature_norm": "standardize"}, "reward": {"diversity_weight": 0.0},
        "evolve": {"generations": 6, "popsize": 8, "episodes_per_candidate": 6, "sigma0": 1.0,
                   "saved_fitness_tasks": None, "seed": 3, **evolve}})


def _pool(store):
    models = [Member("bad", False), Member("good", True)]
    return Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store), models


def test_router_settings_cut_the_coordinator_to_one_worker_turn_and_keep_everything_else():
    s = _settings()
    r = router_settings(s)
    assert (r.coordinator.max_turns, r.coordinator.roles, r.coordinator.svf_layer) == (1, ["worker"], None)
    assert allowed_roles(r.coordinator) == (Role.WORKER,) and allowed_roles(s.coordinator) == ROLES
    assert r.evolve == s.evolve and r.reward == s.reward and r.pool == s.pool and r.data == s.data
    with pytest.raises(ValueError, match="has no worker"):
        Settings.model_validate({"pool": s.pool.model_dump(), "coordinator": {"roles": ["thinker", "verifier"]}})
    with pytest.raises(ValueError, match="listed twice"):
        Settings.model_validate({"pool": s.pool.model_dump(), "coordinator": {"roles": ["worker", "worker"]}})


def test_roles_the_head_may_not_pick_get_no_turn_and_a_suggestion_of_one_is_ignored(tmp_path):
    """Sampled episodes under a random head: with roles [thinker, worker] no Verifier ever speaks (the Thinker
    suggests one every time); with [worker] and one turn each episode is one Worker call."""
    with Store(tmp_path / "s.duckdb") as store:
        pool, _ = _pool(store)
        states = StateCache(HashEncoder(), store)
        head = np.random.default_rng(0).normal(size=(2 + 3, HashEncoder.dim)) * 3
        for roles, max_turns in (((Role.THINKER, Role.WORKER), 3), ((Role.WORKER,), 1), (ROLES, 3)):
            eps = [Episode(task=t, candidate=0, rng=episode_rng(0, "test", t.id, k)) for t in TASKS for k in range(5)]
            asyncio.run(play_episodes(eps, [head], pool, states, max_turns, _settings().reward, grade, roles=roles))
            used = {turn.role for e in eps for turn in e.turns}
            assert used <= set(roles), (roles, used)
            if roles == (Role.WORKER,):
                assert all(len(e.turns) == 1 and e.answer is not None for e in eps)
        assert Role.VERIFIER in used  # all three roles: the Verifier does speak (so the mask above did the work)


def test_a_router_is_trained_by_the_same_loop_and_learns_the_member_that_answers(tmp_path):
    s = _settings()
    with Store(tmp_path / "s.duckdb") as store:
        pool, models = _pool(store)
        states = StateCache(HashEncoder(), store)
        result = evolve(router_settings(s), TASKS, pool, states, grade)
        assert len(result.history) == 6
        # every training episode was one Worker call: the episodes of a generation pay at most one call per
        # (task, member), and both members' Worker replies are all there is in the store
        rows = store.con.execute("SELECT role, count(*) FROM responses GROUP BY role").fetchall()
        assert rows == [("worker", 2 * len(TASKS))]
        assert max(r.best_candidate_fitness for r in result.history) == 1.0  # some candidate picked `good` throughout
        run = evaluate(s, np.zeros_like(result.params), {"in_distribution": TASKS}, pool, states, grade,
                       router=(result.params, states))
    router_items = [i for i in run.items if i.method == ROUTER]
    assert len(router_items) == len(TASKS)
    assert all(len(i.turns) == 1 and i.turns[0][1].role is Role.WORKER and i.turns[0][1].model == "good"
               for i in router_items)
    alone_good = {i.task.id: i.answer for i in run.items if i.method == "alone:good"}
    assert all(i.answer == alone_good[i.task.id] and i.score == 1.0 for i in router_items)  # the same request
    table = summarise(run, resamples=200, seed=0)
    assert [m["method"] for m in table["methods"] if m["kind"] == "router"] == [ROUTER]
    labels = [c["label"] for c in table["paired"]["toy"]]
    assert labels == ["best single member", "learned router", "random routing"]
    pooled = {c["b"]: c for c in table["pooled_paired"]["in_distribution"]["comparisons"]}
    assert pooled[ROUTER]["diff"] == pytest.approx(table["averages"]["trinity"]["in_distribution"] - 1.0)
