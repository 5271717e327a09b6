"""Episode control flow: role parsing, Thinker override, Verifier-first, ACCEPT stop, reward shaping,
and that a population shares calls through the store. The pool member here is a scripted ChatModel
(the protocol is what is under test); test_pool_local.py runs the same loop on real models."""
import asyncio

import numpy as np
import pytest

from trinity.config import PoolMember, RewardSettings
from trinity.coordinator.episode import Episode, StateCache, model_pick_entropy, play_episodes, shaped_reward
from trinity.coordinator.head import HeadShape, route_probs
from trinity.coordinator.roles import Role, coordinator_text, parse_thinker, role_messages
from trinity.verdict import parse_verdict
from trinity.pool.runtime import Pool
from trinity.records import Task
from trinity.store import Store

from fixtures.scripted_pool import HashEncoder, ScriptedModel, TurnCountEncoder, scripted_head

TASK = Task(id="t/1", source="gsm8k", prompt=("What is 2+3?",), grader="math", answer="5")


def grade(task, text):
    return 1.0 if "\\boxed{5}" in text else 0.0


def make_pool(store, verdict="ACCEPT", suggested="worker"):
    """suggested=None: the Thinker's reply carries no <suggested_role> (the head's role pick stands)."""
    tag = "" if suggested is None else f"<suggested_role>{suggested}</suggested_role>"
    replies = {"worker": "2+3=5 so \\boxed{5}", "verifier": f"fine\nVerdict: {verdict}",
               "thinker": f"<suggestion>add</suggestion>{tag}"}
    models = [ScriptedModel("a", replies), ScriptedModel("b", replies)]
    settings = [PoolMember(name=m.name, backend="local", model="x") for m in models]
    return Pool(models, settings, store), models


def head_forcing(model: int, role: int, dim=8, n_models=2):
    """A head whose logits ignore h except through a constant-sign feature: use a huge bias-like weight."""
    W = np.zeros((n_models + 3, dim))
    return W, (model, role)


def test_parsers():
    assert parse_verdict("looks right\nVerdict: ACCEPT") == "ACCEPT"
    assert parse_verdict("wrong\n**Verdict:** REJECT") == "REJECT"
    assert parse_verdict("I think we should accept this") is None  # free text without the field: no verdict
    assert parse_verdict("hmm") is None
    s, r = parse_thinker("<suggestion>check units</suggestion>\n<suggested_role>verifier</suggested_role>")
    assert s == "check units" and r is Role.VERIFIER
    assert parse_thinker("no tags")[1] is None


def test_prompts_carry_context():
    from trinity.coordinator.roles import Turn
    turns = (Turn("a", Role.WORKER, "answer one"), Turn("b", Role.THINKER, "x", suggestion="try harder"))
    w = role_messages(Role.WORKER, TASK, turns)[-1].content
    assert "answer one" in w and "try harder" in w and "\\boxed" in w
    v = role_messages(Role.VERIFIER, TASK, turns)[-1].content
    assert "answer one" in v and "ACCEPT or REJECT" in v
    assert coordinator_text(TASK, turns).startswith("system: ") and "worker: answer one" in coordinator_text(TASK, turns)


def test_head_shape_and_probs():
    shape = HeadShape(n_models=7, dim=1024)
    assert shape.n_params == 10240
    with pytest.raises(ValueError, match="10240"):
        shape.unflatten(np.zeros(5))
    pm, pr = route_probs(np.zeros((10, 1024)), np.ones(1024), 7)
    np.testing.assert_allclose(pm, 1 / 7)
    np.testing.assert_allclose(pr, 1 / 3)


def _W(model, role, sign, dim=8):
    """Head that argmax-picks (model, role) for any h whose first coordinate has sign `sign`."""
    W = np.zeros((5, dim))
    W[model, 0] = 100 * sign
    W[2 + role, 0] = 100 * sign
    return W


def _run(eps, heads, pool, store, max_turns=3, reward=RewardSettings()):
    asyncio.run(play_episodes(eps, heads, pool, StateCache(HashEncoder(), store), max_turns, reward, grade))


