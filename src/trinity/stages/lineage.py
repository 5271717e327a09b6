"""The W&B lineage of the pipeline's artifacts: which ones a stage's run consumed and the one it produced. The
tracker (`trinity.ops.tracking.StageRun`) is passed in; without one (tests, `trinity stage`) nothing is recorded."""
from __future__ import annotations

from pathlib import Path

ARTIFACTS = {"prepared": ("prepared-data", "dataset"), "checkpoint": ("coordinator", "model"),
             "router-checkpoint": ("router", "model"), "eval": ("eval-results", "evaluation")}
"""W&B artifacts of the pipeline (name, type): prepared data → checkpoints (the coordinator, the learned router)
→ eval results (the lineage)."""


def lineage(tracker, uses: tuple[str, ...] = (), logs: str | None = None, files: list[Path] = (),
            metadata: dict | None = None) -> None:
    """Record in the stage's W&B run which artifacts it consumed and the one it produced."""
    if tracker is None:
        return
    for key in uses:
        tracker.use_artifact(*ARTIFACTS[key])
    if logs is not None:
        tracker.log_artifact(*ARTIFACTS[logs], [p for p in files if p.exists()], metadata=metadata)
