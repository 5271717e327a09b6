"""REINFORCE, a baseline of the paper's optimiser ablation (`trinity.evolve.optimizer`): the score-function gradient
of the sampled (model, role) log-probabilities with respect to the head, times an advantage, ascended with Adam.
Every "candidate" of a generation is the current θ, so a generation is popsize x tasks on-policy episodes (distinct
samples: the episode seeds differ by candidate). Baseline: for each episode, the mean reward of the *other* episodes
of the same task in the generation (leave-one-out, so the estimate stays unbiased). A role the Thinker forced
(`suggested_role`) was not drawn by the head: its term is left out. An episode hit by an outage has no reward and is
left out (of the gradient and of every baseline). The paper reports it as the failing case (LiveCodeBench .253 vs
.615 for sep-CMA-ES).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from trinity.coordinator.episode import Episode
from trinity.coordinator.head import HeadShape, ParamLayout, softmax
from trinity.coordinator.roles import ROLES
from trinity.evolve.optimizer import PlainStateOptimizer

_ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}


def policy_gradient(shape: HeadShape, theta: np.ndarray, episodes: Sequence[Episode]) -> np.ndarray:
    """REINFORCE estimate of ∇θ E[reward] (flat, like θ) from episodes played with keep_features=True.

    ∇ log π(m | h) = (onehot(m) − softmax(z_model)) ⊗ h for the model rows of W, likewise for the role rows (the
    softmax over the roles the pick could draw: `Episode.role_allowed`);
    summed over an episode's picks and weighted by its advantage (reward − leave-one-out mean of its task),
    averaged over episodes. Episodes hit by an outage (no reward: not samples) are left out.
    """
    episodes = [e for e in episodes if not e.outage]
    W = shape.unflatten(theta)
    L = shape.n_models
    by_task: dict[str, list[float]] = {}
    for e in episodes:
        by_task.setdefault(e.task.id, []).append(e.reward)
    totals = {k: (sum(v), len(v)) for k, v in by_task.items()}
    rows_h, rows_m, rows_r, rows_free, rows_adv, rows_allowed = [], [], [], [], [], []
    for e in episodes:
        if e.rng is None:
            raise ValueError("REINFORCE needs sampled episodes (an argmax episode has no score function)")
        if len(e.features) != len(e.picks):
            raise ValueError("episodes must be played with keep_features=True for a policy gradient")
        s, k = totals[e.task.id]
        adv = e.reward - ((s - e.reward) / (k - 1) if k > 1 else 0.0)
        allowed = e.role_allowed or [np.ones(len(ROLES), dtype=bool)] * len(e.picks)
        for (m, role), h, forced, ok in zip(e.picks, e.features, e.forced, allowed):
            rows_allowed.append(ok)
            rows_h.append(h)
            rows_m.append(m)
            rows_r.append(_ROLE_INDEX[role])
            rows_free.append(not forced)
            rows_adv.append(adv)
    grad = np.zeros_like(W)
    if not rows_h:
        return grad.reshape(-1)
    H = np.asarray(rows_h, dtype=np.float64)
    adv = np.asarray(rows_adv)
    Z = H @ W.T
    gm = -softmax(Z[:, :L])
    gm[np.arange(len(H)), rows_m] += 1.0
    gr = -softmax(np.where(np.asarray(rows_allowed), Z[:, L:], -np.inf))  # over the roles each pick could draw
    gr[np.arange(len(H)), rows_r] += 1.0
    gr *= np.asarray(rows_free, dtype=np.float64)[:, None]
    grad[:L] = (gm * adv[:, None]).T @ H
    grad[L:] = (gr * adv[:, None]).T @ H
    return (grad / len(episodes)).reshape(-1)


class Reinforce(PlainStateOptimizer):
    """REINFORCE with a leave-one-out baseline and Adam (ascent). Head only (see module doc)."""

    method = "reinforce"
    needs_features = True
    _answer = "theta"

    def __init__(self, layout: ParamLayout, popsize: int, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, x0: np.ndarray | None = None):
        if layout.n_svf:
            raise NotImplementedError(
                "REINFORCE trains the head only: a score-function gradient with respect to SVF scales would need "
                "backpropagation through the encoder. Set coordinator.svf_layer: null, or use sep_cma / random_search.")
        self.shape = layout.head
        self.popsize = popsize
        self.lr, self.betas, self.eps = lr, betas, eps
        self.theta = np.zeros(layout.n_params) if x0 is None else np.array(x0, dtype=np.float64)
        self._m = np.zeros_like(self.theta)
        self._v = np.zeros_like(self.theta)
        self.t = 0
        self.last_grad_norm = 0.0

    def ask(self) -> list[np.ndarray]:
        return [self.theta.copy() for _ in range(self.popsize)]

    def tell(self, X, fitness, episodes) -> None:
        g = policy_gradient(self.shape, self.theta, episodes)
        self.last_grad_norm = float(np.linalg.norm(g))
        b1, b2 = self.betas
        self.t += 1
        self._m = b1 * self._m + (1 - b1) * g
        self._v = b2 * self._v + (1 - b2) * g * g
        m_hat = self._m / (1 - b1 ** self.t)
        v_hat = self._v / (1 - b2 ** self.t)
        self.theta = self.theta + self.lr * m_hat / (np.sqrt(v_hat) + self.eps)

    @property
    def sigma(self) -> float:
        return self.lr
