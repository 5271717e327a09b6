"""Episodes: the coordinator routes a task through the pool turn by turn.

Many episodes (a whole CMA-ES population x a minibatch of tasks) are played together, one turn at a time.
`play_episodes` reads top to bottom as the method does, for every active episode at once:

1. encode  — the hidden state of each transcript (`StateCache`: memory, then the store, then the encoder, in
             one batch; with SVF each candidate's transcripts under its own adapter);
2. pick    — the head's model and role distributions (z = W h: one matrix product per candidate), and the
             (model, role) drawn from them with the episode's own generator (`Generator.choice`, model first,
             then role) or their argmax; a Thinker's suggested role overrides the drawn role. A Verifier is
             not an available action while there is no answer to verify (masked like a role the coordinator
             may not pick): no episode can end before an answer (masks and overrides: `rollout.StepRule`);
3. call    — every request of the turn in one `pool.complete_many` (stored or shared requests cost no call);
4. parse   — each reply becomes a `Turn` (`roles.turn_of`); an ACCEPT or `max_turns` ends the episode (and, under
             the answer rule "first", the first answer: nothing after it could change what is returned;
             `rollout.StepRule.ending`, the rule the diagnosis's exact path enumerator follows too);
5. grade   — the episode's answer (`roles.returned_answer` under `coordinator.answer_rule`), once it has ended;
6. reward  — `shaped_reward`: correctness (the paper's binary objective, the default) + the optional diversity
             bonus − turn penalty − cost (`reward.*`, all 0 by default).

Memoisation is a layer under the loop, not part of it: `RolloutTrees` remembers, for the whole run, each
request's messages and store key and each answer's grade (a population walks the same rollout tree of every
task again and again), so a generation on stored trees costs lookups. Results are the same with or without it.

An outage is not a sample (docs/reproducibility.md, "An outage is not a sample"): an episode one of whose calls failed transiently
(`Turn.failure == "transient"`) is marked `outage` and gets no reward (None, never 0 or a diversity bonus); its
reply says nothing about the route, so the training loops leave it out of every fitness and count it
(`trinity.evolve.loop`). With `stop_on_outage` (the training loops) it ends at the failed call, so no further
call is paid for an episode that cannot count.
"""
from __future__ import annotations

import json
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from trinity.config import RewardSettings
from trinity.coordinator.head import pick_probs
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.roles import ROLES, Role, Turn, coordinator_text, returned_answer, role_messages, turn_of
from trinity.coordinator.rollout import StepRule, is_outage
from trinity.pool.runtime import Request
from trinity.records import Task, stable_hash
from trinity.store import REPLAY_ENV, ReplayMiss, Store, replay_only, text_key


class OutageError(RuntimeError):
    """A stage left work unscored because pool calls failed transiently (an outage: 429, 5xx, timeout...).
    Nothing computed is lost: every reply is in the store, and outages never are, so a rerun asks only the failed
    calls again. A RuntimeError, not bad input: the LLM-bound stage tasks retry it (`trinity.ops.stage_flow`)."""


