"""The routing head: z = W h, W of shape (L+3) x d, no bias. First L logits pick the model, last 3 the role.

Parameters travel as one flat float vector (what CMA-ES evolves); `unflatten` is the only place that
knows the layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class HeadShape:
    n_models: int
    dim: int

    @property
    def n_params(self) -> int:
        return (self.n_models + 3) * self.dim

    def unflatten(self, flat: np.ndarray) -> np.ndarray:
        flat = np.asarray(flat, dtype=np.float64)
        if flat.shape != (self.n_params,):
            raise ValueError(f"head expects {self.n_params} parameters ((L+3) x d = ({self.n_models}+3) x "
                             f"{self.dim}), got shape {flat.shape}")
        return flat.reshape(self.n_models + 3, self.dim)


def softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def route_probs(W: np.ndarray, h: np.ndarray, n_models: int) -> tuple[np.ndarray, np.ndarray]:
    """Model and role distributions for hidden states h of shape (d,) or (n, d)."""
    z = h @ W.T
    return softmax(z[..., :n_models]), softmax(z[..., n_models:])
