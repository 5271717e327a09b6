"""An outage is not a sample, in training too: an episode one of whose calls failed transiently gets no reward
(never 0, never the diversity bonus), is left out of its candidate's fitness and counted; a candidate left with
no episode to be ranked on stops the run with an OutageError before anything of that generation is checkpointed;
evaluate raises one, after writing its results, when items are unscored by an outage; and the LLM-bound stage
tasks retry it. Scripted pool members (trinity.pool's contract: an outage comes back as a failed reply, it is not
raised) and a hash encoder: the protocol is under test, not model quality.

(Imports of names these rules added are inside the tests, after the behaviour is checked, so that the tests
show what the code before them did wrong instead of failing on an import.)"""
import asyncio
import json

import numpy as np
import pytest

from fixtures.scripted_pool import HashEncoder, ScriptedModel
from trinity.coordinator import policy
from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.stages import paths as stage_paths, run_stage
from trinity.config import CoordinatorSettings, EvolveSettings, PoolMember, PoolSettings, RewardSettings, Settings
from trinity.coordinator.episode import Episode, StateCache, episode_rng, play_episodes
from trinity.evolve import loop
from trinity.pool.runtime import Pool
from trinity.records import ChatResponse, Task
from trinity.store import Store

TASKS = [Task(id=f"t/{i}", source="math500", prompt=(f"What is {i}+5-{i}?",), grader="math", answer="5")
         for i in range(4)]
OUTAGE = ChatResponse(text="", ok=False, error="http 503: upstream failure 503", failure="transient")
DOWN = {"worker": OUTAGE, "thinker": OUTAGE, "verifier": OUTAGE}
GOOD = {"worker": "so \\boxed{5}", "verifier": "Looks fine.\nVerdict: REJECT",
        "thinker": "<suggestion>add</suggestion><suggested_role>worker</suggested_role>"}
WRONG = {**GOOD, "worker": "it is \\boxed{7}"}
WORKER_DOWN = {**WRONG, "worker": OUTAGE}
"""Member b's Worker calls are all outages; its Thinker and Verifier answer."""


def grade(task, text):
    return 1.0 if "\\boxed{5}" in (text or "") else 0.0


def _pool(store, models):
    return Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store)


def _scripted(*replies):
    return [ScriptedModel(n, r) for n, r in zip("ab", replies)]


def _settings(**evolve) -> Settings:
    ev = {"generations": 1, "popsize": 6, "episodes_per_candidate": 4, "sigma0": 0.5, "saved_fitness_tasks": 4,
          "saved_fitness_samples": 2, **evolve}
    return Settings(pool=PoolSettings(members=[PoolMember(name=n, backend="local", model="x") for n in "ab"]),
                    coordinator=CoordinatorSettings(max_turns=3), evolve=EvolveSettings(**ev))


def _hit_outage(e: Episode) -> bool:
    return any(t.failure == "transient" for t in e.turns)


# ------------------------------------------------------------------ the episode
def test_an_episode_hit_by_an_outage_gets_no_reward():
    """Every call an outage: no episode is rewarded (the issue: 14 of 40 earned the diversity bonus)."""
    pool = _pool(None, _scripted(DOWN, DOWN))
    rng = np.random.default_rng(0)
    heads = [rng.standard_normal((5, 8)) for _ in range(10)]
    eps = [Episode(task=t, candidate=c, rng=episode_rng(0, c, t.id)) for c in range(10) for t in TASKS]
    asyncio.run(play_episodes(eps, heads, pool, StateCache(HashEncoder(), None), 3, RewardSettings(), grade))
    called = [e for e in eps if e.turns]
    rewarded = [e.reward for e in called if e.reward is not None]
    assert not rewarded, (f"{sum(r > 0 for r in rewarded)} of {len(eps)} episodes whose every call was an outage "
                          f"earned a positive reward, {sum(r <= 0 for r in rewarded)} a reward <= 0")
    assert len(called) > 20 and all(e.outage for e in called)
    # an episode that made no call (a Verifier picked before any answer) is no outage: it scores 0 as ever
    assert all(e.verifier_first and e.reward == 0.0 and not e.outage for e in eps if not e.turns)


