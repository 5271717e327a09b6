"""Prefect flow for the 'evolve' stage (`dvc repro` runs `python flows/evolve.py`)."""
from _bootstrap import main  # hermetic defaults and this checkout's src/ first, before prefect is imported

from prefect import flow

from trinity.ops.stage_flow import run_stage


@flow(name="trinity-evolve")
def evolve_flow(params: str = "params.yaml", timeout_minutes: float | None = None) -> dict:
    """Run the evolve stage with the given params file (relative paths are from the project root); stop it after
    timeout_minutes (None: no limit)."""
    return run_stage("evolve", params, timeout_minutes=timeout_minutes)


if __name__ == "__main__":
    main(evolve_flow)
