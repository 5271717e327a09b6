"""The encoder's caches: an LRU bounded by entries and by a per-entry size (tokens), the KV-prefix entry it
holds per encoded token sequence, and the longest-prefix lookup that reuses whole chunks only (so a reused
prefix gives the same bits as a full encode; see `TranscriptEncoder._forward_frozen`)."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class PrefixEntry:
    ids: np.ndarray
    kv: list[tuple[torch.Tensor, torch.Tensor]]
    """Keys/values of the frozen blocks, each [1, kv_heads, n, head_dim]."""
    residual: torch.Tensor | None
    """SVF: the stream at the adapted block's input, [n, d]."""
    states: torch.Tensor | None
    """Mean pooling without SVF: the feature-layer states of every token, [n, d]."""


class LRU:
    """OrderedDict with a bound on entries and on a per-entry size (tokens)."""

    def __init__(self, max_entries: int, max_size: int):
        self.max_entries, self.max_size = max_entries, max_size
        self.items: OrderedDict[bytes, tuple[object, int]] = OrderedDict()
        self.size = 0

    def get(self, key):
        hit = self.items.get(key)
        if hit is None:
            return None
        self.items.move_to_end(key)
        return hit[0]

    def put(self, key, value, size: int) -> None:
        self.pop(key)
        self.items[key] = (value, size)
        self.size += size
        while self.items and (len(self.items) > self.max_entries or self.size > self.max_size):
            _, (_, s) = self.items.popitem(last=False)
            self.size -= s

    def pop(self, key) -> None:
        old = self.items.pop(key, None)
        if old is not None:
            self.size -= old[1]

    def clear(self) -> None:
        self.items.clear()
        self.size = 0

    def __len__(self) -> int:
        return len(self.items)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    m = min(len(a), len(b))
    eq = a[:m] == b[:m]
    return m if bool(eq.all()) else int(np.argmin(eq))


def find_prefix(prefix: LRU, ids: np.ndarray, max_p: int, chunk: int) -> tuple[int, PrefixEntry | None]:
    """(p, entry): the cached entry sharing the longest token prefix with `ids` and how many of its
    positions to reuse (at most `max_p`, whole `chunk`s only); (0, None) when nothing is reused."""
    best, best_p = None, 0
    for _, (entry, _) in reversed(prefix.items.items()):  # most recent first wins ties
        p = common_prefix(entry.ids, ids)
        if p > best_p:
            best, best_p = entry, p
    if best is None:
        return 0, None
    n = len(ids)
    if best_p == n == len(best.ids) and max_p >= n:
        p = n  # the very same tokens (SVF: the whole residual is reused as it was computed)
    else:
        # Reuse whole chunks only: a chunk's states then come from the same computation as in a full
        # encode (same tokens, same shapes, same cached keys/values), bit for bit.
        p = min(best_p, max_p) // chunk * chunk
    if p <= 0:
        return 0, None
    prefix.get(best.ids.tobytes())  # mark as recently used
    return p, best