class StateCache:
    """Hidden states of transcripts: in memory, then the store, then the encoder (in one batch).

    States are kept per `encoder.encoder_id`. Without SVF that is one id for the whole run. With SVF every
    candidate's δ is an adapter with its own id (the store keys differ, so a rerun finds them); the
    in-memory maps of the `max_adapters` most recently used ids are kept, older ones are dropped (their
    vectors stay in the store).

    `features`: the map from hidden states to what the head reads (`coordinator.features.FeatureMap`, e.g.
    standardisation); None = the raw states (the paper). Lookups return mapped features; the store and the
    in-memory maps keep raw states (`raw_states`).
    """

    def __init__(self, encoder, store: Store | None, max_adapters: int = 64, features=None):
        self.encoder = encoder
        self.store = store
        self.features = features
        self.max_adapters = max_adapters
        self._mems: OrderedDict[str, dict[str, np.ndarray]] = OrderedDict()
        self._adapter: bytes | None = None
        self.encoded = 0  # transcripts actually run through the encoder

    @property
    def dim(self) -> int:
        """Width of what the head reads (the encoder's hidden size, or the feature map's)."""
        return self.encoder.dim if self.features is None else self.features.dim

    def _mem(self, encoder_id: str) -> dict[str, np.ndarray]:
        mem = self._mems.get(encoder_id)
        if mem is None:
            mem = self._mems[encoder_id] = {}
            while len(self._mems) > self.max_adapters + 1:
                self._mems.popitem(last=False)
        elif len(self._mems) > 1:
            self._mems.move_to_end(encoder_id)
        return mem

    def set_adapter(self, delta: np.ndarray) -> None:
        """Put the encoder on SVF scales δ (a no-op when it already is)."""
        d = np.ascontiguousarray(delta, dtype=np.float32)
        b = d.tobytes()
        if b != self._adapter:
            self.encoder.set_svf_delta(d)
            self._adapter = b

    def states(self, texts: Sequence[str]) -> np.ndarray:
        """What the head reads for these transcripts (mapped by `features` when set)."""
        return self.lookup([text_key(t) for t in texts], texts.__getitem__)

    def raw_states(self, texts: Sequence[str]) -> np.ndarray:
        """The encoder's hidden states of these transcripts, unmapped."""
        return self._raw_lookup([text_key(t) for t in texts], texts.__getitem__)

    def lookup(self, keys: Sequence[str], render: Callable[[int], str], adapter: np.ndarray | None = None) -> np.ndarray:
        """What the head reads for transcripts given by key; `render(i)` gives transcript i's text, called only
        for the ones that must be encoded. `adapter`: SVF scales to encode with (None = the encoder as it is)."""
        H = self._raw_lookup(keys, render, adapter)
        return H if self.features is None else self.features(H)

    def _raw_lookup(self, keys: Sequence[str], render: Callable[[int], str],
                    adapter: np.ndarray | None = None) -> np.ndarray:
        if adapter is not None:
            self.set_adapter(adapter)
        enc_id = self.encoder.encoder_id
        mem = self._mem(enc_id)
        missing = [k for k in dict.fromkeys(keys) if k not in mem]
        if missing and self.store is not None:
            mem.update(self.store.get_states(enc_id, missing))
        todo: dict[str, str] = {}
        if missing:
            for i, k in enumerate(keys):
                if k not in mem and k not in todo:
                    todo[k] = render(i)
        if todo and replay_only():
            raise ReplayMiss(f"replay ({REPLAY_ENV}=1): {len(todo)} transcript state(s) of encoder {enc_id} not in "
                             f"the store: the imported segments were computed by another encoder (its id names the "
                             f"dtype: TRINITY_ENCODER_AUTO_DTYPE picks the run's), or the run differs")
        if todo:
            vecs = np.asarray(self.encoder.encode(list(todo.values())), dtype=np.float32)
            self.encoded += len(todo)
            if self.store is not None:
                self.store.put_states(enc_id, list(todo), vecs)
            for k, v in zip(todo, vecs):
                mem[k] = v
        return np.stack([mem[k] for k in keys]) if len(keys) else np.zeros((0, self.encoder.dim), np.float32)


@dataclass
class Episode:
    task: Task
    candidate: int
    rng: np.random.Generator | None
    """The generator the picks are drawn from (`episode_rng`: fixed by seed, generation, candidate, task);
    None → the argmax policy."""
    turns: tuple[Turn, ...] = ()
    picks: list[tuple[int, Role]] = field(default_factory=list)
    answer_rule: str = "latest"
    """Which Worker answer the episode returns (`roles.returned_answer`); `play_episodes` sets it from its caller's
    `coordinator.answer_rule`."""
    verifier_first: bool = False
    """A Verifier was picked before any answer. Never, since a Verifier is masked until there is an answer; kept in
    the records (data/eval/episodes.jsonl) so that runs before that rule still read."""
    done: bool = False
    cost_usd: float = 0.0
    correct: float = 0.0
    """The grade of `answer` (of the answer it had before the outage, for an outage episode: descriptive only)."""
    reward: float | None = 0.0
    """The shaped reward; None for an outage episode (not a sample: it is no evidence about the route)."""
    outage: bool = False
    """A call of this episode failed transiently (an outage): the episode is left out of every fitness."""
    features: list[np.ndarray] = field(default_factory=list, repr=False)
    """With keep_features: the hidden state each pick was made from (for policy gradients)."""
    forced: list[bool] = field(default_factory=list, repr=False)
    """With keep_features: whether each pick's role was the Thinker's override (not the head's draw)."""
    role_allowed: list[np.ndarray] = field(default_factory=list, repr=False)
    """With keep_features: the roles each pick could draw (a boolean per `ROLES`; the policy's role distribution is
    the softmax over these)."""

    @property
    def answer(self) -> str | None:
        """The episode's answer (`roles.returned_answer` under `answer_rule`): what was graded, and what is exported
        and printed. None when no Worker succeeded (the episode scores 0)."""
        return returned_answer(self.turns, self.answer_rule)

    @property
    def path(self) -> list[list[str]]:
        return [[str(m), r.value] for m, r in self.picks]

    @property
    def path_json(self) -> str:
        """The path as the store's episodes table and the traces keep it."""
        return json.dumps(self.path)