def test_a_verifier_is_not_an_action_before_an_answer(tmp_path):
    """A head whose argmax is always the Verifier: while there is nothing to verify the Verifier is masked, so the
    first pick is the head's next role (here the Worker), and no episode ends before an answer."""
    with Store(tmp_path / "s.duckdb") as store:
        pool, models = make_pool(store)
        enc = HashEncoder()
        sign = np.sign(enc.encode([coordinator_text(TASK, ())])[0][0])
        W = _W(0, 2, sign)
        W[2 + 1, 0] = 50 * sign  # Worker second choice, Thinker last
        ep = Episode(task=TASK, candidate=0, rng=None)
        _run([ep], [W], pool, store)
        assert not ep.verifier_first and ep.turns[0].role is Role.WORKER
        assert [t.role for t in ep.turns] == [Role.WORKER, Role.VERIFIER]  # then the Verifier, which ACCEPTs
        assert ep.correct == 1.0 and ep.answer is not None
        # sampled: a Verifier is never drawn first, whatever the draw
        eps = [Episode(task=TASK, candidate=0, rng=np.random.default_rng(k)) for k in range(20)]
        _run(eps, [np.zeros((5, 8))], pool, store)
        assert all(e.picks[0][1] is not Role.VERIFIER for e in eps)
        assert all(e.answer is not None for e in eps if e.turns and any(t.role is Role.WORKER for t in e.turns))


def test_answer_rules():
    from trinity.coordinator.roles import ANSWER_RULES, Turn, returned_answer

    turns = (Turn("a", W_, "one"), Turn("b", V, "no", verdict="REJECT"), Turn("a", W_, "two"),
             Turn("b", V, "ok", verdict="ACCEPT"), Turn("a", W_, "three"), Turn("b", V, "no", verdict="REJECT"))
    assert returned_answer(turns, "latest") == "three"
    assert returned_answer(turns, "first") == "one"
    assert returned_answer(turns, "accepted_else_first") == "two"
    assert returned_answer(turns, "latest_unrejected") == "two"
    assert returned_answer((Turn("a", W_, "x", ok=False),), "first") is None
    assert all(returned_answer((), r) is None for r in ANSWER_RULES)
    with pytest.raises(ValueError, match="answer_rule"):
        returned_answer(turns, "best")


