"""Baselines of the optimiser ablation (REINFORCE, random search) next to sep-CMA-ES: one loop, one budget.

Unit: the REINFORCE estimate points along the true gradient of a toy reward (and a step raises the rewarded
pick's probability); random search is deterministic by seed. Real: each method trains on the real SmolLM2
pool and encoder on the same tasks and spends exactly the same episode budget; a REINFORCE run resumed
from its checkpoint ends where an uninterrupted one does.
"""

import numpy as np
import pytest

from trinity.config import Settings
from trinity.coordinator.episode import Episode, RolloutTrees, StateCache
from trinity.coordinator.head import HeadShape, ParamLayout, softmax
from trinity.coordinator.roles import Role
from trinity.evolve.random_search import RandomSearch
from trinity.evolve.reinforce import Reinforce, policy_gradient
from trinity.evolve.loop import evolve, minibatch
from trinity.evolve.records import GenerationRecord
from trinity.records import Task
from trinity.store import Store

from fixtures.tiny_setup import ARITHMETIC_TASKS, SHORT_COORDINATOR, SMOL_PAIR_POOL

# ----------------------------------------------------------------------------------------------- unit


def _bandit_episodes(W, h, n, reward_of, seed=0, forced=False):
    """One-pick episodes drawn from the head's model/role softmax at a fixed state h."""
    rng = np.random.default_rng(seed)
    L = W.shape[0] - 3  # number of models
    pm = softmax(W[:L] @ h)
    pr = softmax(W[L:] @ h)
    task = Task(id="toy/1", source="toy", prompt=("q",), grader="math")
    eps = []
    for _ in range(n):
        m, r = int(rng.choice(L, p=pm)), int(rng.choice(3, p=pr))
        e = Episode(task=task, candidate=0, rng=rng)
        e.picks = [(m, [Role.THINKER, Role.WORKER, Role.VERIFIER][r])]
        e.features, e.forced = [h.astype(np.float32)], [forced]
        e.reward = reward_of(m, r)
        eps.append(e)
    return eps


def test_reinforce_gradient_sign_on_toy_reward():
    shape = HeadShape(n_models=2, dim=4)
    h = np.array([1.0, -0.5, 0.25, 2.0])
    theta = np.zeros(shape.n_params)
    eps = _bandit_episodes(shape.unflatten(theta), h, 4000, lambda m, r: 1.0 if m == 0 else 0.0)
    g = shape.unflatten(policy_gradient(shape, theta, eps))
    # exact ∇ E[1{m=0}] = p0 (e0 − p) ⊗ h on the model rows, 0 on the role rows
    p = softmax(shape.unflatten(theta)[:2] @ h)
    exact = np.outer(p[0] * (np.eye(2)[0] - p), h)
    assert np.dot(g[:2].ravel(), exact.ravel()) > 0
    cos = np.dot(g[:2].ravel(), exact.ravel()) / (np.linalg.norm(g[:2]) * np.linalg.norm(exact))
    assert cos > 0.95
    assert np.all(np.sign(g[0]) == np.sign(h)) and np.all(np.sign(g[1]) == -np.sign(h))
    assert np.linalg.norm(g[2:]) < 0.1 * np.linalg.norm(g[:2])  # the role does not matter here

    # Reinforce's steps go up that gradient: three models, picking model 1 rewarded (+1) or punished (−1).
    # Rewarded: p(1) rises by a margin and both others fall; punished: the other way round. (5 Adam steps at
    # lr 0.05 move each logit by about ±0.9, so p(1) goes 1/3 → ~0.75 or ~0.07; the margins leave room.)
    def train(sign):
        shape3 = HeadShape(n_models=3, dim=4)
        opt = Reinforce(ParamLayout(shape3), popsize=4, lr=0.05)
        before = softmax(shape3.unflatten(opt.params)[:3] @ h)
        for k in range(5):
            eps = _bandit_episodes(shape3.unflatten(opt.params), h, 300, lambda m, r: sign * float(m == 1), seed=k)
            opt.tell(opt.ask(), np.zeros(4), eps)
        return before, softmax(shape3.unflatten(opt.params)[:3] @ h)

    before, after = train(+1.0)
    np.testing.assert_allclose(before, 1 / 3)
    assert after[1] > before[1] + 0.2, (before, after)
    assert after[0] < before[0] - 0.05 and after[2] < before[2] - 0.05, (before, after)
    before, after = train(-1.0)
    assert after[1] < before[1] - 0.15, (before, after)
    assert after[0] > before[0] + 0.05 and after[2] > before[2] + 0.05, (before, after)


def test_reinforce_ignores_forced_roles_and_needs_samples():
    shape = HeadShape(n_models=2, dim=4)
    h = np.array([1.0, 0.0, 0.0, 0.0])
    eps = _bandit_episodes(np.zeros((5, 4)), h, 500, lambda m, r: float(r == 1), forced=True)
    g = shape.unflatten(policy_gradient(shape, np.zeros(shape.n_params), eps))
    assert np.all(g[2:] == 0)  # the Thinker chose those roles, not the head
    eps[0].rng = None
    with pytest.raises(ValueError, match="sampled"):
        policy_gradient(shape, np.zeros(shape.n_params), eps)
    with pytest.raises(NotImplementedError, match="head only"):
        Reinforce(ParamLayout(shape, n_svf=7), popsize=4)


