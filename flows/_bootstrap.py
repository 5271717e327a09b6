"""Imported first by every flow: hermetic defaults (no telemetry, no hub, local Prefect state) and this checkout's
`src/` first on sys.path, before Prefect is imported; `main`, what `python flows/<stage>.py` runs. The tasks a stage
flow is made of are in `trinity.ops.stage_flow` (importable by Dask workers, which a flow script's functions are not).

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


def check_prefect_api() -> None:
    """A PREFECT_API_URL that does not answer stops the run here, naming it (exit status 2), before anything runs.
    Unset: Prefect starts an ephemeral API for the run."""
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        return
    with get_client(sync_client=True) as client:
        err = client.api_healthcheck()
    if err is not None:
        print(f"error: the Prefect API at {url} (PREFECT_API_URL) is unreachable: {type(err).__name__}: {err}. "
              "Start that server, or unset PREFECT_API_URL to run on an ephemeral API", file=sys.stderr)
        sys.exit(2)


def main(flow_fn) -> None:
    """`python flows/<stage>.py [--params FILE]`: what `dvc repro` runs."""
    import argparse

    from trinity.ops.process_guard import guard_this_process

    ap = argparse.ArgumentParser(description=flow_fn.__doc__)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    check_prefect_api()
    guard_this_process()  # the ephemeral Prefect server, Dask workers etc. end with this process, even on SIGKILL
    flow_fn(args.params)
