"""The episode loop as it was before the hot-path work (commit 4a14eb0), kept verbatim as the reference the
optimised `play_episodes` must reproduce: tests/test_episode_hotpath.py and bench/generation_cached.py
compare the two on the same inputs. It renders and hashes every transcript each turn, computes one head
product per episode, and sends one `pool.complete` coroutine per request. One rule added since: an outage (a
transiently failed call) marks the episode (`outage`: no reward) and, with `stop_on_outage`, ends it."""
from __future__ import annotations

import asyncio
from typing import Callable, Sequence

import numpy as np

from trinity.config import RewardSettings
from trinity.coordinator.episode import Episode, StateCache, shaped_reward
from trinity.coordinator.head import route_probs
from trinity.coordinator.roles import ROLES, Role, coordinator_text, forced_role, latest_answer, make_turn, role_messages
from trinity.records import Task


async def reference_play_episodes(episodes: Sequence[Episode], heads: Sequence[np.ndarray], pool, states: StateCache,
                                  max_turns: int, reward: RewardSettings, grade: Callable[[Task, str], float],
                                  stop_on_outage: bool = False) -> None:
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
            if resp.failure == "transient":
                e.outage = True
                if stop_on_outage:
                    e.done = True
                    continue
            if role is Role.THINKER:
                e.forced_role = forced_role(turn, latest_answer(e.turns))
            if (role is Role.VERIFIER and turn.verdict == "ACCEPT") or len(e.turns) >= max_turns:
                e.done = True
        active = [e for e in active if not e.done]
    for e in episodes:
        answer = latest_answer(e.turns)
        e.correct = 0.0 if (answer is None or e.verifier_first) else float(grade(e.task, answer))
        e.reward = shaped_reward(e, max_turns, reward)
