"""SVF (singular-value fine-tuning) of one block of the encoder's LM.

The singular values of the block's weight matrices are scaled, energy preserving:
W' = U diag(S(1+δ)) Vᵀ · ΣS/ΣS(1+δ), applied as W + U diag(S' − S) Vᵀ so δ=0 gives W bit for bit.
`TranscriptEncoder(svf_layer=k)` decomposes block k once (`decompose_block`); `set_svf_delta` applies a δ
(`apply_delta`) and names it (`adapter_key`, part of `encoder_id`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch


@dataclass
class SVFMatrix:
    name: str
    param: torch.nn.Parameter
    w0: torch.Tensor
    u: torch.Tensor
    s: torch.Tensor  # float64
    vh: torch.Tensor

    @property
    def size(self) -> int:
        return int(self.s.numel())


def decompose_block(block: torch.nn.Module, k: int, names: Sequence[str] | None) -> list[SVFMatrix]:
    """SVDs (in float64) of block `k`'s linear layers `names` (default: all of them), with a copy of each weight."""
    linears = {n: m for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)}
    chosen = list(linears) if names is None else list(names)
    unknown = [n for n in chosen if n not in linears]
    if unknown or not chosen:
        raise ValueError(f"svf_matrices {unknown or chosen} not among block {k}'s linears {list(linears)}")
    out: list[SVFMatrix] = []
    with torch.no_grad():
        for n in chosen:
            w = linears[n].weight
            u, s, vh = torch.linalg.svd(w.detach().double(), full_matrices=False)
            out.append(SVFMatrix(n, w, w.detach().clone(), u.float(), s, vh.float()))
    return out


def apply_delta(matrices: Sequence[SVFMatrix], d: np.ndarray) -> None:
    """Set each matrix's weight (in place) to its singular values scaled by (1+δ), renormalised to keep ΣS; δ is
    read in the order of `matrices`, `size` values each. A matrix whose δ is all zeros gets its original weight."""
    off = 0
    with torch.no_grad():
        for m in matrices:
            dm = torch.from_numpy(d[off:off + m.size].astype(np.float64))
            off += m.size
            if not torch.any(dm):
                m.param.copy_(m.w0)
                continue
            scaled = m.s * (1.0 + dm)
            total = scaled.sum()
            if not total > 0:
                raise ValueError(f"delta makes the singular values of {m.name} sum to {float(total)} <= 0")
            s_new = scaled * (m.s.sum() / total)
            corr = (m.u * (s_new - m.s).float()) @ m.vh
            m.param.copy_((m.w0.float() + corr).to(m.param.dtype))  # one rounding to the weight dtype


def adapter_key(layer: int, matrices: Sequence[SVFMatrix], d: np.ndarray) -> str:
    """The adapter's part of `encoder_id`: "svf<layer>-<hash of the layout and δ>", or "" for δ = 0."""
    if np.any(d):
        spec = json.dumps({"layer": layer, "matrices": [m.name for m in matrices]})
        h = hashlib.sha256(spec.encode() + d.tobytes()).hexdigest()[:16]
        return f"svf{layer}-{h}"
    return ""
