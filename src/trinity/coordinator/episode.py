"""Episodes: the coordinator routes a task through the pool turn by turn.

Many episodes (a whole CMA-ES population × a minibatch of tasks) are played together, one turn at a
time: every active episode's transcript is encoded in one batch (states already stored cost nothing),
every episode picks its (model, role), and all the resulting pool requests go out concurrently. Requests
already in the response store, or shared by several episodes, cost no call — so the population walks
one memoised rollout tree per task.
"""
from __future__ import annotations

import asyncio
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from trinity.config import RewardSettings
from trinity.coordinator.head import route_probs
from trinity.coordinator.roles import ROLES, Role, Turn, coordinator_text, latest_answer, make_turn, role_messages
from trinity.records import Task, stable_hash
from trinity.store import Store, text_key


class StateCache:
    """Hidden states of transcripts: in memory, then the store, then the encoder (in one batch)."""

    def __init__(self, encoder, store: Store | None):
        self.encoder = encoder
        self.store = store
        self._mem: dict[str, np.ndarray] = {}
        self.encoded = 0  # transcripts actually run through the encoder

    @property
    def dim(self) -> int:
        return self.encoder.dim

    def states(self, texts: Sequence[str]) -> np.ndarray:
        keys = [text_key(t) for t in texts]
        missing = [k for k in dict.fromkeys(keys) if k not in self._mem]
        if missing and self.store is not None:
            self._mem.update(self.store.get_states(self.encoder.encoder_id, missing))
        todo = {}
        for k, t in zip(keys, texts):
            if k not in self._mem:
                todo.setdefault(k, t)
        if todo:
            vecs = np.asarray(self.encoder.encode(list(todo.values())), dtype=np.float32)
            self.encoded += len(todo)
            if self.store is not None:
                self.store.put_states(self.encoder.encoder_id, list(todo), vecs)
            for k, v in zip(todo, vecs):
                self._mem[k] = v
        return np.stack([self._mem[k] for k in keys]) if keys else np.zeros((0, self.dim), np.float32)


@dataclass
class Episode:
    task: Task
    candidate: int
    rng: np.random.Generator | None
    """Seeded generator for sampling picks; None → argmax policy."""
    turns: tuple[Turn, ...] = ()
    picks: list[tuple[int, Role]] = field(default_factory=list)
    forced_role: Role | None = None
    verifier_first: bool = False
    done: bool = False
    cost_usd: float = 0.0
    correct: float = 0.0
    reward: float = 0.0

    @property
    def path(self) -> list[list[str]]:
        return [[str(m), r.value] for m, r in self.picks]


def episode_rng(*seed_parts: int | str) -> np.random.Generator:
    """A generator fixed by (seed, generation, candidate, task...): resumable and order-independent."""
    ints = [int(p) if isinstance(p, int) else int(stable_hash(p)[:12], 16) for p in seed_parts]
    return np.random.default_rng(ints)


def model_pick_entropy(picks: Sequence[tuple[int, Role]]) -> float:
    counts = Counter(m for m, _ in picks)
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values()) if n else 0.0


def shaped_reward(ep: Episode, max_turns: int, w: RewardSettings) -> float:
    """Correctness + diversity bonus − turn penalty − cost (DESIGN.md); a Verifier before any answer → 0."""
    if ep.verifier_first:
        return 0.0
    n_turns = len(ep.turns)
    return (ep.correct + w.diversity_weight * model_pick_entropy(ep.picks)
            - w.turn_penalty_weight * ((max(n_turns, 1) - 1) / max_turns) / 4
            - w.cost_weight * ep.cost_usd)


async def play_episodes(episodes: Sequence[Episode], heads: Sequence[np.ndarray], pool, states: StateCache,
                        max_turns: int, reward: RewardSettings, grade: Callable[[Task, str], float]) -> None:
    """Play every episode to the end, in place. `heads[c]` is the (L+3) x d matrix of candidate c."""
    n_models = len(pool)
    active = [e for e in episodes if not e.done]
    while active:
        H = states.states([coordinator_text(e.task, e.turns) for e in active])
        requests = []
        for e, h in zip(active, H):
            p_model, p_role = route_probs(heads[e.candidate], h.astype(np.float64), n_models)
            if e.rng is None:
                m, r = int(np.argmax(p_model)), int(np.argmax(p_role))
            else:
                m, r = int(e.rng.choice(n_models, p=p_model)), int(e.rng.choice(3, p=p_role))
            role = ROLES[r]
            if e.forced_role is not None:  # the Thinker's suggested_role overrides the head's role pick
                role, e.forced_role = e.forced_role, None
            e.picks.append((m, role))
            if role is Role.VERIFIER and latest_answer(e.turns) is None:
                e.verifier_first = True
                e.done = True
                continue
            requests.append((e, m, role, role_messages(role, e.task, e.turns)))
        replies = await asyncio.gather(*(pool.complete(m, msgs, role.value) for _, m, role, msgs in requests))
        for (e, m, role, _), resp in zip(requests, replies):
            turn = make_turn(pool.names[m], role, resp.text, resp.ok)
            e.turns += (turn,)
            e.cost_usd += resp.cost_usd
            if role is Role.THINKER and turn.suggested_role is not None:
                e.forced_role = turn.suggested_role
            if (role is Role.VERIFIER and turn.verdict == "ACCEPT") or len(e.turns) >= max_turns:
                e.done = True
        active = [e for e in active if not e.done]
    for e in episodes:
        answer = latest_answer(e.turns)
        e.correct = 0.0 if (answer is None or e.verifier_first) else float(grade(e.task, answer))
        e.reward = shaped_reward(e, max_turns, reward)
