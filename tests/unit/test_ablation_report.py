"""scripts/ablation_report.py on the shape `dvc exp show --json` prints (DVC 3.x): the table, the budget check,
and what a reader needs to weigh the numbers (items per benchmark, base commit, the store's effect on calls)."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from ablation_report import ablation_rows, experiments, render  # noqa: E402

BASE = "75ffdf1be2b978873e061ddb5b0d5fe406d96286"


def _exp(name: str, rev: str, method: str, trinity: dict, calls: int) -> dict:
    params = {"data": {"train": {"math500": 3, "mbpp": 3}, "in_distribution": {"math500": 2, "mbpp": 2},
                       "heldout": {"mt_bench": 1, "gpqa": -1}},
              "evolve": {"method": method, "generations": 4, "popsize": 8, "episodes_per_candidate": 9, "seed": 0,
                         "sigma0": 0.3}}
    return {"revs": [{"rev": rev[:7], "name": name, "data": {
        "rev": rev, "meta": {"name": name},
        "params": {"params.yaml": {"data": params}},
        "metrics": {"reports/metrics/evolve.json": {"data": {"saved_fitness": 0.25, "best_candidate_fitness": 0.5,
                                                          "calls_made": calls}},
                    "reports/metrics/evaluate.json": {"data": {"trinity": trinity}}}}}]}


def _shown() -> list[dict]:
    return [{"rev": "workspace", "name": None, "experiments": None},
            {"rev": BASE, "name": "main", "experiments": [
                _exp("ablation-sep_cma", "ff57fe6a97", "sep_cma",
                     {"math500": 0.5, "mbpp": 1.0, "mt_bench": 5.0, "gpqa": 0.0,
                      "avg_in_distribution": 0.75, "avg_heldout": 0.25}, 332),
                _exp("ablation-random_search", "f240d5d25b", "random_search",
                     {"math500": 1.0, "mbpp": 0.5, "gpqa": 0.0, "avg_in_distribution": 0.75}, 133),
                _exp("full", "0123456789", "sep_cma", {"math500": 0.1}, 1)]}]


def test_table_names_items_commit_and_the_unscored():
    rows = ablation_rows(experiments(_shown()), "ablation-")
    assert [r["method"] for r in rows] == ["sep_cma", "random_search"]  # "full" is not part of the ablation
    md = render(rows)
    assert "| ablation-sep_cma | sep-CMA-ES | 0.250 | 0.500 | 0.750 | 0.250 | 0.000 | 0.500 | 1.000 | 5.000 | 332 |" in md
    # random search has no MT-Bench score: a dash, no held-out average, and the legend says why
    assert "| ablation-random_search | random search | 0.250 | 0.500 | 0.750 | — | 0.000 | 1.000 | 0.500 | — | 133 |" in md
    assert "no scored item" in md
    assert "in-distribution evaluation math500 2, mbpp 2" in md and "gpqa every item" in md
    assert "of commit 75ffdf1" in md
    assert "measure the order, not the method" in md


def test_unequal_budgets_and_missing_metrics_are_refused_by_name():
    shown = _shown()
    exps = experiments(shown)
    bad = copy.deepcopy(exps)
    bad[1]["params"]["params.yaml"]["evolve"]["popsize"] = 12
    with pytest.raises(SystemExit, match="do not share one budget.*ablation-random_search"):
        ablation_rows(bad, "ablation-")
    failed = copy.deepcopy(exps)
    del failed[0]["metrics"]["reports/metrics/evaluate.json"]
    with pytest.raises(SystemExit, match=r"ablation-sep_cma .*no reports/metrics/evaluate.json"):
        ablation_rows(failed, "ablation-")
    with pytest.raises(SystemExit, match="no experiment named nope"):
        ablation_rows(exps, "nope")
