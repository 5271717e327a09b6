"""What the head reads: the encoder's hidden state as is (the paper), or standardised.

`coordinator.feature_norm: none` — the head reads h, the raw hidden state (the paper's method).

`coordinator.feature_norm: standardize` — the head reads x = [(h − μ) / s, b]: every dimension centred and scaled
by statistics of the training tasks' opening transcripts, plus one constant feature b = √d that gives the head a
bias (centring removes the common component of h, which otherwise acts as one). Why it exists: SmolLM2's final
hidden states carry a few massive-activation dimensions (one is ~40x the median magnitude and swings with the
type of the penultimate token) and a large common component (about half of ‖h‖²), so at σ0 = 0.03 a head's
logits are mostly the same global preference for every transcript, and task-specific directions are drowned
(bench/learnability.py measures what that costs; docs/results.md "Does training learn?").

μ and s are fitted once, before training, on the training tasks' root states (s_i = √(var_i + median var): the
median variance regularises dimensions a few tasks cannot estimate), saved in the checkpoint's metadata and
applied identically wherever the head is used (evaluation, `trinity ask`). The state store keeps raw states.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

FEATURE_NORMS = ("none", "standardize")


@dataclass(frozen=True)
class FeatureMap:
    """x = [(h − mean) / scale, bias]: a fixed affine map from hidden states to the head's input."""

    mean: np.ndarray
    scale: np.ndarray
    bias: float

    @property
    def dim(self) -> int:
        return len(self.mean) + 1

    def __call__(self, H: np.ndarray) -> np.ndarray:
        H = np.asarray(H, dtype=np.float32)
        X = np.empty((H.shape[0], self.dim), dtype=np.float32)
        X[:, :-1] = (H - self.mean) / self.scale
        X[:, -1] = self.bias
        return X

    @classmethod
    def fit(cls, H: np.ndarray) -> "FeatureMap":
        H = np.asarray(H, dtype=np.float64)
        if H.ndim != 2 or len(H) < 2:
            raise ValueError(f"feature_norm: standardize needs the states of at least 2 training tasks, got {H.shape}")
        var = H.var(axis=0)
        scale = np.sqrt(var + np.median(var))
        return cls(H.mean(axis=0).astype(np.float32), scale.astype(np.float32), float(math.sqrt(H.shape[1])))

    def to_json(self) -> dict:
        return {"norm": "standardize", "mean": self.mean.tolist(), "scale": self.scale.tolist(), "bias": self.bias}

    @classmethod
    def from_json(cls, d: dict | None) -> "FeatureMap | None":
        if not d or d.get("norm", "none") == "none":
            return None
        if d["norm"] != "standardize":
            raise ValueError(f"checkpoint features.norm {d['norm']!r}: expected one of {FEATURE_NORMS}")
        return cls(np.asarray(d["mean"], np.float32), np.asarray(d["scale"], np.float32), float(d["bias"]))


def fit_feature_map(norm: str, states, tasks: Sequence) -> FeatureMap | None:
    """The map `coordinator.feature_norm` asks for, fitted on `tasks`' opening transcripts (raw states)."""
    if norm == "none":
        return None
    if norm != "standardize":
        raise ValueError(f"coordinator.feature_norm {norm!r}: expected one of {FEATURE_NORMS}")
    from trinity.coordinator.roles import coordinator_text

    return FeatureMap.fit(states.raw_states([coordinator_text(t, ()) for t in tasks]))


def features_json(fmap: FeatureMap | None) -> dict:
    return {"norm": "none"} if fmap is None else fmap.to_json()

