"""coordinator.feature_norm: the head reads raw hidden states (the paper) or standardised ones plus a bias feature;
the map is fitted on the training tasks' root states, saved with the checkpoint and applied identically later,
while the store keeps raw states. Scripted pool and hash encoder: the plumbing is under test here (whether it
helps learning is bench/learnability.py's question)."""
from pathlib import Path

import numpy as np
import pytest

from trinity.config import load_settings
from trinity.coordinator.episode import Episode, RolloutTrees, StateCache, play_episodes
from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.coordinator.features import FeatureMap, features_json, fit_feature_map
from trinity.coordinator.roles import coordinator_text
from trinity.evolve.loop import evolve
from trinity.grading import grade
from trinity.store import Store, text_key

from trinity.evolve import known_answer as ka

from fixtures.scripted_pool import HashEncoder

ROOT = Path(__file__).resolve().parents[2]


def test_feature_map_standardises_and_adds_a_bias():
    rng = np.random.default_rng(0)
    H = rng.standard_normal((40, 6)) * [1, 2, 3, 4, 50, 0.001] + [0, 0, 0, 0, 30, 5]  # a massive, a dead dimension
    fmap = FeatureMap.fit(H)
    X = fmap(H)
    assert X.shape == (40, 7) and fmap.dim == 7
    assert np.allclose(X[:, :-1].mean(axis=0), 0, atol=1e-5)
    assert np.all(X[:, :-1].std(axis=0) < 1.0 + 1e-6)  # the median-variance floor never inflates a dimension
    assert X[:, 4].std() > 0.9 and X[:, 5].std() < 0.01  # the massive one tamed, the dead one not blown up
    assert np.all(X[:, -1] == pytest.approx(np.sqrt(6)))
    back = FeatureMap.from_json(fmap.to_json())
    assert np.array_equal(back(H), X)
    assert FeatureMap.from_json(None) is None and FeatureMap.from_json({"norm": "none"}) is None
    assert features_json(None) == {"norm": "none"}
    with pytest.raises(ValueError, match="at least 2"):
        FeatureMap.fit(H[:1])
    with pytest.raises(ValueError, match="expected one of"):
        fit_feature_map("whiten", None, [])


def test_standardized_training_saves_its_map_and_replays_identically(tmp_path):
    train = ka.make_tasks(2, 0, "train")
    settings = ka.known_answer_settings(load_settings(ROOT / "params.yaml"), {"feature_norm": "standardize"},
                                        generations=2, popsize=6, episodes_per_candidate=3, saved_fitness_tasks=3,
                                        saved_fitness_samples=1)
    pool = ka.make_pool(train)
    with Store(tmp_path / "s.duckdb") as store:
        states = StateCache(HashEncoder(), store)
        res = evolve(settings, train, pool, states, grade, trees=RolloutTrees())
        assert isinstance(res.features, FeatureMap) and states.dim == HashEncoder.dim + 1
        assert res.layout.head.dim == HashEncoder.dim + 1 and res.params.shape == ((4 + 3) * 9,)
        # The store keeps raw states (the map is applied on the way out).
        root = coordinator_text(train[0], ())
        raw = store.get_states(HashEncoder.encoder_id, [text_key(root)])[text_key(root)]
        assert raw.shape == (HashEncoder.dim,) and np.allclose(raw, HashEncoder().encode([root])[0])
        assert np.allclose(states.states([root])[0], res.features(raw[None])[0])
        # A later process (evaluate, `trinity ask`) rebuilds the map from the checkpoint's JSON and picks the same.
        meta = CheckpointMeta(pool=[], features=features_json(res.features))
        _, W = res.layout.split(res.params)

        def picks(cache):
            eps = [Episode(task=t, candidate=0, rng=None) for t in train]
            import asyncio
            asyncio.run(play_episodes(eps, [W], pool, cache, settings.coordinator.max_turns, settings.reward, grade))
            return [e.path for e in eps]

        fresh = StateCache(HashEncoder(), store, features=FeatureMap.from_json(meta.features))
        assert picks(fresh) == picks(states)
        # Raw features (the default) leave the head's width at the encoder's.
        raw_settings = ka.known_answer_settings(settings, {"feature_norm": "none"})
        states2 = StateCache(HashEncoder(), store)
        res2 = evolve(raw_settings, train, pool, states2, grade, trees=RolloutTrees())
        assert res2.features is None and res2.layout.head.dim == HashEncoder.dim