def test_an_outage_ends_the_episode_when_asked():
    """stop_on_outage (the training loops): no call is paid after the first outage of an episode."""
    models = _scripted(GOOD, WORKER_DOWN)
    pool = _pool(None, models)
    rng = np.random.default_rng(1)
    heads = [rng.standard_normal((5, 8)) for _ in range(10)]
    eps = [Episode(task=t, candidate=c, rng=episode_rng(1, c, t.id)) for c in range(10) for t in TASKS]
    asyncio.run(play_episodes(eps, heads, pool, StateCache(HashEncoder(), None), 3, RewardSettings(), grade,
                              stop_on_outage=True))
    out = [e for e in eps if _hit_outage(e)]
    assert out and all(e.outage and e.reward is None and e.turns[-1].failure == "transient" for e in out)
    assert all(not e.outage and e.reward is not None for e in eps if not _hit_outage(e))


# ------------------------------------------------------------------ training
_MAKE_OPTIMIZER = loop.make_optimizer


def _evolve_recording_tell(monkeypatch, s, pool, store=None):
    """One evolve run; returns (result, [(fitness, episodes) given to the optimiser's tell per generation])."""
    told = []

    def recording(settings, layout, x0=None):
        opt = _MAKE_OPTIMIZER(settings, layout, x0)
        tell = opt.tell

        def tell_and_record(X, fitness, episodes):
            told.append((np.array(fitness, dtype=float), list(episodes)))
            tell(X, fitness, episodes)

        opt.tell = tell_and_record
        return opt

    monkeypatch.setattr(loop, "make_optimizer", recording)
    res = loop.evolve(s, TASKS, pool, StateCache(HashEncoder(), store), grade, store=store)
    return res, told


@pytest.mark.parametrize("method", ["sep_cma", "random_search", "reinforce"])
def test_fitness_is_the_mean_over_the_episodes_free_of_outages(tmp_path, monkeypatch, method):
    """Member b's Worker is down for good: a candidate's fitness is the mean reward of its other episodes; the
    outage episodes are counted, kept out of the optimiser's update and out of the store's episodes table."""
    s = _settings(method=method, popsize=6)
    n_tasks = s.evolve.episodes_per_candidate
    with Store(tmp_path / "s.duckdb") as store:
        res, told = _evolve_recording_tell(monkeypatch, s, _pool(store, _scripted(GOOD, WORKER_DOWN)), store)
        rows = store.con.execute("SELECT candidate, reward FROM episodes").fetchall()
    (fitness, episodes), = told
    clean = [e for e in episodes if not _hit_outage(e)]
    per = [[e.reward for e in clean if e.candidate == c] for c in range(len(fitness))]
    expected = np.array([np.mean(r) for r in per])
    assert fitness == pytest.approx(expected), "a candidate's fitness is not the mean over its clean episodes"
    assert len(clean) == len(episodes), "the optimiser was told about episodes hit by an outage"
    assert sorted((c, round(r, 9)) for c, r in rows) == sorted((e.candidate, round(e.reward, 9)) for e in clean)
    rec = res.history[0]
    assert rec.outage_episodes == len(fitness) * n_tasks - len(clean) > 0
    assert any(0 < len(r) < n_tasks for r in per)  # the rule was exercised: candidates with and without outages
    assert rec.mean_fitness == pytest.approx(expected.mean())
    assert rec.mean_accuracy == pytest.approx(np.mean([e.correct for e in clean]))
    assert rec.outage_replays == 2 * rec.outage_episodes  # replayed twice each: b's Worker never comes back
    assert rec.saved_outage_episodes > 0


