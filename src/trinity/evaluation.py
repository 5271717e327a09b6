"""Held-out evaluation: the trained coordinator vs each pool model alone vs uniform random routing.

All methods see the same items. "Alone" = that model as Worker for one turn (the same prompt the
coordinator's first Worker turn sends, so those answers are shared through the response store).
"Random routing" = the same episode loop with a zero head (uniform model and role picks), seeded.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from trinity.config import Settings
from trinity.coordinator.episode import Episode, StateCache, episode_rng, play_episodes
from trinity.coordinator.head import HeadShape, ParamLayout
from trinity.coordinator.roles import Role, latest_answer, make_turn, role_messages
from trinity.records import Task


@dataclass
class MethodResult:
    method: str
    accuracy: float
    n: int
    mean_turns: float
    calls: int
    cost_usd: float
    per_task: list[dict]


def _summarise(method: str, rows: list[dict], calls: int, cost: float) -> MethodResult:
    n = len(rows)
    return MethodResult(method=method, accuracy=float(np.mean([r["correct"] for r in rows])) if n else 0.0, n=n,
                        mean_turns=float(np.mean([r["turns"] for r in rows])) if n else 0.0, calls=calls,
                        cost_usd=cost, per_task=rows)


async def _alone(pool, idx: int, tasks: Sequence[Task], grade) -> list[dict]:
    replies = await asyncio.gather(*(pool.complete(idx, role_messages(Role.WORKER, t, ()), Role.WORKER.value)
                                     for t in tasks))
    rows = []
    for t, r in zip(tasks, replies):
        answer = latest_answer((make_turn(pool.names[idx], Role.WORKER, r.text, r.ok),))
        rows.append({"task_id": t.id, "correct": float(grade(t, answer)) if answer is not None else 0.0, "turns": 1,
                     "path": [[str(idx), "worker"]], "answer": answer, "ok": r.ok, "error": r.error})
    return rows


def _episode_rows(eps: Sequence[Episode]) -> list[dict]:
    return [{"task_id": e.task.id, "correct": e.correct, "turns": len(e.turns), "reward": e.reward,
             "path": e.path, "verifier_first": e.verifier_first,
             "answer": e.answer} for e in eps]


def policy_from_params(settings: Settings, params: np.ndarray, n_models: int, states: StateCache):
    """(SVF scales or None, head W) of a trained parameter vector, laid out as in training."""
    n_svf = int(getattr(states.encoder, "svf_num_params", 0)) if settings.coordinator.svf_layer is not None else 0
    return ParamLayout(HeadShape(n_models=n_models, dim=states.dim), n_svf).split(params)


def evaluate(settings: Settings, params: np.ndarray, tasks: Sequence[Task], pool, states: StateCache,
             grade: Callable[[Task, str], float], methods: Sequence[str] | None = None) -> list[MethodResult]:
    """methods: a subset of ["trinity", "alone:<name>"..., "random-routing"] (default: all)."""
    delta, W = policy_from_params(settings, params, len(pool), states)
    adapters = None if delta is None else [delta]
    ev = settings.evaluate
    results = []

    def run(method, coro_factory):
        if methods is not None and method not in methods:
            return
        c0, cost0 = pool.stats.calls_made, pool.stats.cost_usd
        rows = coro_factory()
        results.append(_summarise(method, rows, pool.stats.calls_made - c0, pool.stats.cost_usd - cost0))

    def trinity():
        sample = settings.coordinator.policy_eval == "sample"
        eps = [Episode(task=t, candidate=0, rng=episode_rng(ev.seed, "eval", t.id) if sample else None) for t in tasks]
        asyncio.run(play_episodes(eps, [W], pool, states, settings.coordinator.max_turns, settings.reward, grade,
                                  adapters=adapters))
        return _episode_rows(eps)

    run("trinity", trinity)
    for i, name in enumerate(pool.names):
        run(f"alone:{name}", lambda i=i: asyncio.run(_alone(pool, i, tasks, grade)))

    def random_routing():
        eps = [Episode(task=t, candidate=0, rng=episode_rng(ev.random_routing_seed, "random", t.id)) for t in tasks]
        asyncio.run(play_episodes(eps, [np.zeros_like(W)], pool, states, settings.coordinator.max_turns,
                                  settings.reward, grade, adapters=adapters))
        return _episode_rows(eps)

    run("random-routing", random_routing)
    return results
