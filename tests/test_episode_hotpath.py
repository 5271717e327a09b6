"""The optimised episode loop (memoised rollout trees, incremental transcript keys, one head product per
candidate per turn, batched pool lookups, inverse-CDF sampling) plays exactly the games the pre-optimisation
loop played (tests/reference_episode.py): same picks, turns, rewards and pool calls, with and without a
store, for sampled and argmax episodes; and the state keys it derives incrementally equal the hash of the
rendered transcript."""
import asyncio
import hashlib

import numpy as np
import pytest

from reference_episode import reference_play_episodes
from trinity.config import PoolMember, RewardSettings
from trinity.coordinator.episode import Episode, RolloutTrees, StateCache, episode_rng, episode_rngs, play_episodes
from trinity.coordinator.roles import coordinator_text
from trinity.pool.runtime import Pool
from trinity.records import ChatResponse, Task
from trinity.store import Store, text_key


class HashModel:
    """Deterministic replies that depend on the prompt, so rollout trees branch; some fail, some carry
    quotes, newlines, tabs and non-ASCII (the JSON escaping of incremental keys must match)."""

    def __init__(self, name):
        self.name, self.model_id, self.calls = name, f"hash:{name}", 0

    async def chat(self, messages, sampling):
        self.calls += 1
        text = messages[-1].content
        h = hashlib.sha256(f"{self.name}|{sampling}|{text}".encode()).digest()
        if h[4] % 11 == 0:
            return ChatResponse(text="", ok=False, error="boom", model=self.model_id)
        if "ACCEPT or REJECT" in text:
            reply = "looks \"right\"\nVerdict: ACCEPT" if h[0] % 2 else "no\n**Verdict:** REJECT"
        elif "<suggestion>" in text:
            role = ["worker", "verifier", "thinker", None][h[2] % 4]
            reply = f"<suggestion>try «{h[1]}»\nagain</suggestion>" + (f"<suggested_role>{role}</suggested_role>" if role else "")
        else:
            reply = f"Step {h[1]}: so \\boxed{{{h[3] % 7}}}\n"
        return ChatResponse(text=reply, model=self.model_id, prompt_tokens=len(text) // 4, completion_tokens=5,
                            cost_usd=1e-6 * (h[5] + 1))


class HashEncoder:
    encoder_id, dim = "hash-encoder", 16

    def encode(self, texts):
        return np.stack([np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], np.uint8).astype(np.float32) / 255 - 0.5
                         for t in texts])


TASKS = [Task(id=f"t/{i}", source="gsm8k", prompt=(q,), grader="math", answer="5")
         for i, q in enumerate(["What is 2+3?", "What is 1+4? \"quoted\"\nnew line", "Compute 10-5 — naïvely."])]


def grade(task, text):
    return 1.0 if "\\boxed{5}" in text else 0.0


def _pool(store):
    models = [HashModel("a"), HashModel("b"), HashModel("c")]
    return Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store,
                {"verifier": 8}), models


def _episodes(n_cand, sample=True, gen=0, bulk=False):
    """Sampled episodes get numpy Generators (episode_rng), or with bulk=True the streams evolve uses
    (episode_rngs: the same draws)."""
    pairs = [(c, t) for c in range(n_cand) for t in TASKS]
    if not sample:
        rngs = [None] * len(pairs)
    elif bulk:
        rngs = episode_rngs([(7, gen, c, t.id) for c, t in pairs])
    else:
        rngs = [episode_rng(7, gen, c, t.id) for c, t in pairs]
    return [Episode(task=t, candidate=c, rng=r) for (c, t), r in zip(pairs, rngs)]


def _summary(eps):
    return [(e.candidate, e.task.id, e.path, [(t.model, t.role, t.text, t.ok) for t in e.turns], e.reward, e.correct,
             round(e.cost_usd, 12), e.verifier_first, e.outage) for e in eps]


@pytest.mark.parametrize("with_store,stop_on_outage", [(True, False), (False, False), (True, True)])
def test_optimised_loop_equals_reference(tmp_path, with_store, stop_on_outage):
    rng = np.random.default_rng(3)
    heads = [rng.standard_normal((6, 16)) * s for s in (0.5, 2, 8, 30) for _ in range(6)]
    reward = RewardSettings(diversity_weight=0.15, turn_penalty_weight=0.1, cost_weight=0.5)
    trees = RolloutTrees()
    outages = 0
    for gen, sample in [(0, True), (1, True), (2, False)]:
        outs = {}
        for name in ("reference", "optimised"):
            store = Store(tmp_path / f"{name}-{with_store}.duckdb") if with_store else None
            try:
                pool, models = _pool(store)
                states = StateCache(HashEncoder(), store)
                eps = _episodes(len(heads), sample, gen, bulk=name == "optimised")
                if name == "reference":
                    asyncio.run(reference_play_episodes(eps, heads, pool, states, 4, reward, grade,
                                                        stop_on_outage=stop_on_outage))
                else:
                    asyncio.run(play_episodes(eps, heads, pool, states, 4, reward, grade, trees=trees,
                                              stop_on_outage=stop_on_outage))
                    for e in eps:  # incremental keys == hash of the rendered transcript
                        assert e.node.key == text_key(coordinator_text(e.task, e.turns))
                outs[name] = (_summary(eps), pool.stats.calls_made, pool.stats.store_hits,
                              [m.calls for m in models])
            finally:
                if store is not None:
                    store.close()
        assert outs["optimised"] == outs["reference"]
        assert outs["optimised"][1] > 0 or with_store
        outages += sum(row[-1] for row in outs["optimised"][0])
    assert outages  # some episodes hit an outage (HashModel's failures): the rule is exercised


def test_keep_features_records_each_pick(tmp_path):
    pool, _ = _pool(None)
    heads = [np.random.default_rng(c).standard_normal((6, 16)) for c in range(4)]
    eps = _episodes(4)
    asyncio.run(play_episodes(eps, heads, pool, StateCache(HashEncoder(), None), 4, RewardSettings(), grade,
                              keep_features=True))
    for e in eps:
        assert len(e.features) == len(e.picks) == len(e.forced)
        assert e.features[0].shape == (16,)
        assert not e.forced[0]  # nothing can force the first pick
