"""The rollout tree's step rule (`trinity.coordinator.rollout.StepRule`), one case per mask, override and ending, and
the exact path enumerator on a tiny stored tree: its path probabilities sum to 1 (explored paths to 1 minus the
unexplored mass), its expected accuracy is the hand-computed one, and it is the mean of many episodes the loop plays."""
import asyncio

import numpy as np
import pytest

from trinity.config import PoolMember, RewardSettings
from trinity.coordinator.episode import Episode, RolloutTrees, StateCache, episode_rng, play_episodes
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.roles import ROLES, Role, Turn, coordinator_text, turn_of
from trinity.coordinator.rollout import ENDINGS, StepRule, enumerate_paths
from trinity.pool.runtime import Pool
from trinity.records import Task
from trinity.store import Store, text_key

from fixtures.scripted_pool import HashEncoder, ScriptedModel

TASK = Task(id="t/1", source="gsm8k", prompt=("What is 2+3?",), grader="math", answer="5")
ANSWER = Turn("a", Role.WORKER, "\\boxed{5}")
FAILED_ANSWER = Turn("a", Role.WORKER, "", ok=False, failure="deterministic")
OUTAGE = Turn("a", Role.WORKER, "", ok=False, failure="transient")


def thinker(suggested: Role | None) -> Turn:
    return Turn("b", Role.THINKER, "plan", suggestion="plan", suggested_role=suggested)


def mask(rule, turns):
    return {r for r, ok in zip(ROLES, rule.role_mask(turns)) if ok}


# ------------------------------------------------------------------------------------------------ the step rule

def test_verifier_is_masked_until_there_is_an_answer():
    rule = StepRule(max_turns=4)
    assert mask(rule, ()) == {Role.THINKER, Role.WORKER}
    assert mask(rule, (FAILED_ANSWER,)) == {Role.THINKER, Role.WORKER}  # a failed Worker call is no answer
    assert mask(rule, (ANSWER,)) == set(ROLES)


def test_roles_outside_the_coordinators_are_masked():
    rule = StepRule(max_turns=4, roles=(Role.WORKER, Role.VERIFIER))
    assert mask(rule, (ANSWER,)) == {Role.WORKER, Role.VERIFIER}
    with pytest.raises(ValueError, match="lack worker"):
        StepRule(max_turns=4, roles=(Role.THINKER,))


def test_a_thinkers_suggestion_overrides_the_next_pick():
    rule = StepRule(max_turns=4)
    assert rule.forced_role((thinker(Role.WORKER),)) is Role.WORKER
    assert rule.forced_role((ANSWER, thinker(Role.VERIFIER))) is Role.VERIFIER
    assert rule.forced_role((thinker(None),)) is None  # no suggestion: the head's role stands
    assert rule.forced_role((thinker(Role.WORKER), ANSWER)) is None  # only the turn just played forces


def test_no_verifier_forced_before_an_answer_nor_a_role_the_coordinator_lacks():
    assert StepRule(max_turns=4).forced_role((thinker(Role.VERIFIER),)) is None
    router_like = StepRule(max_turns=4, roles=(Role.WORKER, Role.THINKER))
    assert router_like.forced_role((ANSWER, thinker(Role.VERIFIER))) is None


def test_accept_ends_and_reject_does_not():
    rule = StepRule(max_turns=4)
    assert rule.ending((ANSWER, Turn("c", Role.VERIFIER, "ok", verdict="ACCEPT"))) == "accept"
    assert rule.ending((ANSWER, Turn("c", Role.VERIFIER, "no", verdict="REJECT"))) is None


def test_max_turns_ends():
    rule = StepRule(max_turns=2)
    assert rule.ending((thinker(Role.WORKER),)) is None
    assert rule.ending((thinker(Role.WORKER), thinker(Role.WORKER))) == "max_turns"


def test_the_first_answer_ends_under_answer_rule_first_only():
    first, latest = StepRule(max_turns=4, answer_rule="first"), StepRule(max_turns=4, answer_rule="latest")
    assert first.ending((ANSWER,)) == "first_answer"
    assert first.ending((FAILED_ANSWER,)) is None
    assert latest.ending((ANSWER,)) is None


def test_an_outage_ends_only_with_stop_on_outage():
    assert StepRule(max_turns=4, stop_on_outage=True).ending((OUTAGE,)) == "outage"
    assert StepRule(max_turns=4, stop_on_outage=False).ending((OUTAGE,)) is None


def test_what_an_episode_returns_follows_the_answer_rule():
    second = Turn("b", Role.WORKER, "\\boxed{6}")
    assert StepRule(max_turns=4, answer_rule="first").answer((ANSWER, second)) == ANSWER.text
    assert StepRule(max_turns=4, answer_rule="latest").answer((ANSWER, second)) == second.text
    assert StepRule(max_turns=4).answer((thinker(None),)) is None


# ------------------------------------------------------------------------------------------------ the enumerator

def grade(task, text):
    return 1.0 if "\\boxed{5}" in text else 0.0


def make_pool(store):
    """Two members: "good" answers right, "bad" wrong; both Thinkers suggest a Worker, both Verifiers ACCEPT."""
    def replies(answer):
        return {"worker": f"so \\boxed{{{answer}}}", "verifier": "fine\nVerdict: ACCEPT",
                "thinker": "<suggestion>add</suggestion><suggested_role>worker</suggested_role>"}
    models = [ScriptedModel("good", replies(5)), ScriptedModel("bad", replies(3))]
    return Pool(models, [PoolMember(name=m.name, backend="local", model="x") for m in models], store)