def episode_rng(*seed_parts: int | str) -> np.random.Generator:
    """A generator fixed by (seed, generation, candidate, task...): resumable and order-independent. A string
    part (a task id) enters as the first 48 bits of its stable hash."""
    return np.random.default_rng([int(p) if isinstance(p, int) else int(stable_hash(p)[:12], 16)
                                  for p in seed_parts])


# ---------------------------------------------------------------------------------------------------- reward

def entropy_of_counts(counts: Sequence[int]) -> float:
    """Entropy (nats) of a distribution given by counts (e.g. how often each model was picked)."""
    n = sum(counts)
    return max(0.0, -sum(c / n * math.log(c / n) for c in counts if c)) if n else 0.0


def model_pick_entropy(picks: Sequence[tuple[int, Role]]) -> float:
    """Entropy of the models an episode picked: the diversity bonus's measure."""
    return entropy_of_counts(list(Counter(m for m, _ in picks).values()))


def episode_cost(ep: Episode, unit: str) -> float:
    """What an episode's calls cost, in `reward.cost_unit`: usd, ktokens (prompt + completion) or seconds."""
    if unit == "usd":
        return ep.cost_usd
    if unit == "ktokens":
        return sum(t.prompt_tokens + t.completion_tokens for t in ep.turns) / 1000
    if unit == "seconds":
        return sum(t.latency_s for t in ep.turns)
    raise ValueError(f"reward.cost_unit {unit!r}: expected usd, ktokens or seconds")


def shaped_reward(ep: Episode, max_turns: int, w: RewardSettings) -> float | None:
    """Correctness + diversity bonus − turn penalty − cost (DESIGN.md; the paper's objective is correctness alone,
    the default: every weight 0); an episode hit by an outage → None (no reward at all: not a sample)."""
    if ep.outage:
        return None
    n_turns = len(ep.turns)
    return (ep.correct + w.diversity_weight * model_pick_entropy(ep.picks)
            - w.turn_penalty_weight * ((max(n_turns, 1) - 1) / max_turns) / 4
            - (w.cost_weight * episode_cost(ep, w.cost_unit) if w.cost_weight else 0.0))


# ---------------------------------------------------------------------------------------------------- memo

class RolloutTrees:
    """The rollout trees a run walks, remembered: a population plays the same transcripts (the nodes of each
    task's tree) again and again, so what a node's step costs to derive is derived once per run — the request
    of each (transcript, model, role) edge (its role messages and response-store key) and the grade of each
    answer. Pass the same object to every `play_episodes` call of a run. A pure cache: the loop computes the
    same things without it. The request keys belong to one pool configuration (model ids and sampling);
    binding another pool forgets them.
    """

    def __init__(self):
        self._requests: dict[tuple, Request] = {}
        self._grades: dict[tuple, float] = {}
        self._pool_signature = None

    def bind(self, pool, role_sampling: RoleSampling) -> None:
        sig = role_sampling.signature(pool) if hasattr(pool, "signature") else id(pool)
        if sig != self._pool_signature:
            self._requests.clear()
            self._pool_signature = sig

    def request(self, pool, role_sampling: RoleSampling, task: Task, turns: tuple[Turn, ...], model: int,
                role: Role) -> Request:
        """What member `model` is asked in `role` after `turns`: `roles.role_messages` under its store key, with
        the role's sampling (`role_sampling`)."""
        k = (task, turns, model, role, role_sampling)
        r = self._requests.get(k)
        if r is None:
            r = self._requests[k] = role_sampling.request(pool, model, role_messages(role, task, turns), role)
        return r

    def grade(self, grade: Callable[[Task, str], float], task: Task, answer: str) -> float:
        """`grade(task, answer)` as a float (each distinct answer graded once per run)."""
        k = (grade, task, answer)
        g = self._grades.get(k)
        if g is None:
            g = self._grades[k] = float(grade(task, answer))
        return g


# ---------------------------------------------------------------------------------------------------- the loop

def pick(rng: np.random.Generator | None, p_model: np.ndarray, p_role: np.ndarray) -> tuple[int, int]:
    """(model, role index) from the head's two distributions: drawn with the episode's generator — the model
    first, then the role, one `Generator.choice` each (one uniform each, inverse CDF) — or, when rng is None,
    the argmax of each."""
    if rng is None:
        return int(np.argmax(p_model)), int(np.argmax(p_role))
    return int(rng.choice(len(p_model), p=p_model)), int(rng.choice(len(p_role), p=p_role))


