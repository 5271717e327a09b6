"""W&B tracking: one run per pipeline stage, offline by default (env WANDB_MODE overrides params).

Everything logged passes through `redact` first, so no API key reaches a W&B config, summary or table.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trinity.code_version import code_version
from trinity.config import PROJECT_ROOT, Settings
from trinity.tracking_redact import redact, register_pool


class StageRun:
    """A thin wrapper over a wandb run: log metrics, tables and a summary, all redacted."""

    def __init__(self, settings: Settings, stage: str, config: dict[str, Any] | None = None,
                 root: Path = PROJECT_ROOT):
        import wandb

        from trinity.stages import run_id

        register_pool(settings.pool)
        mode = os.environ.get("WANDB_MODE") or settings.tracking.wandb_mode
        wandb_dir = Path(os.environ.get("WANDB_DIR") or root / "data" / "wandb")
        wandb_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self._wandb = wandb
        self.run = wandb.init(
            project=settings.tracking.wandb_project, job_type=stage, group="pipeline", mode=mode,
            dir=str(wandb_dir), name=run_id(settings, stage),
            config=redact({"stage": stage, "params": settings.model_dump(exclude={"source_path"}),
                           "params_hash": settings.params_hash(), "code_version": code_version(),
                           **(config or {})}),
            settings=wandb.Settings(console="off", x_disable_stats=True), reinit="finish_previous")

    @property
    def dir(self) -> str | None:
        return getattr(self.run, "dir", None)

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        self.run.log(redact(metrics), step=step)

    def table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        self.run.log({key: self._wandb.Table(columns=columns, data=redact(rows))})

    def summary(self, values: dict[str, Any]) -> None:
        for k, v in redact(values).items():
            self.run.summary[k] = v

    def finish(self) -> None:
        self.run.finish()

    def __enter__(self) -> "StageRun":
        return self

    def __exit__(self, exc_type, *_) -> None:
        self.run.finish(exit_code=1 if exc_type else 0)
