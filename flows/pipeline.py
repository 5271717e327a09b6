"""The whole pipeline as one Prefect flow (for deployments); `dvc repro` runs the stage flows instead."""
import _bootstrap  # noqa: F401

import argparse

from prefect import flow

from encode import encode_flow
from evaluate import evaluate_flow
from evolve import evolve_flow
from prepare import prepare_flow
from report import report_flow


@flow(name="trinity-pipeline")
def pipeline_flow(params: str = "params.yaml") -> dict:
    out = {}
    for name, fl in [("prepare", prepare_flow), ("encode", encode_flow), ("evolve", evolve_flow),
                     ("evaluate", evaluate_flow), ("report", report_flow)]:
        out[name] = fl(params)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    pipeline_flow(ap.parse_args().params)
