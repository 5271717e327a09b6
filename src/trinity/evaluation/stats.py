"""Statistics for the evaluation table: percentile bootstrap intervals, and paired bootstrap differences.

Both resample items with a seeded numpy Generator (never the global RNG), so a rerun of the same results
prints the same intervals. Paired: the two methods' scores on the *same* items are resampled together, so the
interval of the difference reflects item-level agreement (much tighter than two independent intervals).

A scoring unit need not be an item: MT-Bench is scored per (item, conversation turn) judgement. Then `clusters`
names each value's item and the bootstrap resamples items, each carrying all of its units (a cluster bootstrap of
the mean over units): an item's two turns are not independent draws.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

N_RESAMPLES = 2000
MIN_ITEMS_FOR_OUTCOME = 5
"""Fewer paired items cannot show a difference at the 5% level even when every item goes the same way (a sign
test: 0.5**4 > 0.05), while their percentile bootstrap interval collapses to a point: no outcome is called."""
SMALL_SAMPLE = 30
"""Below this many items an interval is labelled a small sample: a 95% bootstrap interval on a handful of items
is wide and itself unreliable (the percentile bootstrap under-covers at small n)."""


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    n: int
    """Scoring units (items, or (item, turn) judgements)."""
    clusters: int | None = None
    """Items resampled, when the units were resampled by item (None: each unit is its own item)."""

    @property
    def resampled(self) -> int:
        """How many independent units the interval rests on: the items."""
        return self.n if self.clusters is None else self.clusters

    @property
    def small_sample(self) -> bool:
        return self.resampled < SMALL_SAMPLE

    def as_dict(self) -> dict:
        return {"estimate": self.estimate, "ci95": [self.low, self.high], "n": self.n,
                "small_sample": self.small_sample}


def _resample_means(x: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_resamples, len(x)))
    return x[idx].mean(axis=1)


def _resample_cluster_means(x: np.ndarray, clusters: Sequence, n_resamples: int, seed: int) -> np.ndarray:
    """Means over units of item-resampled data: draw items with replacement, pool all their units."""
    index: dict = {}
    labels = np.array([index.setdefault(c, len(index)) for c in clusters])
    sums = np.bincount(labels, weights=x, minlength=len(index))
    counts = np.bincount(labels, minlength=len(index)).astype(np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(index), size=(n_resamples, len(index)))
    return sums[idx].sum(axis=1) / counts[idx].sum(axis=1)


def bootstrap_mean(values: Sequence[float], *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                   level: float = 0.95, clusters: Sequence | None = None) -> Interval:
    """The mean of `values` and its percentile bootstrap interval. No values: NaN estimate and interval.
    `clusters` (one hashable label per value, e.g. the item of an (item, turn) judgement): resample the labels,
    each with all its values; when every label is distinct this is the plain bootstrap, the same numbers."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"bootstrap_mean needs a 1-d sequence of scores, got shape {x.shape}")
    if clusters is not None and len(clusters) != len(x):
        raise ValueError(f"bootstrap_mean: {len(clusters)} cluster labels for {len(x)} values")
    n_clusters = None if clusters is None else len(set(clusters))
    if n_clusters == len(x):
        n_clusters = None  # one unit per item: the plain bootstrap
    if len(x) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    if not np.all(np.isfinite(x)):
        raise ValueError("bootstrap_mean: scores must be finite (leave unscored items out, and count them)")
    if n_clusters is None:
        means = _resample_means(x, n_resamples, seed)
    else:
        means = _resample_cluster_means(x, clusters, n_resamples, seed)
    a = (1.0 - level) / 2
    lo, hi = np.quantile(means, [a, 1.0 - a])
    return Interval(float(x.mean()), float(lo), float(hi), len(x), n_clusters)


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                     level: float = 0.95, clusters: Sequence | None = None) -> Interval:
    """mean(a - b) over paired units (a[i] and b[i] are two methods' scores on unit i) with its percentile
    bootstrap interval; the units (or, with `clusters`, the items they belong to) are resampled, the pairs kept
    together."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired_bootstrap needs two equal-length 1-d sequences, got {x.shape} and {y.shape}")
    return bootstrap_mean(x - y, n_resamples=n_resamples, seed=seed, level=level, clusters=clusters)


def bootstrap_p_below_zero(values: Sequence[float], *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> float:
    """One-sided bootstrap p-value for "the mean of `values` is below 0": the share of resampled means at or above 0,
    the observed sample counted among them ((k + 1) / (R + 1), never 0). Drawn from the same resamples as
    `bootstrap_mean` with the same seed, so p < 0.025 is the 95 % interval's upper end below 0. Needs values."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or len(x) == 0 or not np.all(np.isfinite(x)):
        raise ValueError(f"bootstrap_p_below_zero needs a non-empty 1-d sequence of finite scores, got {x!r}")
    means = _resample_means(x, n_resamples, seed)
    return float((np.count_nonzero(means >= 0) + 1) / (n_resamples + 1))


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down correction: which of a family of hypotheses are rejected with the family-wise error rate
    at most `alpha` (the smallest p against alpha/m, the next against alpha/(m-1), ..., stopping at the first that
    is not below its level). One hypothesis: p <= alpha, the uncorrected test."""
    m = len(p_values)
    rejected = [False] * m
    for rank, i in enumerate(sorted(range(m), key=lambda j: p_values[j])):
        if p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def compare(interval: Interval) -> str:
    """'wins' when the paired interval of (coordinator - other) lies above 0, 'loses' below, else 'ties';
    'too few items' below MIN_ITEMS_FOR_OUTCOME paired items (the point estimate is still reported)."""
    if interval.n == 0 or np.isnan(interval.low):
        return "no data"
    if interval.resampled < MIN_ITEMS_FOR_OUTCOME:
        return "too few items"
    if interval.low > 0:
        return "wins"
    if interval.high < 0:
        return "loses"
    return "ties"