def test_the_saved_vectors_score_leaves_outages_out(tmp_path):
    s = _settings()
    scoring = loop.saved_fitness_episodes(s, TASKS)
    pool = _pool(None, _scripted(GOOD, WORKER_DOWN))
    states = StateCache(HashEncoder(), None)
    layout = loop.param_layout(s, len(pool), states)
    params = np.random.default_rng(4).standard_normal(layout.n_params) * 0.5
    own = loop.score_params(params, layout, scoring, s, pool, states, grade, loop.RolloutTrees())
    # the same episodes played plainly: those free of outages are the same games either way
    eps = [Episode(task=t, candidate=0, rng=episode_rng(s.evolve.seed, "saved-fitness", k, t.id)) for t, k in scoring]
    asyncio.run(play_episodes(eps, [layout.split(params)[1]], pool, states, 3, s.reward, grade,
                              answer_rule=s.coordinator.answer_rule))
    clean = [e for e in eps if not _hit_outage(e)]
    assert 0 < len(clean) < len(eps)
    assert own[0] == pytest.approx(np.mean([e.reward for e in clean]))
    assert own[1] == pytest.approx(np.mean([e.correct for e in clean]))
    assert own[2] == len(eps) - len(clean)


class FlakyModel(ScriptedModel):
    """Its first `fail_first` calls are outages; then it answers as scripted."""

    def __init__(self, name, replies, fail_first):
        super().__init__(name, replies)
        self.fail_first = fail_first

    async def chat(self, messages, sampling):
        if self.calls < self.fail_first:
            self.calls += 1
            return OUTAGE
        return await super().chat(messages, sampling)


def test_a_brief_outage_is_replayed_within_the_generation(monkeypatch):
    """A member down for its first few calls: the generation replays the outage episodes (only the failed calls
    are asked again) and ends exactly as with no outage at all."""
    s = _settings(generations=2)
    clean_res, clean_told = _evolve_recording_tell(monkeypatch, s, _pool(None, _scripted(GOOD, WRONG)))
    flaky = [ScriptedModel("a", GOOD), FlakyModel("b", WRONG, fail_first=3)]
    res, told = _evolve_recording_tell(monkeypatch, s, _pool(None, flaky))
    assert len(told) == len(clean_told) == 2
    assert all(np.allclose(f, g) for (f, _), (g, _) in zip(told, clean_told))
    assert np.array_equal(res.params, clean_res.params)
    assert [h.saved_fitness for h in res.history] == [h.saved_fitness for h in clean_res.history]
    assert res.history[0].outage_replays > 0 and res.history[0].outage_episodes == 0
    assert sum(h.outage_replays for h in clean_res.history) == 0


def test_a_candidate_left_without_a_clean_episode_stops_the_run(tmp_path, monkeypatch):
    """Every call an outage: the generation cannot rank its candidates honestly. It stops with an OutageError that
    names the members and says a rerun asks only the failed calls again; nothing of it is checkpointed."""
    s = _settings(generations=2)
    resume = tmp_path / "state.pkl"
    models = _scripted(DOWN, DOWN)
    with Store(tmp_path / "s.duckdb") as store:
        with pytest.raises(RuntimeError, match="outage") as err:
            loop.evolve(s, TASKS, _pool(store, models), StateCache(HashEncoder(), store), grade,
                           resume_path=resume, store=store)
        assert store.con.execute("SELECT count(*) FROM episodes").fetchone()[0] == 0
    from trinity.coordinator.episode import OutageError

    assert isinstance(err.value, OutageError)
    msg = str(err.value)
    assert "generation 0" in msg and "a: " in msg and "b: " in msg and "only the failed calls again" in msg
    assert not resume.exists()
    assert sum(m.calls for m in models) > s.evolve.popsize  # the outage episodes were replayed before giving up


