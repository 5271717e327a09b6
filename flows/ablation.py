"""Prefect flow for the optimiser ablation (`dvc repro ablation/dvc.yaml` runs `python flows/ablation.py`).

Not part of the default chain: plain `dvc repro` reproduces ./dvc.yaml only (prepare → … → report);
the ablation's stage lives in its own pipeline file, ablation/dvc.yaml, and trains three coordinators.
"""
from _bootstrap import ROOT  # hermetic defaults before prefect is imported

import argparse
import os

from prefect import flow

from trinity import stages
from trinity.config import load_settings
from trinity.tracking import StageRun


@flow(name="trinity-ablation", log_prints=True)
def ablation_flow(params: str = "params.yaml") -> dict:
    settings = load_settings(params if os.path.isabs(params) else ROOT / params)
    with StageRun(settings, "ablation", root=ROOT) as run:
        out = stages.ablation(settings, stages.Paths(ROOT), tracker=run)
        run.summary({f"{r['method']}/{k}": v for r in out["methods"] for k, v in r.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)})
    print(f"[ablation] wrote reports/ablation.md and data/ablation/results.json")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    ablation_flow(ap.parse_args().params)
