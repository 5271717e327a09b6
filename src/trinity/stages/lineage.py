"""The W&B lineage of the pipeline's artifacts: which ones a stage's run consumed and the one it produced, each by
the exact version its files are (`trinity.ops.tracking.content_alias`). The tracker
(`trinity.ops.tracking.StageRun`) is passed in; without one (tests, `trinity stage`) nothing is recorded."""
from __future__ import annotations

from pathlib import Path

ARTIFACTS = {"prepared": ("prepared-data", "dataset"), "checkpoint": ("coordinator", "model"),
             "router-checkpoint": ("router", "model"), "eval": ("eval-results", "evaluation")}
"""W&B artifacts of the pipeline (name, type): prepared data → checkpoints (the coordinator, the learned router)
→ eval results (the lineage)."""


def artifact_files(key: str, paths) -> list[Path]:
    """The files artifact `key` holds in the checkout `paths` (`stages.paths.Paths`): what its producer logs and
    what a consumer names the version of."""
    from trinity.stages.paths import SPLIT_FILES

    if key == "prepared":
        return [*(paths.prepared / n for n in SPLIT_FILES.values()), paths.metrics("prepare")]
    if key == "checkpoint":
        return [paths.checkpoint.with_suffix(".npy"), paths.checkpoint.with_suffix(".json")]
    if key == "router-checkpoint":
        return [paths.router_checkpoint.with_suffix(".npy"), paths.router_checkpoint.with_suffix(".json")]
    if key == "eval":
        return [paths.eval_dir / "results.json", paths.metrics("evaluate"), paths.eval_dir / "episodes.jsonl"]
    raise KeyError(f"no artifact {key!r} (known: {sorted(ARTIFACTS)})")


def lineage(tracker, paths, uses: tuple[str, ...] = (), logs: str | None = None,
            metadata: dict | None = None) -> None:
    """Record in the stage's W&B run which artifacts it consumed (their exact versions) and the one it produced."""
    if tracker is None:
        return
    for key in uses:
        files = [p for p in artifact_files(key, paths) if p.exists()]
        tracker.use_artifact(*ARTIFACTS[key], files or None)
    if logs is not None:
        tracker.log_artifact(*ARTIFACTS[logs], [p for p in artifact_files(logs, paths) if p.exists()],
                             metadata=metadata)
