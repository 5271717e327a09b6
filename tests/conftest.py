"""Hermetic settings for every test: no telemetry, no hub, Prefect/W&B state in a temp dir."""
import os
import tempfile

_tmp = tempfile.mkdtemp(prefix="trinity-test-")
os.environ.setdefault("PREFECT_HOME", os.path.join(_tmp, "prefect"))
os.environ["DO_NOT_TRACK"] = "1"
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")  # raise it on a busy machine
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")  # as flows/_bootstrap.py: one INFO line per task run is noise
os.environ["DVC_NO_ANALYTICS"] = "1"
os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("WANDB_DIR", os.path.join(_tmp, "wandb"))
os.environ["WANDB_SILENT"] = "true"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.pop("TRINITY_STORE", None)  # a user's explicit store (trinity.stages.paths.STORE_ENV) is not the tests'


import pytest
from pathlib import Path

_BENCHMARKS = Path(os.environ.get("TRINITY_DATA_DIR")
                   or Path(__file__).resolve().parents[1] / ".." / "shared" / "benchmarks").resolve()


@pytest.fixture(scope="session")
def root() -> Path:
    """The benchmark directory (TRINITY_DATA_DIR, else ../shared/benchmarks beside the project)."""
    if not (_BENCHMARKS / "SOURCES.md").is_file():
        pytest.fail(f"benchmark data not found at {_BENCHMARKS}; set TRINITY_DATA_DIR")
    return _BENCHMARKS
