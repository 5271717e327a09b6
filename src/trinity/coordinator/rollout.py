"""The rollout tree of a task, and the one step rule every walk of it follows.

A task's rollout tree has a node per transcript (the task and the turns so far) and an edge per (model, role) the
coordinator may pick there; an edge leads to the transcript with that member's reply appended. What may happen at
a node, and when a path ends, is `StepRule`, written once and used by everything that walks the tree:

- `trinity.coordinator.episode.play_episodes` (the episode loop: training, validation, evaluation, serving) asks
  it which roles a pick may draw, which role a Thinker forces, and whether an episode ends after its turn;
- `enumerate_paths` (below) walks every path of a stored tree exactly, with each path's probability under a head;
- `trinity diagnose` (`trinity.diagnosis`) reads a finished run through those two and has no rule of its own.

The rule, per pick: the head's role distribution is a softmax over the roles the coordinator may pick
(`coordinator.roles`), without the Verifier while the transcript has no answer (nothing to verify: no episode can
end before an answer); a Thinker's suggested role, when the coordinator may pick it, overrides the head's role
(`roles.forced_role`: never a Verifier with no answer). After a turn the episode ends on an outage when the caller
stops there (`stop_on_outage`: the training loops, where such an episode cannot count), on a Verifier's ACCEPT, at
`max_turns`, and under the answer rule "first" at the first answer (no later turn could change what it returns).
It returns `roles.returned_answer` under the answer rule.

The rule is pure: a function of the turns alone (no state carried between picks), so a walk can start from any
node. `enumerate_paths` reaches the tree's nodes through two callbacks (the head's input at a transcript, the turn
an edge leads to), so it walks a tree held anywhere: the response store (the diagnosis) or a test's script.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from trinity.coordinator.head import pick_probs
from trinity.coordinator.roles import ROLES, Role, Turn, forced_role, is_answer, latest_answer, returned_answer

ENDINGS: tuple[str, ...] = ("outage", "accept", "max_turns", "first_answer")
"""Why an episode ends after a turn (`StepRule.ending`), in the order they are tested."""

_VERIFIER = ROLES.index(Role.VERIFIER)


def is_outage(turn: Turn) -> bool:
    """Whether a turn is an outage: a call that failed for the provider's reasons, not the request's."""
    return turn.failure == "transient"


@dataclass(frozen=True)
class StepRule:
    """What a turn of an episode may do, when the episode ends and what it returns (the module docstring)."""

    max_turns: int
    roles: tuple[Role, ...] = ROLES
    """The roles the head may pick (`coordinator.roles`, `roles.allowed_roles`); Worker must be among them."""
    answer_rule: str = "latest"
    """Which Worker answer the episode returns (`roles.returned_answer`; `coordinator.answer_rule`)."""
    stop_on_outage: bool = False
    """End an episode at its first outage (the training loops)."""

    def __post_init__(self):
        object.__setattr__(self, "roles", tuple(self.roles))
        if Role.WORKER not in self.roles:
            raise ValueError(f"coordinator roles {[r.value for r in self.roles]} lack worker: no episode could "
                             f"answer")
        object.__setattr__(self, "_allowed", np.array([r in self.roles for r in ROLES]))

    def role_mask(self, turns: tuple[Turn, ...]) -> np.ndarray:
        """The roles the head's role draw may take after `turns`, a boolean per `ROLES`: the coordinator's roles,
        without the Verifier while there is no answer."""
        return self.role_masks([turns])[0]

    def role_masks(self, transcripts: Sequence[tuple[Turn, ...]]) -> np.ndarray:
        """`role_mask` of each transcript, one row each (the episode loop asks for a whole turn's at once)."""
        masks = np.tile(self._allowed, (len(transcripts), 1))
        masks[[latest_answer(turns) is None for turns in transcripts], _VERIFIER] = False
        return masks

    def forced_role(self, turns: tuple[Turn, ...]) -> Role | None:
        """The role the next pick takes whatever the head draws: the suggestion of a Thinker's turn just played
        (`roles.forced_role`), when the coordinator may pick that role; None: the head's role stands."""
        if not turns:
            return None
        role = forced_role(turns[-1], latest_answer(turns))
        return role if role in self.roles else None

    def ending(self, turns: tuple[Turn, ...]) -> str | None:
        """Why the episode ends after its last turn (one of `ENDINGS`), or None when it goes on."""
        last = turns[-1]
        if self.stop_on_outage and is_outage(last):
            return "outage"
        if last.role is Role.VERIFIER and last.verdict == "ACCEPT":
            return "accept"
        if len(turns) >= self.max_turns:
            return "max_turns"
        if self.answer_rule == "first" and is_answer(last):  # no later turn could change the answer
            return "first_answer"
        return None

    def answer(self, turns: tuple[Turn, ...]) -> str | None:
        """What an episode with these turns returns (`roles.returned_answer` under the answer rule)."""
        return returned_answer(turns, self.answer_rule)


@dataclass(frozen=True)
class RolloutPath:
    """One path of a rollout tree from the walk's start to where it stops, and its probability under each head."""

    turns: tuple[Turn, ...]
    picks: tuple[tuple[int, Role], ...]
    """The (model, role) of every pick, including the last one when it reached an unexplored edge."""
    prob: np.ndarray
    """(K,): the probability of the path under each of the K heads."""
    end: str
    """One of `ENDINGS`, or "unexplored" (the last pick's edge has no known reply) or "missing_state" (the head's
    input at the last transcript is unknown): the path's mass is then the tree's unexplored mass."""
    cost_usd: float = 0.0
    """What the path's calls cost, as their replies recorded."""

    @property
    def explored(self) -> bool:
        return self.end in ENDINGS


def enumerate_paths(rule: StepRule, heads: np.ndarray, n_models: int,
                    state: Callable[[tuple[Turn, ...]], np.ndarray | None],
                    child: Callable[[tuple[Turn, ...], int, Role], tuple[Turn, float] | None], *,
                    start: tuple[Turn, ...] = (), greedy: bool = False) -> Iterator[RolloutPath]:
    """Every path of a rollout tree from `start`, each with its exact probability under the policy of each head.

    heads: (K, n_models + 3, d), the head matrices (one is (1, ...)).
    state(turns): what the head reads at a transcript (the features of its hidden state), or None when unknown.
    child(turns, model, role): the turn an edge leads to and its call's cost (USD), or None when unknown.
    greedy: the argmax policy (the loop's `pick` with no generator) instead of the sampled one.

    The probabilities of all paths sum to 1 for every head; those of explored paths to 1 minus the unexplored mass.
    A path a head gives probability 0 is not walked (unless another head gives it mass).
    """
    W = np.asarray(heads, dtype=np.float64)
    K = W.shape[0]

    def walk(turns, picks, p, cost):
        h = state(turns)
        if h is None:
            yield RolloutPath(turns, picks, p, "missing_state", cost)
            return
        z = W @ np.asarray(h, dtype=np.float64)  # (K, n_models + 3)
        mask = rule.role_mask(turns)
        p_model, p_role = pick_probs(z, n_models, mask)  # the loop's distributions (play_episodes)
        if greedy:
            p_model = np.eye(n_models)[p_model.argmax(axis=1)]
            p_role = np.eye(len(ROLES))[p_role.argmax(axis=1)]
        forced = rule.forced_role(turns)
        for ri, role in enumerate(ROLES):
            if forced is not None:
                if role is not forced:
                    continue
                p_r = np.ones(K)
            elif not mask[ri]:
                continue
            else:
                p_r = p_role[:, ri]
            for m in range(n_models):
                q = p * p_model[:, m] * p_r
                if not q.any():
                    continue
                path_picks = picks + ((m, role),)
                step = child(turns, m, role)
                if step is None:
                    yield RolloutPath(turns, path_picks, q, "unexplored", cost)
                    continue
                turn, call_cost = step
                nxt = turns + (turn,)
                end = rule.ending(nxt)
                if end is not None:
                    yield RolloutPath(nxt, path_picks, q, end, cost + call_cost)
                else:
                    yield from walk(nxt, path_picks, q, cost + call_cost)

    yield from walk(tuple(start), (), np.ones(K), 0.0)

