"""Prefect flow for the 'evaluate' stage (`dvc repro` runs `python flows/evaluate.py`)."""
from _bootstrap import ROOT  # hermetic defaults before prefect is imported

import argparse
import os

from prefect import flow

from trinity import stages
from trinity.config import load_settings
from trinity.tracking import StageRun


@flow(name="trinity-evaluate")
def evaluate_flow(params: str = "params.yaml") -> dict:
    settings = load_settings(params if os.path.isabs(params) else ROOT / params)
    with StageRun(settings, "evaluate", root=ROOT) as run:
        out = stages.evaluate(settings, stages.Paths(ROOT), tracker=run)
        run.summary(out)
    print(f"[evaluate] {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    evaluate_flow(ap.parse_args().params)