def test_first_answer_rule_ends_the_episode_at_its_first_answer(tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        pool, models = make_pool(store, verdict="REJECT")
        head = scripted_head([(0, W_), (1, W_), (0, W_)], 2)
        eps = {rule: Episode(task=TASK, candidate=0, rng=None) for rule in ("first", "latest")}
        for rule, ep in eps.items():
            asyncio.run(play_episodes([ep], [head], pool, StateCache(TurnCountEncoder(), store), 3, RewardSettings(),
                                      grade, answer_rule=rule))
        assert len(eps["first"].turns) == 1 and len(eps["latest"].turns) == 3
        assert eps["first"].answer == eps["latest"].turns[0].text


T, W_, V = Role.THINKER, Role.WORKER, Role.VERIFIER


def _scripted_episode(tmp_path, name, script, max_turns, verdict="ACCEPT", suggested="worker"):
    """One argmax episode of the scripted head on a scripted pool (own store: replies differ per scenario)."""
    with Store(tmp_path / f"{name}.duckdb") as store:
        pool, models = make_pool(store, verdict=verdict, suggested=suggested)
        ep = Episode(task=TASK, candidate=0, rng=None)
        asyncio.run(play_episodes([ep], [scripted_head(script, n_models=2)], pool, StateCache(TurnCountEncoder(), store),
                                  max_turns, RewardSettings(), grade))
    assert ep.done
    return ep, sum(m.calls for m in models)


def test_thinker_suggested_role_overrides_and_accept_stops(tmp_path):
    # (a) override. The head picks (b,T), (a,T), (b,W). Without a suggested role that is what is played.
    script = [(1, T), (0, T), (1, W_)]
    ep, _ = _scripted_episode(tmp_path, "plain", script, max_turns=3, suggested=None)
    assert [t.role for t in ep.turns] == [T, T, W_] and ep.picks == script
    # With <suggested_role>worker</suggested_role> the 2nd pick's role becomes Worker (the head's model stays), once:
    # the 3rd pick is the head's own again.
    ep, _ = _scripted_episode(tmp_path, "to-worker", script, max_turns=3, suggested="worker")
    assert [t.role for t in ep.turns] == [T, W_, W_]
    assert [t.model for t in ep.turns] == ["b", "a", "b"]
    assert ep.picks == [(1, T), (0, W_), (1, W_)]
    assert ep.correct == 1.0

    # (b) ACCEPT stops. The head picks W, V, W, V, W (max_turns 5): an ACCEPT ends the episode after turn 2
    # and no further call is made; a REJECT plays on to max_turns.
    script = [(0, W_), (1, V), (0, W_), (1, V), (0, W_)]
    ep, calls = _scripted_episode(tmp_path, "accept", script, max_turns=5, verdict="ACCEPT")
    assert [t.role for t in ep.turns] == [W_, V] and ep.turns[-1].verdict == "ACCEPT" and calls == 2
    assert len(ep.picks) == 2 and ep.correct == 1.0
    ep, _ = _scripted_episode(tmp_path, "reject", script, max_turns=5, verdict="REJECT")
    assert [t.role for t in ep.turns] == [W_, V, W_, V, W_] and len(ep.picks) == 5
    assert [t.verdict for t in ep.turns if t.role is V] == ["REJECT", "REJECT"]

    # Both at once: a Verifier the Thinker forced (over the head's Worker) ends the episode on ACCEPT.
    script = [(0, W_), (1, T), (0, W_), (0, W_), (1, T), (0, W_)]
    ep, _ = _scripted_episode(tmp_path, "forced-accept", script, max_turns=6, verdict="ACCEPT", suggested="verifier")
    assert [t.role for t in ep.turns] == [W_, T, V] and ep.turns[-1].verdict == "ACCEPT"
    ep, _ = _scripted_episode(tmp_path, "forced-reject", script, max_turns=6, verdict="REJECT", suggested="verifier")
    assert [t.role for t in ep.turns] == [W_, T, V, W_, T, V]


def test_reward_shaping():
    from trinity.coordinator.roles import Turn
    ep = Episode(task=TASK, candidate=0, rng=None)
    ep.turns = (Turn("a", Role.WORKER, "x"), Turn("b", Role.VERIFIER, "ACCEPT", verdict="ACCEPT"))
    ep.picks = [(0, Role.WORKER), (1, Role.VERIFIER)]
    ep.correct = 1.0
    r = shaped_reward(ep, max_turns=5, w=RewardSettings(diversity_weight=0.15, turn_penalty_weight=0.1, cost_weight=0.0))
    assert r == pytest.approx(1.0 + 0.15 * np.log(2) - 0.1 * (1 / 5) / 4)
    assert model_pick_entropy([(0, Role.WORKER)] * 3) == 0.0
    assert shaped_reward(ep, 5, RewardSettings()) == 1.0  # the default: the paper's binary objective
    ep.cost_usd = 2.0
    assert shaped_reward(ep, 5, RewardSettings(diversity_weight=0.15, turn_penalty_weight=0.1, cost_weight=0.5)) == pytest.approx(r - 1.0)
    # Local members: cost in thousands of tokens or in recorded seconds, from each turn's recorded usage.
    ep.turns = (Turn("a", Role.WORKER, "x", prompt_tokens=300, completion_tokens=200, latency_s=4.0),
                Turn("b", Role.VERIFIER, "ACCEPT", verdict="ACCEPT", prompt_tokens=400, completion_tokens=100,
                     latency_s=1.5))
    assert shaped_reward(ep, 5, RewardSettings(diversity_weight=0.15, turn_penalty_weight=0.1, cost_weight=0.5, cost_unit="ktokens")) == pytest.approx(r - 0.5)
    assert shaped_reward(ep, 5, RewardSettings(diversity_weight=0.15, turn_penalty_weight=0.1, cost_weight=0.1, cost_unit="seconds")) == pytest.approx(r - 0.55)
    assert shaped_reward(ep, 5, RewardSettings(diversity_weight=0.15, turn_penalty_weight=0.1, cost_weight=0.0, cost_unit="seconds")) == pytest.approx(r)


def test_population_shares_calls_and_rerun_is_free(tmp_path):
    rng = np.random.default_rng(0)
    heads = [rng.standard_normal((5, 8)) * 3 for _ in range(12)]
    tasks = [TASK, Task(id="t/2", source="gsm8k", prompt=("What is 1+4?",), grader="math", answer="5")]

    def play(store):
        pool, models = make_pool(store, verdict="REJECT")
        eps = [Episode(task=t, candidate=c, rng=np.random.default_rng([c, i])) for c in range(12)
               for i, t in enumerate(tasks)]
        _run(eps, heads, pool, store, max_turns=3)
        return eps, pool, sum(m.calls for m in models)

    with Store(tmp_path / "s.duckdb") as store:
        eps1, pool1, calls1 = play(store)
    played_turns = sum(len(e.turns) for e in eps1)
    assert 0 < calls1 < played_turns  # shared prefixes cost one call
    assert calls1 == pool1.stats.calls_made
    with Store(tmp_path / "s.duckdb") as store:
        eps2, pool2, calls2 = play(store)
    assert calls2 == 0 and pool2.stats.calls_made == 0
    assert [e.reward for e in eps1] == [e.reward for e in eps2]
    assert [e.path for e in eps1] == [e.path for e in eps2]
