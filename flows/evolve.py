"""Prefect flow for the 'evolve' stage (`dvc repro` runs `python flows/evolve.py`)."""
import _bootstrap  # noqa: F401  (hermetic defaults before prefect is imported)

import argparse

from prefect import flow

from trinity import stages
from trinity.config import load_settings
from trinity.tracking import StageRun


@flow(name="trinity-evolve", log_prints=True)
def evolve_flow(params: str = "params.yaml") -> dict:
    settings = load_settings(params)
    with StageRun(settings, "evolve") as run:
        out = stages.evolve(settings, tracker=run)
        run.summary(out)
    print(f"[evolve] {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    evolve_flow(ap.parse_args().params)
