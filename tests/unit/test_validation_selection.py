"""Selection on validation, the warm start and the balanced fresh minibatch (trinity.evolve.validation, sep_cma).
The pool is scripted (one member always right, one always wrong: the protocol is under test, not model quality);
the optimiser, the episode loop, the masking and the answer rule are the real ones."""
import hashlib

import numpy as np
import pytest

from trinity.config import PoolMember, Settings
from trinity.coordinator.episode import RolloutTrees, StateCache
from trinity.evolve.loop import evolve, minibatch
from trinity.evolve import validation as val
from trinity.pool.runtime import Pool
from trinity.records import Task
from trinity.store import Store

from fixtures.scripted_pool import ScriptedModel


def grade(task, text):
    return 1.0 if "\\boxed{5}" in text else 0.0


class LMLikeEncoder:
    """Hash features plus a large shared component, like a language model's hidden states (all share a direction)."""
    encoder_id, dim = "lm-like-encoder", 8

    def encode(self, texts):
        h = np.stack([np.frombuffer(hashlib.sha256(t.encode()).digest(), dtype=np.uint8)[:8].astype(np.float32)
                      / 255 - 0.5 for t in texts])
        return h + 2.0


def tasks(prefix, n, sources=("math500", "mmlu")):
    return [Task(id=f"{prefix}/{s}/{i}", source=s, prompt=(f"{prefix} {s} {i}: what is 2+3?",), grader="math",
                 answer="5") for s in sources for i in range(n)]


def make_pool(store):
    right = {"worker": "2+3=5 so \\boxed{5}", "verifier": "ok\nVerdict: ACCEPT",
             "thinker": "<suggestion>add</suggestion><suggested_role>worker</suggested_role>"}
    wrong = dict(right, worker="\\boxed{7}")
    models = [ScriptedModel("wrong-1", wrong), ScriptedModel("right", right), ScriptedModel("wrong-2", wrong)]
    return Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store), models


def settings(**evolve):
    return Settings.model_validate({
        "pool": {"members": [{"name": n, "backend": "local", "model": "x"} for n in ("wrong-1", "right", "wrong-2")]},
        "coordinator": {"answer_rule": "first", "max_turns": 3},
        "evolve": {"popsize": 4, "generations": 2, "episodes_per_candidate": 4, "sigma0": 0.3,
                   "saved_fitness_tasks": 2, "saved_fitness_samples": 1, **evolve}})


def test_warm_start_is_the_best_member_and_selection_never_saves_worse(tmp_path):
    train, validation = tasks("train", 4), tasks("val", 3)
    with Store(tmp_path / "s.duckdb") as store:
        pool, models = make_pool(store)
        states = StateCache(LMLikeEncoder(), store)
        records = []
        r = evolve(settings(warm_start="best_member"), train, pool, states, grade, store=store,
                   validation=validation, on_generation=records.append)
        s = r.selection
        assert s["members"] == {"wrong-1": 0.0, "right": 1.0, "wrong-2": 0.0} and s["best_member"] == "right"
        assert s["start"] == 1.0 and s["selected"] == 1.0 and s["selected_from"] == "start"
        assert not s["beats_best_member"]  # equal is not better: the report must say so
        assert all(rec.validation_best_member == 1.0 and rec.validation_mean is not None for rec in records)
        # the saved vector is the start: its argmax policy is the best member as Worker, on any item
        layout = r.layout
        start = val.warm_start_head(layout, 1, states, train)
        np.testing.assert_array_equal(r.params, start)
        again = val.score_policy(r.params, layout, tasks("other", 2), settings(), pool, states, grade, RolloutTrees())
        assert again.accuracy == 1.0 and again.no_answer == 0.0


def test_without_warm_start_the_saved_vector_is_the_best_on_validation(tmp_path):
    train, validation = tasks("train", 4), tasks("val", 3)
    with Store(tmp_path / "s.duckdb") as store:
        pool, _ = make_pool(store)
        records = []
        r = evolve(settings(generations=3), train, pool, StateCache(LMLikeEncoder(), store), grade, store=store,
                   validation=validation, on_generation=records.append)
        scores = [r.selection["start"]] + [x for rec in records
                                           for x in (rec.validation_mean, rec.validation_best_candidate)]
        assert r.selection["selected"] == max(scores)
        assert [rec.validation_selected for rec in records] == [max(scores[:3 + 2 * g]) for g in range(3)]


def test_warm_start_needs_validation(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        pool, _ = make_pool(store)
        with pytest.raises(ValueError, match="data.validation"):
            evolve(settings(warm_start="best_member"), tasks("train", 2), pool, StateCache(LMLikeEncoder(), store),
                   grade)


def test_minibatch_is_fresh_each_generation_and_balanced_across_benchmarks():
    train = tasks("train", 40, sources=("math500", "mmlu", "mbpp"))
    batches = [minibatch(train, 12, 0, g) for g in range(4)]
    for b in batches:
        assert len(b) == 12 and len({t.id for t in b}) == 12
        assert sorted(np.unique([t.source for t in b], return_counts=True)[1]) == [4, 4, 4]
    assert len({tuple(t.id for t in b) for b in batches}) == 4
    assert minibatch(train, 12, 0, 2) == batches[2]  # fixed by (seed, generation): resumable
    uneven = tasks("u", 2, sources=("a",)) + tasks("u", 10, sources=("b",))
    assert sorted(t.source for t in minibatch(uneven, 6, 0, 0)) == ["a", "a", "b", "b", "b", "b"]
