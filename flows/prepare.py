"""Prefect flow for the 'prepare' stage (`dvc repro` runs `python flows/prepare.py`)."""
import _bootstrap  # noqa: F401  (hermetic defaults before prefect is imported)

import argparse

from prefect import flow

from trinity import stages
from trinity.config import load_settings
from trinity.tracking import StageRun


@flow(name="trinity-prepare", log_prints=True)
def prepare_flow(params: str = "params.yaml") -> dict:
    settings = load_settings(params)
    with StageRun(settings, "prepare") as run:
        out = stages.prepare(settings)
        run.summary(out)
    print(f"[prepare] {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    prepare_flow(ap.parse_args().params)
