"""What the training loop (`trinity.evolve.loop`) needs from an optimiser (`Optimizer`: ask, tell, params, sigma,
resume; the loop's `make_optimizer` builds the one `evolve.method` names). One file each:
sep-CMA-ES, the paper's (`sep_cma.py`), and the baselines of its ablation, REINFORCE (`reinforce.py`) and random
search (`random_search.py`), on the same head, tasks and episode budget: only the way candidates are chosen
differs. None touches numpy's global RNG.
"""
from __future__ import annotations

import math
from typing import Protocol, Sequence

import numpy as np

from trinity.coordinator.episode import Episode

METHODS = ("sep_cma", "reinforce", "random_search")


def default_popsize(n_params: int) -> int:
    return 4 + int(math.floor(3 * math.log(n_params)))


class Optimizer(Protocol):
    """What the training loop needs from an optimiser. Pickled whole into the resume checkpoint."""

    method: str
    needs_features: bool
    """True → episodes keep each pick's hidden state (`Episode.features`) for `tell`."""

    def ask(self) -> list[np.ndarray]:
        """This generation's candidates (flat vectors); their number is the popsize."""

    def tell(self, X: Sequence[np.ndarray], fitness: np.ndarray, episodes: Sequence[Episode]) -> None:
        """Fitness (mean shaped reward over its episodes not hit by an outage, higher is better) of each candidate,
        and the episodes it came from (those not hit by an outage)."""

    @property
    def params(self) -> np.ndarray:
        """The run's answer so far (CMA: the distribution mean; REINFORCE: θ; random search: the incumbent)."""

    @property
    def sigma(self) -> float:
        """Step size for the logs (CMA: σ; random search: its fixed σ; REINFORCE: the Adam step size)."""

    def resume(self) -> None:
        """Called once after unpickling from a checkpoint."""


class PlainStateOptimizer:
    """What the baselines share: their answer is one numpy vector (attribute named by `_answer`) and all their
    state is plain numpy, so the pickled checkpoint restores them whole."""

    _answer: str

    @property
    def params(self) -> np.ndarray:
        return np.array(getattr(self, self._answer), dtype=np.float64)

    def resume(self) -> None:
        pass
