"""Prefect flow for the 'report' stage (`dvc repro` runs `python flows/report.py`)."""
from _bootstrap import ROOT  # hermetic defaults before prefect is imported

import argparse
import os

from prefect import flow

from trinity import stages
from trinity.config import load_settings
from trinity.tracking import StageRun


@flow(name="trinity-report")
def report_flow(params: str = "params.yaml") -> dict:
    settings = load_settings(params if os.path.isabs(params) else ROOT / params)
    with StageRun(settings, "report", root=ROOT) as run:
        out = {"report": str(stages.report(settings, stages.Paths(ROOT)))}
        run.summary(out)
    print(f"[report] {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    report_flow(ap.parse_args().params)
