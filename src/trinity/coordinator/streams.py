"""Episode random streams, seeded in bulk: the draws of `np.random.default_rng(seed_parts).random()`, bit for bit.

Every episode samples its picks from its own generator, fixed by (seed, generation, candidate, task), so a
run is resumable and independent of episode order. A generation of popsize 32 x 16 tasks needs 512 of them,
and constructing a numpy Generator (SeedSequence → PCG64) costs ~20 µs: ~10 ms of a generation that is
otherwise ~20 ms on stored trees. The episode loop only ever asks a stream for `random()` (two per turn),
so this module computes the same thing in bulk:

1. SeedSequence's entropy mixing (numpy's `mix_entropy`, pool size 4) and `generate_state(4, uint64)`,
   vectorised over all episodes with uint32 arithmetic (its hash constants evolve independently of the
   data, so they are scalars);
2. PCG64's seeding (`pcg_setseq_128_srandom_r`) and its XSL-RR 64-bit output in Python integers;
3. `random()` = (next_uint64 >> 11) · 2⁻⁵³, as numpy's `next_double`.

tests/test_streams.py checks equality with numpy for many seeds (a numpy change of seeding would fail it).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
_M128 = (1 << 128) - 1
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R = 0xCA01F9DD, 0x4973F715
_XSHIFT = 16
_POOL = 4
_PCG_MULT = (2549297995355413924 << 64) | 4865540595714422341
_TO_DOUBLE = 1.0 / 9007199254740992.0


class EpisodeStream:
    """A PCG64 stream positioned where `np.random.default_rng(seed_parts)` starts; `random()` matches it."""

    __slots__ = ("_state", "_inc")

    def __init__(self, state: int, inc: int):
        self._state, self._inc = state, inc

    def random(self) -> float:
        s = (self._state * _PCG_MULT + self._inc) & _M128
        self._state = s
        x = ((s >> 64) ^ s) & _M64
        rot = s >> 122
        out = ((x >> rot) | (x << ((-rot) & 63))) & _M64
        return (out >> 11) * _TO_DOUBLE


def _words(x: int) -> list[int]:
    """SeedSequence's coercion of one non-negative int: little-endian uint32 words (0 → [0])."""
    if x < 0:
        raise ValueError("seed parts must be non-negative")
    if x == 0:
        return [0]
    out = []
    while x:
        out.append(x & _M32)
        x >>= 32
    return out


def _hash_consts(init: int, mult: int, n: int) -> list[int]:
    """The hash constant each successive hashmix uses (it only depends on how many came before)."""
    out, h = [], init
    for _ in range(n):
        out.append(h)
        h = (h * mult) & _M32
    return out


def _seed_states(entropy: np.ndarray) -> np.ndarray:
    """(n, L) uint32 entropy words → (n, 4) uint64 = SeedSequence(entropy).generate_state(4, np.uint64)."""
    n, length = entropy.shape
    u32 = np.uint32
    n_hash = _POOL + _POOL * (_POOL - 1) + max(0, length - _POOL) * _POOL
    consts = iter(_hash_consts(_INIT_A, _MULT_A, n_hash))

    def hashmix(value: np.ndarray) -> np.ndarray:
        h = next(consts)
        value = value ^ u32(h)
        value = value * u32((h * _MULT_A) & _M32)
        return value ^ (value >> u32(_XSHIFT))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        r = u32(_MIX_MULT_L) * x - u32(_MIX_MULT_R) * y
        return r ^ (r >> u32(_XSHIFT))

    with np.errstate(over="ignore"):
        zero = np.zeros(n, dtype=u32)
        mixer = [hashmix(entropy[:, i] if i < length else zero) for i in range(_POOL)]
        for i_src in range(_POOL):
            for i_dst in range(_POOL):
                if i_src != i_dst:
                    mixer[i_dst] = mix(mixer[i_dst], hashmix(mixer[i_src]))
        for i_src in range(_POOL, length):
            for i_dst in range(_POOL):
                mixer[i_dst] = mix(mixer[i_dst], hashmix(entropy[:, i_src]))
        words = []
        for i, h in enumerate(_hash_consts(_INIT_B, _MULT_B, 8)):
            v = mixer[i % _POOL] ^ u32(h)
            v = v * u32((h * _MULT_B) & _M32)
            words.append(v ^ (v >> u32(_XSHIFT)))
    w = np.stack(words, axis=1).astype(np.uint64)
    return w[:, 0::2] | (w[:, 1::2] << np.uint64(32))


def episode_streams(seed_parts: Sequence[Sequence[int]]) -> list[EpisodeStream]:
    """One stream per tuple of non-negative ints; stream i draws what np.random.default_rng(seed_parts[i])
    draws with `random()`."""
    entropy = [[w for x in parts for w in _words(int(x))] for parts in seed_parts]
    out: list[EpisodeStream | None] = [None] * len(entropy)
    by_len: dict[int, list[int]] = {}
    for i, e in enumerate(entropy):
        by_len.setdefault(len(e), []).append(i)
    for length, idx in by_len.items():
        states = _seed_states(np.array([entropy[i] for i in idx], dtype=np.uint32).reshape(len(idx), length))
        for i, (s0, s1, i0, i1) in zip(idx, states.tolist()):
            seed, inc = (s0 << 64) | s1, (((i0 << 64) | i1) << 1 | 1) & _M128
            state = (inc + seed) & _M128  # srandom: state = 0; step; state += seed; step
            out[i] = EpisodeStream((state * _PCG_MULT + inc) & _M128, inc)
    return out  # type: ignore[return-value]
