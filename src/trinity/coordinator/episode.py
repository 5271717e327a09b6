"""Episodes: the coordinator routes a task through the pool turn by turn.

Many episodes (a whole CMA-ES population × a minibatch of tasks) are played together, one turn at a
time: every active episode's transcript is encoded in one batch (states already stored cost nothing),
every episode picks its (model, role), and all the resulting pool requests go out together. Requests
already in the response store, or shared by several episodes, cost no call — so the population walks
one memoised rollout tree per task.

On stored trees a generation is bookkeeping, so the loop is written for it (`RolloutTrees`): each node
(transcript) keeps its state-store key — extended from its parent's hash state, never re-rendered — its
role prompts, its edges' response keys and parsed replies, and its grade; a turn is one head product per
candidate and one vectorised draw; picks are drawn exactly as `Generator.choice(n, p)` would. Results are
those of the straightforward loop (tests/reference_episode.py; tests/test_episode_hotpath.py checks it).
With SVF, each candidate's transcripts are encoded under its own adapter (episodes grouped by candidate).

An outage is not a sample (README, "An outage is not a sample"): an episode one of whose calls failed transiently
(`Turn.failure == "transient"`) is marked `outage` and gets no reward (None, never 0 or a diversity bonus); its
reply says nothing about the route, so the training loops leave it out of every fitness and count it
(`trinity.evolve.sep_cma`). With `stop_on_outage` (the training loops) it ends at the failed call, so no further
call is paid for an episode that cannot count.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from trinity.config import RewardSettings
from trinity.coordinator.head import softmax
from trinity.coordinator.roles import (ROLES, Role, Turn, coordinator_text, forced_role, is_answer, latest_answer,
                                      role_messages, turn_of)
from trinity.coordinator.streams import EpisodeStream, episode_streams
from trinity.records import ChatMessage, Task, stable_hash
from trinity.store import Store, text_key


class OutageError(RuntimeError):
    """A stage left work unscored because pool calls failed transiently (an outage: 429, 5xx, timeout...).
    Nothing computed is lost: every reply is in the store, and outages never are, so a rerun asks only the failed
    calls again. A RuntimeError, not bad input: the LLM-bound stage tasks retry it (`trinity.ops.stage_flow`)."""


def is_outage(turn: Turn) -> bool:
    """Whether a turn is an outage: a call that failed for the provider's reasons, not the request's."""
    return turn.failure == "transient"


ROLE_VALUE = {r: r.value for r in Role}
"""Role → its string (an Enum's .value is a descriptor call: measurable in the per-pick loops)."""


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
        if todo:
            vecs = np.asarray(self.encoder.encode(list(todo.values())), dtype=np.float32)
            self.encoded += len(todo)
            if self.store is not None:
                self.store.put_states(enc_id, list(todo), vecs)
            for k, v in zip(todo, vecs):
                mem[k] = v
        return np.stack([mem[k] for k in keys]) if len(keys) else np.zeros((0, self.encoder.dim), np.float32)


def _json_escaped(text: str) -> bytes:
    """`text` as it appears inside its JSON string literal: the piece of `text_key` input it contributes.
    JSON escaping is per character, so the escaped form of a concatenation is the concatenation."""
    return json.dumps(text, ensure_ascii=False)[1:-1].encode("utf-8")


class _Edge:
    """A (model, role) step out of a node: its request (memoised) and, once answered, its reply."""

    __slots__ = ("model", "role", "messages", "key", "resp", "turn", "child")

    def __init__(self, model: int, role: Role, messages: list[ChatMessage], key: str):
        self.model, self.role, self.messages, self.key = model, role, messages, key
        self.resp = self.turn = self.child = None


class _Node:
    """One transcript of a task's rollout tree. Everything a visit needs is computed once per node:
    the state-store key (extended incrementally from the parent's hash state, never re-rendering the
    whole transcript), the prompts of each role, the response-store key of each (model, role) edge,
    and the grade of its latest answer."""

    __slots__ = ("key", "_hasher", "answer", "children", "edges", "_messages", "grades")

    def __init__(self, hasher, answer: str | None):
        self._hasher = hasher
        h = hasher.copy()
        h.update(b'"')
        self.key = h.hexdigest()
        self.answer = answer  # roles.latest_answer of the path, kept incrementally (what is graded)
        self.children: dict[tuple[Role, str, bool], _Node] = {}
        self.edges: dict[tuple[int, Role], _Edge] = {}
        self._messages: dict[Role, list[ChatMessage]] = {}
        self.grades: dict = {}

    def child(self, turn: Turn) -> "_Node":
        k = (turn.role, turn.text, turn.ok)
        c = self.children.get(k)
        if c is None:
            h = self._hasher.copy()
            h.update(_json_escaped(f"\n\n{turn.role.value}: {turn.text}"))
            answer = turn.text if is_answer(turn) else self.answer
            c = self.children[k] = _Node(h, answer)
        return c

    def edge(self, model: int, role: Role, task: Task, turns: tuple[Turn, ...], pool) -> _Edge:
        e = self.edges.get((model, role))
        if e is None:
            msgs = self._messages.get(role)
            if msgs is None:
                msgs = self._messages[role] = role_messages(role, task, turns)
            e = self.edges[(model, role)] = _Edge(model, role, msgs, pool.key(model, msgs, role.value))
        return e


class RolloutTrees:
    """The memoised rollout trees a population walks: one per task, nodes = transcripts, edges = (model,
    role). Kept for a whole run (pass the same object to every `play_episodes` call), so a generation on
    stored trees costs dictionary lookups and matrix products. The request keys it memoises belong to one
    pool configuration (model ids and sampling); binding another pool starts afresh.
    """

    def __init__(self):
        self._roots: dict[Task, _Node] = {}
        self._pool_signature = None

    def bind(self, pool) -> None:
        sig = pool.signature() if hasattr(pool, "signature") else id(pool)
        if sig != self._pool_signature:
            self._roots.clear()
            self._pool_signature = sig

    def node(self, task: Task, turns: tuple[Turn, ...] = ()) -> _Node:
        n = self._roots.get(task)
        if n is None:
            h = hashlib.sha256(b'"')
            h.update(_json_escaped(coordinator_text(task, ())))
            n = self._roots[task] = _Node(h, None)
        for t in turns:
            n = n.child(t)
        return n

    def __len__(self) -> int:
        return len(self._roots)


@dataclass
class Episode:
    task: Task
    candidate: int
    rng: EpisodeStream | np.random.Generator | None
    """Seeded stream for sampling picks (only `random()` is used); None → argmax policy."""
    turns: tuple[Turn, ...] = ()
    picks: list[tuple[int, Role]] = field(default_factory=list)
    forced_role: Role | None = None
    verifier_first: bool = False
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
    node: _Node | None = field(default=None, repr=False, compare=False)

    @property
    def answer(self) -> str | None:
        """The episode's answer (`roles.latest_answer`): what was graded, and what is exported and printed.
        None when no Worker succeeded, or when a Verifier spoke before any answer (the episode scores 0)."""
        return None if self.verifier_first else latest_answer(self.turns)

    @property
    def path(self) -> list[list[str]]:
        return [[str(m), ROLE_VALUE[r]] for m, r in self.picks]

    @property
    def path_json(self) -> str:
        """json.dumps(self.path), memoised per path (a population repeats the same paths)."""
        return _path_json(tuple(self.picks))


@functools.lru_cache(maxsize=1 << 16)
def _seed_int(part: str) -> int:
    return int(stable_hash(part)[:12], 16)


def _seed_parts(parts: Sequence[int | str]) -> tuple[int, ...]:
    return tuple(int(p) if isinstance(p, int) else _seed_int(p) for p in parts)


def episode_rng(*seed_parts: int | str) -> np.random.Generator:
    """A generator fixed by (seed, generation, candidate, task...): resumable and order-independent."""
    return np.random.default_rng(list(_seed_parts(seed_parts)))


def episode_rngs(seed_parts: Sequence[Sequence[int | str]]) -> list[EpisodeStream]:
    """`episode_rng` for a whole generation at once: streams whose `random()` draws are exactly those of
    the generators `episode_rng` would build (coordinator/streams.py), ~1 ms for 512 instead of ~10."""
    return episode_streams([_seed_parts(p) for p in seed_parts])


def model_pick_entropy(picks: Sequence[tuple[int, Role]]) -> float:
    return _entropy_of(tuple(m for m, _ in picks))


@functools.lru_cache(maxsize=1 << 14)
def _path_json(picks: tuple[tuple[int, Role], ...]) -> str:
    return json.dumps([[str(m), ROLE_VALUE[r]] for m, r in picks])


@functools.lru_cache(maxsize=1 << 14)
def _entropy_of(models: tuple[int, ...]) -> float:
    return entropy_of_counts(list(Counter(models).values()))


def entropy_of_counts(counts: Sequence[int]) -> float:
    """Entropy (nats) of a distribution given by counts (e.g. how often each model was picked)."""
    n = sum(counts)
    return max(0.0, -sum(c / n * math.log(c / n) for c in counts if c)) if n else 0.0


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
    """Correctness + diversity bonus − turn penalty − cost (DESIGN.md); a Verifier before any answer → 0; an
    episode hit by an outage → None (no reward at all: not a sample)."""
    if ep.outage:
        return None
    if ep.verifier_first:
        return 0.0
    n_turns = len(ep.turns)
    return (ep.correct + w.diversity_weight * model_pick_entropy(ep.picks)
            - w.turn_penalty_weight * ((max(n_turns, 1) - 1) / max_turns) / 4
            - (w.cost_weight * episode_cost(ep, w.cost_unit) if w.cost_weight else 0.0))


async def play_episodes(episodes: Sequence[Episode], heads: Sequence[np.ndarray], pool, states: StateCache,
                        max_turns: int, reward: RewardSettings, grade: Callable[[Task, str], float], *,
                        adapters: Sequence[np.ndarray] | None = None, trees: RolloutTrees | None = None,
                        keep_features: bool = False, stop_on_outage: bool = False) -> None:
    """Play every episode to the end, in place. `heads[c]` is the (L+3) x d matrix of candidate c.

    adapters: SVF scales per candidate (`adapters[c]`); each candidate's transcripts are then encoded with
        its own δ (episodes grouped by candidate). None = one encoder for everyone.
    trees: the run's memoised rollout trees (a fresh one if None: memoisation within this call only).
    keep_features: record each pick's hidden state in `Episode.features` (REINFORCE needs them).
    stop_on_outage: end an episode at its first outage (the training loops: the episode cannot count, so no
        further call is paid for it). Either way an outage marks the episode (`outage`, reward None).

    One turn = one batch: the states of every active episode (stored ones cost a lookup), one matrix product
    per candidate, the picks, then every pool request of the turn in one `pool.complete_many` (stored or
    shared requests cost no call; the rest are expanded together).
    """
    n_models = len(pool)
    trees = RolloutTrees() if trees is None else trees
    trees.bind(pool)
    for e in episodes:
        if e.node is None:
            e.node = trees.node(e.task, e.turns)
    Ws = {}
    active = [e for e in episodes if not e.done]
    while active:
        n = len(active)
        groups: dict[int, list[int]] = {}
        for i, e in enumerate(active):
            groups.setdefault(e.candidate, []).append(i)
        keys = [e.node.key for e in active]

        def render(i: int, _active=active) -> str:
            return coordinator_text(_active[i].task, _active[i].turns)

        if adapters is None:
            H = states.lookup(keys, render)
        else:
            H = np.empty((n, states.dim), dtype=np.float32)
            for c, ix in groups.items():
                H[ix] = states.lookup([keys[i] for i in ix], lambda j, ix=ix: render(ix[j]), adapter=adapters[c])
        H64 = H.astype(np.float64)
        Z = np.empty((n, n_models + 3))
        for c, ix in groups.items():
            W = Ws.get(c)
            if W is None:
                W = Ws[c] = np.asarray(heads[c], dtype=np.float64).T
            if len(ix) == ix[-1] - ix[0] + 1:
                Z[ix[0]:ix[-1] + 1] = H64[ix[0]:ix[-1] + 1] @ W
            else:
                Z[ix] = H64[ix] @ W
        P_model, P_role = softmax(Z[:, :n_models]), softmax(Z[:, n_models:])
        # Picks: argmax, or exactly what Generator.choice(n, p=p) draws (one uniform; inverse CDF) — model
        # first, then role, from each episode's own generator.
        M = np.argmax(P_model, axis=1)
        R = np.argmax(P_role, axis=1)
        sampled = [i for i, e in enumerate(active) if e.rng is not None]
        if sampled:
            U = np.array([(active[i].rng.random(), active[i].rng.random()) for i in sampled])
            cm = np.cumsum(P_model[sampled], axis=1)
            cm /= cm[:, -1:]
            cr = np.cumsum(P_role[sampled], axis=1)
            cr /= cr[:, -1:]
            M[sampled] = (cm <= U[:, :1]).sum(axis=1)
            R[sampled] = (cr <= U[:, 1:]).sum(axis=1)
        requests, asked = [], []
        for i, e in enumerate(active):
            m, role = int(M[i]), ROLES[R[i]]
            forced = e.forced_role is not None
            if forced:  # the Thinker's suggested_role overrides the head's role pick
                role, e.forced_role = e.forced_role, None
            e.picks.append((m, role))
            if keep_features:
                e.features.append(H[i])
                e.forced.append(forced)
            if role is Role.VERIFIER and e.node.answer is None:
                e.verifier_first = True
                e.done = True
                continue
            edge = e.node.edge(m, role, e.task, e.turns, pool)
            requests.append((m, ROLE_VALUE[role], edge.key, edge.messages))
            asked.append((e, edge))
        replies = await pool.complete_many(requests) if requests else []
        for (e, edge), resp in zip(asked, replies):
            if edge.resp is not resp:  # first visit (or another stored sample): parse once per edge
                edge.turn = turn_of(pool.names[edge.model], edge.role, resp)
                edge.child = e.node.child(edge.turn)
                edge.resp = resp
            turn = edge.turn
            e.turns += (turn,)
            e.node = edge.child
            e.cost_usd += resp.cost_usd
            if turn.failure == "transient":  # (is_outage, inlined)
                e.outage = True
                if stop_on_outage:
                    e.done = True
                    continue
            if turn.role is Role.THINKER:
                e.forced_role = forced_role(turn, e.node.answer)
            if (turn.role is Role.VERIFIER and turn.verdict == "ACCEPT") or len(e.turns) >= max_turns:
                e.done = True
        active = [e for e in active if not e.done]
    for e in episodes:
        node = e.node
        if node.answer is None or e.verifier_first:
            e.correct = 0.0
        else:
            g = node.grades.get(grade)
            if g is None:
                g = node.grades[grade] = float(grade(e.task, node.answer))
            e.correct = g
        e.reward = shaped_reward(e, max_turns, reward)
