"""The routing head: z = W h, W of shape (L+3) x d, no bias. First L logits pick the model, last 3 the role.

Parameters travel as one flat float vector (what CMA-ES evolves); `HeadShape.unflatten` and
`ParamLayout.split` are the only places that know the layout.
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


def pick_probs(z: np.ndarray, n_models: int, role_allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Model and role distributions from the head's logits z (..., L+3): a softmax over the L members, and one over
    the roles `role_allowed` lets a pick take (a boolean per role, broadcast against z's role logits; None: all)."""
    roles = z[..., n_models:] if role_allowed is None else np.where(role_allowed, z[..., n_models:], -np.inf)
    return softmax(z[..., :n_models]), softmax(roles)


def route_probs(W: np.ndarray, h: np.ndarray, n_models: int) -> tuple[np.ndarray, np.ndarray]:
    """Model and role distributions for hidden states h of shape (d,) or (n, d)."""
    return pick_probs(h @ W.T, n_models)


@dataclass(frozen=True)
class ParamLayout:
    """The flat vector an optimiser evolves: [δ (SVF scales of one encoder block)…, head…].

    n_params = n_svf + (L+3)·d, where n_svf = Σ over the adapted block's linear layers of min(rows, cols)
    (one scale per singular value). The paper: L=7, d=1024 → 10,240 head parameters, + 9,216 SVF scales =
    19,456. Without SVF (n_svf = 0) the vector is the head alone, exactly as before.
    """

    head: HeadShape
    n_svf: int = 0

    @property
    def n_params(self) -> int:
        return self.n_svf + self.head.n_params

    def split(self, flat: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """(δ or None, W) from a flat vector."""
        flat = np.asarray(flat, dtype=np.float64)
        if flat.shape != (self.n_params,):
            raise ValueError(f"expected {self.n_params} parameters ({self.n_svf} SVF scales + head "
                             f"({self.head.n_models}+3) x {self.head.dim}), got shape {flat.shape}")
        if not self.n_svf:
            return None, self.head.unflatten(flat)
        return flat[: self.n_svf].copy(), self.head.unflatten(flat[self.n_svf:])

    def describe(self) -> dict:
        return {"n_params": self.n_params, "head_params": self.head.n_params, "svf_params": self.n_svf,
                "head_shape": [self.head.n_models + 3, self.head.dim]}
