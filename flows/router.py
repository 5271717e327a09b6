"""Prefect flow for the 'router' stage (`dvc repro` runs `python flows/router.py`)."""
from _bootstrap import main  # hermetic defaults and this checkout's src/ first, before prefect is imported

from prefect import flow

from trinity.ops.stage_flow import run_stage


@flow(name="trinity-router")
def router_flow(params: str = "params.yaml", timeout_minutes: float | None = None) -> dict:
    """Run the router stage (the learned-router baseline) with the given params file (relative paths are from the
    project root); stop it after timeout_minutes (None: no limit)."""
    return run_stage("router", params, timeout_minutes=timeout_minutes)


if __name__ == "__main__":
    main(router_flow)
