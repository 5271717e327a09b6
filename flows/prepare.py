"""Prefect flow for the 'prepare' stage (`dvc repro` runs `python flows/prepare.py`)."""
from _bootstrap import main  # hermetic defaults and this checkout's src/ first, before prefect is imported

from prefect import flow

from trinity.ops.stage_flow import run_stage


@flow(name="trinity-prepare")
def prepare_flow(params: str = "params.yaml") -> dict:
    """Run the prepare stage with the given params file (relative paths are from the project root)."""
    return run_stage("prepare", params)


if __name__ == "__main__":
    main(prepare_flow)
