"""sep-CMA-ES, the paper's optimiser: pycma with a diagonal covariance (`CMA_diagonal: True`), behind the loop's
`trinity.evolve.optimizer.Optimizer` interface. Its run has random streams of its own, pickled with it (see
`SepCMA.__init__`), so a resumed run samples what an uninterrupted one would."""
from __future__ import annotations

import numpy as np


class SepCMA:
    """sep-CMA-ES: pycma with `CMA_diagonal: True`, x0 = 0 (or a warm start's vector), minimising −fitness."""

    method = "sep_cma"
    needs_features = False

    def __init__(self, n: int, sigma0: float, popsize: int, seed: int, x0: np.ndarray | None = None):
        import cma

        # pycma treats seed 0 as "random": offset so every evolve.seed is reproducible. pycma samples with
        # opts["randn"], by default bound to numpy's *global* RandomState, and pickling such a bound method
        # pickles a copy of that RandomState: an unpickled run would then sample from a stale copy while the
        # uninterrupted one samples from whatever state the global RNG reached. So the run gets its own
        # RandomState (the very stream np.random.seed(seed + 1) would give), pickled once with the optimiser;
        # pycma's seeding of the global RNG at construction is undone, and any other global-RNG use inside
        # ask/tell runs on this run's own saved stream (`_own_rng`).
        outside = np.random.get_state()
        self._rs = np.random.RandomState(seed + 1)
        try:
            self.es = cma.CMAEvolutionStrategy(np.zeros(n) if x0 is None else np.array(x0, dtype=np.float64), sigma0, {
                "CMA_diagonal": True, "seed": seed + 1, "popsize": popsize, "verbose": -9, "randn": self._rs.randn,
                "tolx": 0, "tolfun": 0, "tolflatfitness": 10**9, "tolstagnation": 10**9, "maxiter": 10**9})
            self._np_global_rng = np.random.get_state()
        finally:
            np.random.set_state(outside)

    def _own_rng(self, fn):
        """Run a pycma call with numpy's global RNG set to this run's own saved stream, then put the caller's
        back: nothing else in the process that touches np.random can shift what the optimiser does."""
        outside = np.random.get_state()
        np.random.set_state(self._np_global_rng)
        try:
            return fn()
        finally:
            self._np_global_rng = np.random.get_state()
            np.random.set_state(outside)

    def ask(self) -> list[np.ndarray]:
        return self._own_rng(self.es.ask)

    def tell(self, X, fitness, episodes) -> None:
        self._own_rng(lambda: self.es.tell(X, (-np.asarray(fitness)).tolist()))  # pycma minimises

    @property
    def params(self) -> np.ndarray:
        return np.asarray(self.es.mean, dtype=np.float64).copy()

    @property
    def sigma(self) -> float:
        return float(self.es.sigma)

    def resume(self) -> None:
        pass  # both random streams travel inside the pickle (see __init__)