def test_random_search_is_deterministic_by_seed():
    a, b, c = (RandomSearch(50, 6, 0.1, seed=s) for s in (3, 3, 4))
    for gen in range(3):
        xa, xb, xc = a.ask(), b.ask(), c.ask()
        assert all(np.array_equal(u, v) for u, v in zip(xa, xb))
        assert not np.array_equal(xa[1], xc[1])
        assert np.array_equal(xa[0], a.params)  # candidate 0 re-evaluates the incumbent
        f = np.arange(6.0)[::-1] if gen == 1 else np.r_[0.0, np.arange(1.0, 6.0)]
        for o, x in ((a, xa), (b, xb), (c, xc)):
            o.tell(x, f, [])
        assert np.array_equal(a.params, xa[int(np.argmax(f))])
    x = a.ask()
    a.tell(x, np.zeros(6), [])  # a tie keeps the incumbent
    assert np.array_equal(a.params, x[0])


def test_generation_logger_logs_every_member_and_role():
    from trinity.stages.evolve import generation_logger as _generation_logger

    logged = []

    class Recorder:
        def log(self, metrics, step=None):
            logged.append((metrics, step))

    rec = GenerationRecord(generation=2, best_candidate_fitness=0.5, mean_fitness=0.25, sigma=0.03, calls_made=3, store_hits=9,
                           states_encoded=4, cost_usd=0.01, model_usage={"a": 5}, role_usage={"thinker": 0, "worker": 5,
                           "verifier": 0}, mean_accuracy=0.5, wall_s=1.0, method="sep_cma", episodes=8,
                           calls_per_episode=0.375, model_entropy=0.0, saved_fitness=0.2, saved_accuracy=0.25)
    _generation_logger(Recorder(), ["a", "b"])(rec)
    m, step = logged[0]
    assert step == 2
    for k in ("saved_fitness", "saved_accuracy", "best_candidate_fitness", "mean_fitness", "sigma", "calls_made", "store_hits", "cost_usd", "calls_per_episode",
              "model_entropy", "episodes", "store_hit_rate", "calls_total", "model_usage/a", "model_usage/b",
              "role_usage/thinker", "role_usage/verifier"):
        assert k in m, k
    assert m["model_usage/b"] == 0 and m["store_hit_rate"] == 0.75 and "method" not in m


# ----------------------------------------------------------------------------------------------- real

BASE = {
    "pool": SMOL_PAIR_POOL,
    "coordinator": SHORT_COORDINATOR,
    "evolve": {"generations": 2, "popsize": 4, "episodes_per_candidate": 2, "sigma0": 0.3, "reinforce_lr": 0.01},
}
TASKS = ARITHMETIC_TASKS


def _settings(method, **evolve):
    return Settings.model_validate({**BASE, "evolve": {**BASE["evolve"], "method": method, **evolve}})


@pytest.fixture(scope="module")
def encoder():
    from trinity.coordinator.encoder import TranscriptEncoder

    return TranscriptEncoder("smollm2-135m-instruct", max_tokens=384)


def test_methods_train_on_the_same_tasks_with_the_same_budget(tmp_path, encoder):
    from trinity.grading import grade
    from trinity.pool.runtime import build_pool

    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(_settings("sep_cma").pool, store)
        states, trees = StateCache(encoder, store), RolloutTrees()
        results = {}
        for method in ("sep_cma", "reinforce", "random_search"):
            s = _settings(method)
            results[method] = evolve(s, TASKS, pool, states, grade, store=store, run_id=method, trees=trees,
                                     resume_path=tmp_path / f"{method}.pkl")
        rows = store.con.execute("SELECT run_id, generation, candidate, task_id FROM episodes ORDER BY ALL").fetchall()
        # random search again from scratch, same seed: the same run (every call now stored)
        calls = pool.stats.calls_made
        again = evolve(_settings("random_search"), TASKS, pool, states, grade, trees=trees)
        assert pool.stats.calls_made == calls
        np.testing.assert_array_equal(again.params, results["random_search"].params)

    budget = 2 * 4 * 2
    for method, res in results.items():
        assert [r.episodes for r in res.history] == [8, 8] and [r.method for r in res.history] == [method] * 2
        mine = [r[1:] for r in rows if r[0] == method]
        assert len(mine) == budget
        for g in (0, 1):  # every candidate played the generation's minibatch, the same for every method
            want = {(g, c, t.id) for c in range(4) for t in minibatch(TASKS, 2, 0, g)}
            assert {r for r in mine if r[0] == g} == want
        assert set(res.history[0].model_usage) == {"smol-a", "smol-b"}
    assert not np.allclose(results["reinforce"].params, 0)  # it learned something (a non-zero gradient)
    assert results["reinforce"].history[0].sigma == 0.01

    # REINFORCE resumes: interrupted after generation 0, the same call again == the uninterrupted run
    class Interrupted(Exception):
        pass

    def stop_after_first(rec):
        if rec.generation == 0:
            raise Interrupted

    with Store(tmp_path / "s.duckdb") as store:
        pool = build_pool(_settings("sep_cma").pool, store)
        states = StateCache(encoder, store)
        ckpt = tmp_path / "resume.pkl"
        with pytest.raises(Interrupted):
            evolve(_settings("reinforce"), TASKS, pool, states, grade, resume_path=ckpt, on_generation=stop_after_first)
        resumed = evolve(_settings("reinforce"), TASKS, pool, states, grade, resume_path=ckpt)
        assert [r.generation for r in resumed.history] == [0, 1]
        np.testing.assert_array_equal(resumed.params, results["reinforce"].params)
        assert pool.stats.calls_made == 0
