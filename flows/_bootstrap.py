"""Imported first by every flow: hermetic defaults (no telemetry, no hub, local Prefect state).

Only defaults: a user's own PREFECT_API_URL / WANDB_MODE / etc. win.
"""
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The stage runs this checkout's own code (the code DVC tracks as the stage's deps), whichever copy of
# trinity the venv has installed.
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("PREFECT_HOME", str(ROOT / "data" / "prefect"))
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def run_stage(name: str, params: str = "params.yaml", summarize=None) -> dict:
    """The body of every stage flow: load and validate params, open the stage's W&B run, run the stage
    (trinity.stages.run_stage), log its summary (`summarize(out)` when given, else the result itself)."""
    from trinity import stages
    from trinity.config import load_settings
    from trinity.tracking import StageRun

    settings = load_settings(params if os.path.isabs(params) else ROOT / params)
    with StageRun(settings, name, root=ROOT) as run:
        out = stages.run_stage(name, settings, stages.Paths(ROOT), tracker=run)
        run.summary(summarize(out) if summarize else out)
    print(f"[{name}] {out if summarize is None else summarize(out)}")
    return out


def main(flow_fn) -> None:
    """`python flows/<stage>.py [--params FILE]`: what `dvc repro` runs."""
    import argparse

    ap = argparse.ArgumentParser(description=flow_fn.__doc__)
    ap.add_argument("--params", default="params.yaml")
    flow_fn(ap.parse_args().params)
