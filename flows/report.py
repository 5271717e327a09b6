"""Prefect flow for the 'report' stage (`dvc repro` runs `python flows/report.py`)."""
from pathlib import Path

from _bootstrap import ROOT, main  # hermetic defaults and this checkout's src/ first, before prefect is imported

from prefect import flow

from trinity.ops.stage_flow import load_params, run_stage


@flow(name="trinity-report")
def report_flow(params: str = "params.yaml") -> dict:
    """Run the report stage with the given params file (relative paths are from the project root); when W&B
    is online, then build and save the W&B Report of this pipeline run (its group: trinity.ops.tracking.wandb_group),
    from the stage runs' files once the report's own run has finished."""
    out = run_stage("report", params)
    wandb_report(params)
    return out


def wandb_report(params: str):
    import os

    from trinity.ops.tracking import wandb_group
    from trinity.ops.wandb_report import publish_if_online

    settings = load_params.fn(params)
    return publish_if_online(Path(os.environ.get("WANDB_DIR") or ROOT / "data" / "wandb"), group=wandb_group(),
                             project=settings.tracking.wandb_project,
                             mode=os.environ.get("WANDB_MODE") or settings.tracking.wandb_mode)


if __name__ == "__main__":
    main(report_flow)
