"""Prefect flow for the 'evolve' stage (`dvc repro` runs `python flows/evolve.py`)."""
from _bootstrap import ROOT  # hermetic defaults before prefect is imported

import argparse
import os

from prefect import flow

from trinity import stages
from trinity.config import load_settings
from trinity.tracking import StageRun


@flow(name="trinity-evolve")
def evolve_flow(params: str = "params.yaml") -> dict:
    settings = load_settings(params if os.path.isabs(params) else ROOT / params)
    with StageRun(settings, "evolve", root=ROOT) as run:
        out = stages.evolve(settings, stages.Paths(ROOT), tracker=run)
        run.summary(out)
    print(f"[evolve] {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    evolve_flow(ap.parse_args().params)
