"""Prefect flow for the 'prepare' stage (`dvc repro` runs `python flows/prepare.py`)."""
from _bootstrap import ROOT  # hermetic defaults before prefect is imported

import argparse
import os

from prefect import flow

from trinity import stages
from trinity.config import load_settings
from trinity.tracking import StageRun


@flow(name="trinity-prepare")
def prepare_flow(params: str = "params.yaml") -> dict:
    settings = load_settings(params if os.path.isabs(params) else ROOT / params)
    with StageRun(settings, "prepare", root=ROOT) as run:
        out = stages.prepare(settings, stages.Paths(ROOT))
        run.summary(out)
    print(f"[prepare] {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    prepare_flow(ap.parse_args().params)