# ------------------------------------------------------------------ the stage tasks' retry
def test_the_llm_bound_stage_tasks_retry_an_outage_never_bad_input():
    from prefect.states import exception_to_failed_state

    from trinity.coordinator.episode import OutageError
    from trinity.ops.stage_flow import LLM_BOUND_RETRIES, retry_unless_bad_input

    assert LLM_BOUND_RETRIES["retry_condition_fn"] is retry_unless_bad_input and LLM_BOUND_RETRIES["retries"] >= 1
    def failed(exc):  # the state the task engine makes of a task that raised
        return asyncio.run(exception_to_failed_state(exc))

    assert retry_unless_bad_input(None, None, failed(OutageError("3 items unscored by an outage")))
    for bad in (ValueError("evolve.popsize"), FileNotFoundError("data/prepared/train.jsonl")):
        assert not retry_unless_bad_input(None, None, failed(bad))


def _evaluate_setup(tmp_path, monkeypatch):
    from trinity.data.splits import save_tasks

    paths = stage_paths.Paths(tmp_path)
    train = [Task(id=f"tr/{i}", source="math500", prompt=(f"Train {i}: what is 2+3?",), grader="math", answer="5")
             for i in range(2)]
    paths.prepared.mkdir(parents=True)
    for split, tasks in (("train", train), ("in_distribution", TASKS[:3]), ("heldout", []), ("validation", [])):
        save_tasks(paths.prepared / stage_paths.SPLIT_FILES[split], tasks)
    settings = Settings(pool=PoolSettings(members=[
        PoolMember(name=n, backend="local", model="smollm2-135m-instruct") for n in "ab"]),
        coordinator=CoordinatorSettings(max_turns=2))
    policy.save_checkpoint(paths.checkpoint, np.zeros(5 * HashEncoder.dim), CheckpointMeta.model_validate(
        {"pool": [{"name": n, "model_id": f"scripted:{n}"} for n in "ab"], "svf_layer": None,
         "encoder": HashEncoder.encoder_id}))
    monkeypatch.setattr(policy, "make_encoder", lambda s: HashEncoder())
    return paths, settings


def test_evaluate_raises_an_outage_after_writing_its_results(tmp_path, monkeypatch):
    """Member b's Worker down: its `alone:b` items are unscored by the outage. The stage writes every result, then
    raises (retryable); the rerun, b back, asks only what was not stored and scores every item."""
    paths, settings = _evaluate_setup(tmp_path, monkeypatch)
    pools = []

    def build(replies):
        def build_pool(pool_settings, store, executor=None):
            pools.append(Pool(_scripted(*replies), pool_settings.members, store, executor))
            return pools[-1]
        return build_pool

    monkeypatch.setattr("trinity.pool.runtime.build_pool", build((GOOD, WORKER_DOWN)))
    with pytest.raises(RuntimeError, match="outage") as err:
        run_stage("evaluate", settings, paths)
    from trinity.coordinator.episode import OutageError

    assert isinstance(err.value, OutageError)
    rows = [json.loads(line) for line in (paths.eval_dir / "episodes.jsonl").read_text().splitlines()]
    out = [r for r in rows if (r["error"] or "").startswith("outage:")]
    assert {r["method"] for r in out} >= {"alone:b"} and all(r["score"] is None for r in out)
    assert (paths.eval_dir / "results.json").exists() and paths.metrics("evaluate").exists()
    msg = str(err.value)
    assert f"{len(out)} of {len(rows)} items unscored by an outage" in msg and "b: " in msg
    assert "alone:b: 3" in msg and "only the failed calls again" in msg

    first = pools[-1].stats
    monkeypatch.setattr("trinity.pool.runtime.build_pool", build((GOOD, WRONG)))
    run_stage("evaluate", settings, paths)  # the retry: b is back
    again = pools[-1].stats
    rows = [json.loads(line) for line in (paths.eval_dir / "episodes.jsonl").read_text().splitlines()]
    assert all(r["score"] is not None for r in rows)
    assert again.store_hits > 0 and 0 < again.calls_made < first.calls_made
