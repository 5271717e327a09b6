"""Statistics for the evaluation table: percentile bootstrap intervals, and paired bootstrap differences.

Both resample items with a seeded numpy Generator (never the global RNG), so a rerun of the same results
prints the same intervals. Paired: the two methods' scores on the *same* items are resampled together, so the
interval of the difference reflects item-level agreement (much tighter than two independent intervals).
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

    @property
    def small_sample(self) -> bool:
        return self.n < SMALL_SAMPLE

    def as_dict(self) -> dict:
        return {"estimate": self.estimate, "ci95": [self.low, self.high], "n": self.n,
                "small_sample": self.small_sample}


def _resample_means(x: np.ndarray, n_resamples: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_resamples, len(x)))
    return x[idx].mean(axis=1)


def bootstrap_mean(values: Sequence[float], *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                   level: float = 0.95) -> Interval:
    """The mean of `values` and its percentile bootstrap interval. No values: NaN estimate and interval."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"bootstrap_mean needs a 1-d sequence of scores, got shape {x.shape}")
    if len(x) == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    if not np.all(np.isfinite(x)):
        raise ValueError("bootstrap_mean: scores must be finite (leave unscored items out, and count them)")
    means = _resample_means(x, n_resamples, seed)
    a = (1.0 - level) / 2
    lo, hi = np.quantile(means, [a, 1.0 - a])
    return Interval(float(x.mean()), float(lo), float(hi), len(x))


def paired_bootstrap(a: Sequence[float], b: Sequence[float], *, n_resamples: int = N_RESAMPLES, seed: int = 0,
                     level: float = 0.95) -> Interval:
    """mean(a - b) over paired items (a[i] and b[i] are two methods' scores on item i) with its percentile
    bootstrap interval; the items are resampled, the pairs kept together."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"paired_bootstrap needs two equal-length 1-d sequences, got {x.shape} and {y.shape}")
    return bootstrap_mean(x - y, n_resamples=n_resamples, seed=seed, level=level)


def compare(interval: Interval) -> str:
    """'wins' when the paired interval of (coordinator - other) lies above 0, 'loses' below, else 'ties';
    'too few items' below MIN_ITEMS_FOR_OUTCOME paired items (the point estimate is still reported)."""
    if interval.n == 0 or np.isnan(interval.low):
        return "no data"
    if interval.n < MIN_ITEMS_FOR_OUTCOME:
        return "too few items"
    if interval.low > 0:
        return "wins"
    if interval.high < 0:
        return "loses"
    return "ties"
