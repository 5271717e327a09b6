"""Prefect flow for the 'encode' stage (`dvc repro` runs `python flows/encode.py`)."""
import _bootstrap  # noqa: F401  (hermetic defaults before prefect is imported)

import argparse

from prefect import flow

from trinity import stages
from trinity.config import load_settings
from trinity.tracking import StageRun


@flow(name="trinity-encode", log_prints=True)
def encode_flow(params: str = "params.yaml") -> dict:
    settings = load_settings(params)
    with StageRun(settings, "encode") as run:
        out = stages.encode(settings)
        run.summary(out)
    print(f"[encode] {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    encode_flow(ap.parse_args().params)