async def play_episodes(episodes: Sequence[Episode], heads: Sequence[np.ndarray], pool, states: StateCache,
                        max_turns: int, reward: RewardSettings, grade: Callable[[Task, str], float], *,
                        adapters: Sequence[np.ndarray] | None = None, trees: RolloutTrees | None = None,
                        keep_features: bool = False, stop_on_outage: bool = False,
                        roles: Sequence[Role] = ROLES, answer_rule: str = "latest",
                        role_sampling: RoleSampling = RoleSampling()) -> None:
    """Play every episode to the end, in place. `heads[c]` is the (L+3) x d matrix of candidate c.

    adapters: SVF scales per candidate (`adapters[c]`); each candidate's transcripts are then encoded with
        its own δ (episodes grouped by candidate). None = one encoder for everyone.
    trees: the run's memo (`RolloutTrees`; a fresh one if None: memoisation within this call only).
    keep_features: record each pick's hidden state in `Episode.features` (REINFORCE needs them).
    stop_on_outage: end an episode at its first outage (the training loops: the episode cannot count, so no
        further call is paid for it). Either way an outage marks the episode (`outage`, reward None).
    roles: the roles the head may pick (`coordinator.roles`); the others get probability 0 (a Thinker's suggestion
        of one is ignored). All three: the paper's coordinator; Worker alone with one turn: the learned router. A
        Verifier is also masked while an episode has no answer (nothing to verify), so Worker must be among them.
    answer_rule: which Worker answer each episode returns (`roles.returned_answer`); the stages pass
        `coordinator.answer_rule`.
    role_sampling: what each role asks of a member (its token cap and output format); the stages pass
        `RoleSampling.of(settings)`. The default caps no role.
    """
    n_models = len(pool)
    rule = StepRule(max_turns, tuple(roles), answer_rule, stop_on_outage)  # what a turn may do, when it ends
    memo = RolloutTrees() if trees is None else trees
    memo.bind(pool, role_sampling)
    for e in episodes:
        e.answer_rule = answer_rule
    active = [e for e in episodes if not e.done]
    while active:
        by_candidate: dict[int, list[int]] = {}
        for i, e in enumerate(active):
            by_candidate.setdefault(e.candidate, []).append(i)

        # 1. encode: every active transcript's hidden state, one batch (per candidate's adapter with SVF)
        texts = [coordinator_text(e.task, e.turns) for e in active]
        keys = [text_key(t) for t in texts]
        if adapters is None:
            H = states.lookup(keys, texts.__getitem__)
        else:
            H = np.empty((len(active), states.dim), dtype=np.float32)
            for c, ix in by_candidate.items():
                H[ix] = states.lookup([keys[i] for i in ix], lambda j, ix=ix: texts[ix[j]], adapter=adapters[c])

        # 2. pick: z = W h under each episode's candidate head, softmax over models and over roles, then the draw
        H64 = H.astype(np.float64)
        Z = np.empty((len(active), n_models + 3))
        for c, ix in by_candidate.items():
            Z[ix] = H64[ix] @ np.asarray(heads[c], dtype=np.float64).T
        role_allowed = rule.role_masks([e.turns for e in active])  # no Verifier before an answer
        P_model, P_role = pick_probs(Z, n_models, role_allowed)
        requests, asked = [], []
        for i, e in enumerate(active):
            m, r = pick(e.rng, P_model[i], P_role[i])
            role = ROLES[r]
            suggested = rule.forced_role(e.turns)
            forced = suggested is not None
            if forced:  # the Thinker's suggested_role overrides the head's role pick
                role = suggested
            e.picks.append((m, role))
            if keep_features:
                e.features.append(H[i])
                e.forced.append(forced)
                e.role_allowed.append(role_allowed[i])
            requests.append(memo.request(pool, role_sampling, e.task, e.turns, m, role))
            asked.append((e, m, role))

        # 3. call: the whole turn's requests at once (stored or repeated ones cost no call)
        replies = await pool.complete_many(requests) if requests else []

        # 4. parse: each reply is the episode's next turn
        for (e, m, role), resp in zip(asked, replies):
            turn = turn_of(pool.names[m], role, resp)
            e.turns += (turn,)
            e.cost_usd += resp.cost_usd
            if is_outage(turn):
                e.outage = True
            if rule.ending(e.turns) is not None:
                e.done = True
        active = [e for e in active if not e.done]

    # 5. grade and 6. reward
    for e in episodes:
        e.correct = 0.0 if e.answer is None else memo.grade(grade, e.task, e.answer)
        e.reward = shaped_reward(e, max_turns, reward)
