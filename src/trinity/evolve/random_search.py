"""Random search, a baseline of the paper's optimiser ablation (`trinity.evolve.optimizer`): candidate 0 is the
incumbent, re-evaluated on this generation's tasks; the others are incumbent + σ·N(0, I) (σ = evolve.sigma0, fixed).
The best of the generation becomes the incumbent, so a candidate replaces it only by beating it on the same tasks
(its fitness, like every method's, is over the episodes not hit by an outage: `trinity.evolve.loop`). Perturbations
come from a generator fixed by (seed, generation): deterministic and resumable.
"""
from __future__ import annotations

import numpy as np

from trinity.evolve.optimizer import PlainStateOptimizer


class RandomSearch(PlainStateOptimizer):
    """(1+λ) random search around the incumbent with a fixed σ (see module doc)."""

    method = "random_search"
    needs_features = False
    _answer = "best"

    def __init__(self, n: int, popsize: int, sigma: float, seed: int, x0: np.ndarray | None = None):
        if popsize < 2:
            raise ValueError("random search needs popsize >= 2 (the incumbent plus at least one perturbation)")
        self.n, self.popsize, self._sigma, self.seed = n, popsize, sigma, seed
        self.best = np.zeros(n) if x0 is None else np.array(x0, dtype=np.float64)
        self.best_fitness = -np.inf
        self.generation = 0

    def ask(self) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, 104729, self.generation])
        noise = rng.standard_normal((self.popsize - 1, self.n))
        return [self.best.copy()] + [self.best + self._sigma * z for z in noise]

    def tell(self, X, fitness, episodes) -> None:
        b = int(np.argmax(fitness))  # ties keep the incumbent (candidate 0)
        self.best = np.array(X[b], dtype=np.float64)
        self.best_fitness = float(fitness[b])
        self.generation += 1

    @property
    def sigma(self) -> float:
        return self._sigma
