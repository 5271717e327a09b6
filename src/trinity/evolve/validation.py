"""Selection on validation: what the training loop saves, and the line it must beat.

The validation slice (`data.validation`, data/prepared/validation.jsonl) holds items of the training benchmarks that
are in neither training nor evaluation. Every generation the loop scores two vectors on it, the optimiser's answer
(CMA's mean) and the generation's best sampled candidate, and before the first generation the starting point; the
vector saved is the best of all of these there (a tie keeps the earlier one). Scoring plays the policy as evaluation
does (`coordinator.policy_eval`: argmax by default, one episode per item; sampled, one seeded episode per item), so
the fitness that selects is the evaluation's own.

Each pool member alone (one Worker turn, exactly the evaluation's "alone" request, so the stored reply is shared) is
scored on the same items once per run: the best of them is the line the coordinator must beat, reported beside it.
The starting point of a warm start (`evolve.warm_start: best_member`, `warm_start_head`) is that member as Worker.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from trinity.config import Settings
from trinity.coordinator.episode import Episode, RolloutTrees, StateCache, episode_rng, play_episodes
from trinity.coordinator.rollout import is_outage
from trinity.coordinator.head import ParamLayout
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.roles import ROLES, Role, allowed_roles, coordinator_text, returned_answer, turn_of
from trinity.records import Task


@dataclass(frozen=True)
class ValidationScore:
    accuracy: float
    """Mean grade over the validation items not hit by an outage."""
    no_answer: float
    """Share of those items whose episode returned no answer."""
    outages: int
    """Items left out because a call failed transiently."""


def score_policy(params: np.ndarray, layout: ParamLayout, tasks: Sequence[Task], settings: Settings, pool,
                 states: StateCache, grade: Callable[[Task, str], float], trees: RolloutTrees) -> ValidationScore:
    """One parameter vector on the validation items, played as evaluation plays it (`coordinator.policy_eval`)."""
    c = settings.coordinator
    delta, W = layout.split(params)
    sample = c.policy_eval == "sample"
    eps = [Episode(task=t, candidate=0, rng=episode_rng(settings.evolve.seed, "validation", t.id) if sample else None)
           for t in tasks]
    asyncio.run(play_episodes(eps, [W], pool, states, c.max_turns, settings.reward, grade,
                              adapters=None if delta is None else [delta], trees=trees, stop_on_outage=True,
                              roles=allowed_roles(c), answer_rule=c.answer_rule,
                              role_sampling=RoleSampling.of(settings)))
    clean = [e for e in eps if not e.outage]
    if not clean:
        return ValidationScore(float("nan"), float("nan"), len(eps))
    return ValidationScore(float(np.mean([e.correct for e in clean])),
                           float(np.mean([e.answer is None for e in clean])), len(eps) - len(clean))


def score_members(tasks: Sequence[Task], pool, grade: Callable[[Task, str], float], trees: RolloutTrees,
                  role_sampling: RoleSampling) -> dict[str, ValidationScore]:
    """Each pool member alone (one Worker turn: the evaluation's "alone" request) on the validation items."""
    requests = [trees.request(pool, role_sampling, t, (), idx, Role.WORKER)
                for idx in range(len(pool)) for t in tasks]
    replies = asyncio.run(pool.complete_many(requests)) if requests else []
    out = {}
    for idx, name in enumerate(pool.names):
        scores, none, outages = [], 0, 0
        for t, r in zip(tasks, replies[idx * len(tasks):(idx + 1) * len(tasks)]):
            turn = turn_of(name, Role.WORKER, r)
            if is_outage(turn):
                outages += 1
                continue
            answer = returned_answer((turn,))
            none += answer is None
            scores.append(0.0 if answer is None else trees.grade(grade, t, answer))
        out[name] = (ValidationScore(float(np.mean(scores)), none / len(scores), outages) if scores
                     else ValidationScore(float("nan"), float("nan"), outages))
    return out


def best_member(members: dict[str, ValidationScore]) -> str:
    """The member with the highest validation accuracy (the first listed on a tie)."""
    return max(members, key=lambda n: np.nan_to_num(members[n].accuracy, nan=-1.0))  # max keeps the first


WARM_START_MARGIN = 4.0
"""The warm start's logit margin at the training items' mean state: the chosen member and the Worker role get
softmax probability e^4 / (e^4 + k - 1) there (0.95 of 4 members, 0.96 of 3 roles)."""


def warm_start_head(layout: ParamLayout, member: int, states: StateCache, train: Sequence[Task]) -> np.ndarray:
    """A flat vector (δ = 0) whose head picks `member` as Worker: its model row and the Worker row are
    m · h̄ / |h̄|², h̄ the mean state (what the head reads) of the training items' first transcripts, so both logits
    are `WARM_START_MARGIN` there and 0 for every other model and role. Raises ValueError when that does not make
    the argmax pick them on every training item (states with no common direction: e.g. standardised features
    without their bias feature)."""
    H = states.states([coordinator_text(t, ()) for t in train]).astype(np.float64)
    mean = H.mean(axis=0)
    w = WARM_START_MARGIN * mean / float(mean @ mean)
    W = np.zeros((layout.head.n_models + 3, layout.head.dim))
    W[member] = w
    W[layout.head.n_models + ROLES.index(Role.WORKER)] = w
    low = float((H @ w).min())
    if low <= 0:
        raise ValueError(f"evolve.warm_start: the training items' states share no direction (lowest logit {low:.3g} "
                         "<= 0): the head cannot pick one member on all of them")
    return np.concatenate([np.zeros(layout.n_svf), W.reshape(-1)])
