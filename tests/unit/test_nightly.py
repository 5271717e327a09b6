"""The nightly evaluates enough items that a real drop can be flagged (trinity.ops.nightly): its own items per
benchmark (nightly-eval's `items_per_benchmark`, as prefect.yaml ships it), drawn from the real benchmarks with the
shipped params.yaml, never an item the checkpoint was trained or selected on; on that many items a drop fires and a
night of noise does not. (End to end, against a real Prefect server: tests/integration/test_deployments.py.)"""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trinity.config import PROJECT_ROOT, load_settings
from trinity.evaluation.stats import MIN_ITEMS_FOR_OUTCOME
from trinity.ops.nightly import (NightlyRecord, check_items_per_benchmark, compare, items_by_benchmark,
                                 nightly_splits)


def _shipped_items_per_benchmark() -> int:
    doc = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())
    (nightly,) = [d for d in doc["deployments"] if d["name"] == "nightly-eval"]
    return nightly["parameters"]["items_per_benchmark"]


def test_the_shipped_nightly_draws_enough_items_of_every_benchmark(root, monkeypatch):
    from trinity.data.splits import splits_from_settings

    monkeypatch.setenv("TRINITY_DATA_DIR", str(root))
    settings = load_settings(PROJECT_ROOT / "params.yaml")
    prepared = splits_from_settings(settings.data)  # what the prepare stage writes with these params
    pipeline = items_by_benchmark(prepared)
    assert max(pipeline.values()) < MIN_ITEMS_FOR_OUTCOME  # the pipeline's own items: no drop could ever be called
    n = _shipped_items_per_benchmark()
    assert n >= MIN_ITEMS_FOR_OUTCOME
    night = nightly_splits(settings, prepared, n)
    benchmarks = {k.partition(":")[0] for k in [*settings.data.in_distribution, *settings.data.heldout]}
    assert items_by_benchmark(night) == {b: n for b in benchmarks}
    # the pipeline's evaluation items come first (the same seeded draw), so a night scores them too
    for split in ("in_distribution", "heldout"):
        mine, theirs = getattr(night, split), getattr(prepared, split)
        for bench in benchmarks:
            prefix = [t.id for t in theirs if t.source == bench]
            assert [t.id for t in mine if t.source == bench][:len(prefix)] == prefix
    # never an item the checkpoint was trained or selected on
    seen = {t.id for t in [*prepared.train, *prepared.validation]}
    assert not seen & {t.id for t in [*night.in_distribution, *night.heldout]}
    assert night.train == prepared.train and night.validation == prepared.validation


def test_too_few_items_are_refused_by_name():
    for bad in (2, 4, 0, -1, 5.0, True, "10", None):
        with pytest.raises(ValueError, match=rf"items_per_benchmark must be a whole number >= {MIN_ITEMS_FOR_OUTCOME}"):
            check_items_per_benchmark(bad)
    assert check_items_per_benchmark(MIN_ITEMS_FOR_OUTCOME) == MIN_ITEMS_FOR_OUTCOME


def _night(run: str, right: list[int]) -> NightlyRecord:
    items = {f"gsm8k/{i}": float(v) for i, v in enumerate(right)}
    return NightlyRecord(run=run, finished_at="t", checkpoint={}, splits={"gsm8k": "heldout_other"},
                         scores={"alone:api-a": {"gsm8k": sum(right) / len(right)}},
                         items={"alone:api-a": {"gsm8k": items}})


def test_on_the_nights_items_a_drop_fires_and_a_night_of_noise_does_not():
    n = _shipped_items_per_benchmark()
    base = [1] * (n - 3) + [0] * 3  # 7 of 10 right
    # the provider swapped the model: 4 of the items it answered right are now wrong
    drop = [0] * 4 + base[4:]
    fired = compare(_night("n1", base), _night("n2", drop), 0.05)
    assert fired.flagged, fired.changes
    (d,) = fired.drops
    assert d.paired[3] == n and d.paired[0] == pytest.approx(-4 / n) and d.paired[2] < 0
    # sampling noise: items flip both ways (two right answers lost, one wrong one gained, -0.1): not flagged
    noise = [0, 0] + base[2:-1] + [1]
    quiet = compare(_night("n1", base), _night("n3", noise), 0.05)
    assert not quiet.flagged and quiet.changes[0].paired[0] == pytest.approx(-1 / n)
    assert quiet.changes[0].paired[2] >= 0  # its interval reaches 0
    even = [0] + base[1:-1] + [1]  # one lost, one gained
    assert not compare(_night("n1", base), _night("n4", even), 0.05).flagged
    # the same swap on the pipeline's own 2 items of the benchmark can never fire
    assert not compare(_night("n1", [1, 1]), _night("n2", [0, 0]), 0.05).flagged


def _night_of(run: str, rows: dict[tuple[str, str], list[int]]) -> NightlyRecord:
    scores: dict = {}
    items: dict = {}
    for (method, bench), right in rows.items():
        scores.setdefault(method, {})[bench] = sum(right) / len(right)
        items.setdefault(method, {})[bench] = {f"{bench}/{i}": float(v) for i, v in enumerate(right)}
    return NightlyRecord(run=run, finished_at="t", checkpoint={}, splits={b: "heldout" for _, b in rows},
                         scores=scores, items=items)


def test_a_whole_night_of_noise_is_not_flagged_though_single_rows_look_like_drops():
    """A night compares every method on every benchmark (6 x 9 = 54 rows with the default pool): at 5 % each,
    noise alone makes some row look like a drop most nights. Holm's correction over the night's rows keeps the
    night quiet, and a real swap on one row of that night still fires."""
    import numpy as np

    from trinity.evaluation.stats import paired_bootstrap

    n = _shipped_items_per_benchmark()
    rng = np.random.default_rng(7)
    rows = [(f"method{m}", f"bench{b}") for m in range(6) for b in range(9)]
    # two independent samples of the same policy (each item right with its own probability): the worst case of noise
    p_right = {r: rng.uniform(0.2, 0.9, n) for r in rows}
    base = {r: [int(x) for x in rng.random(n) < p_right[r]] for r in rows}
    tonight = {r: [int(x) for x in rng.random(n) < p_right[r]] for r in rows}
    # taken row by row, the interval rule alone calls several of these noise rows a drop
    alone = [r for r in rows if (iv := paired_bootstrap(tonight[r], base[r], n_resamples=20000)).high < 0
             and iv.estimate < -0.05]
    assert len(alone) >= 2, alone
    quiet = compare(_night_of("n1", base), _night_of("n2", tonight), 0.05)
    assert quiet.family == len(rows) and not quiet.flagged, quiet.drops
    assert "Holm-corrected over 54 rows" in quiet.message()
    # the same night with a provider's swap on one member: 6 of its right answers on a benchmark turn wrong
    swapped = dict(tonight)
    swapped[rows[0]] = [0] * 6 + [1] * (n - 6)
    base_swap = dict(base)
    base_swap[rows[0]] = [1] * n
    fired = compare(_night_of("n1", base_swap), _night_of("n3", swapped), 0.05)
    assert [(d.method, d.benchmark) for d in fired.drops] == [rows[0]]
    assert fired.drops[0].p_drop < 0.025 / len(rows)