class StoredTree:
    """The task's rollout tree as the store holds it: states and replies found there, or unknown (None)."""

    def __init__(self, pool, store, states: StateCache):
        self.pool, self.store, self.states = pool, store, states
        self.memo = RolloutTrees()
        self.memo.bind(pool, RoleSampling())

    def state(self, turns):
        found = self.store.get_states(HashEncoder.encoder_id, [text_key(coordinator_text(TASK, turns))])
        return next(iter(found.values()), None)

    def child(self, turns, m, role):
        req = self.memo.request(self.pool, RoleSampling(), TASK, turns, m, role)
        resp = self.store.get_response(req.key)
        return None if resp is None else (turn_of(self.pool.names[m], role, resp), resp.cost_usd)


class AskedTree(StoredTree):
    """The same tree with every edge asked of the pool (and so stored) and every state encoded when unknown."""

    def state(self, turns):
        return self.states.raw_states([coordinator_text(TASK, turns)])[0]

    def child(self, turns, m, role):
        req = self.memo.request(self.pool, RoleSampling(), TASK, turns, m, role)
        (resp,) = asyncio.run(self.pool.complete_many([req]))
        return turn_of(self.pool.names[m], role, resp), resp.cost_usd


def play(pool, states, W, rule, n, seed=0):
    eps = [Episode(task=TASK, candidate=0, rng=episode_rng(seed, k)) for k in range(n)]
    asyncio.run(play_episodes(eps, [W], pool, states, rule.max_turns, RewardSettings(), grade,
                              roles=rule.roles, answer_rule=rule.answer_rule))
    return eps


def expected_accuracy(rule, W, tree, greedy=False):
    paths = list(enumerate_paths(rule, W[None], 2, tree.state, tree.child, greedy=greedy))
    acc = sum(p.prob[0] * grade(TASK, rule.answer(p.turns) or "") for p in paths if p.explored)
    unexplored = sum(p.prob[0] for p in paths if not p.explored)
    return acc, unexplored, paths


@pytest.fixture
def tree(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    pool = make_pool(store)
    states = StateCache(HashEncoder(), store)
    yield pool, states, StoredTree(pool, store, states)
    store.close()


def test_probabilities_sum_to_one_minus_the_unexplored_mass(tree):
    pool, states, stored = tree
    rule = StepRule(max_turns=3, answer_rule="latest")
    W = np.random.default_rng(1).normal(size=(5, HashEncoder.dim))
    play(pool, states, W, rule, 3)  # a few episodes: part of the tree is stored
    acc, unexplored, paths = expected_accuracy(rule, W, stored)
    total = sum(p.prob[0] for p in paths)
    explored = sum(p.prob[0] for p in paths if p.explored)
    assert total == pytest.approx(1.0, abs=1e-12)
    assert 0 < unexplored < 1 and explored == pytest.approx(1 - unexplored, abs=1e-12)
    assert {p.end for p in paths} <= set(ENDINGS) | {"unexplored", "missing_state"}


def test_expected_accuracy_matches_the_hand_computed_value(tree):
    """Zero head: uniform picks. answer_rule first, 2 turns: Worker first (1/2) ends at its answer, right with the
    good member (1/2); Thinker first (1/2) forces a Worker next, right with the good member (1/2): 1/4 + 1/4."""
    pool, states, stored = tree
    rule = StepRule(max_turns=2, answer_rule="first")
    W = np.zeros((5, HashEncoder.dim))
    play(pool, states, W, rule, 64)  # enough draws to store the whole (6-leaf) tree
    acc, unexplored, paths = expected_accuracy(rule, W, stored)
    assert unexplored == 0 and acc == pytest.approx(0.5, abs=1e-12)
    assert len(paths) == 6 and {p.end for p in paths} == {"first_answer", "max_turns"}
    assert all(p.picks[-1][1] is Role.WORKER for p in paths)  # the Thinker's suggestion was followed


def test_expected_accuracy_is_the_mean_of_the_loops_episodes(tree):
    pool, states, stored = tree
    rule = StepRule(max_turns=3, answer_rule="latest")
    W = np.random.default_rng(2).normal(size=(5, HashEncoder.dim)) * 3
    asked, _, _ = expected_accuracy(rule, W, AskedTree(pool, stored.store, states))  # stores the whole tree
    acc, unexplored, _ = expected_accuracy(rule, W, stored)
    assert unexplored == 0 and acc == pytest.approx(asked, abs=1e-12) and 0.2 < acc < 0.8
    eps = play(pool, states, W, rule, 4000, seed=2)
    mean = np.mean([e.correct for e in eps])
    se = max(np.sqrt(acc * (1 - acc) / len(eps)), 1e-3)
    assert abs(mean - acc) < 4 * se, (mean, acc)


def test_the_greedy_walk_is_the_loops_argmax_episode(tree):
    pool, states, stored = tree
    rule = StepRule(max_turns=3, answer_rule="latest")
    W = np.random.default_rng(3).normal(size=(5, HashEncoder.dim)) * 3
    argmax = Episode(task=TASK, candidate=0, rng=None)
    asyncio.run(play_episodes([argmax], [W], pool, states, rule.max_turns, RewardSettings(), grade,
                              roles=rule.roles, answer_rule=rule.answer_rule))
    acc, unexplored, paths = expected_accuracy(rule, W, stored, greedy=True)
    (only,) = [p for p in paths if p.prob[0] > 0]
    assert unexplored == 0 and only.prob[0] == 1.0
    assert list(only.picks) == argmax.picks and only.turns == argmax.turns and acc == argmax.correct
