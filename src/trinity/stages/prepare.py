"""prepare: draw the training, in-distribution and held-out items from the benchmarks (params `data`: the staged
ones and your own, `data.user_benchmarks`) and write them to data/prepared/, guarded against contamination
(`trinity.data.splits`)."""
from __future__ import annotations

import sys

from trinity.config import PROJECT_ROOT, Settings
from trinity.files import write_json
from trinity.stages.lineage import lineage
from trinity.stages.paths import SPLIT_FILES, Paths


def run(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    from trinity.data.splits import save_tasks, splits_from_settings

    d = settings.data
    tracked = PROJECT_ROOT / "benchmarks"
    for name, path in d.resolved_user_benchmarks().items():
        if not path.is_relative_to(tracked):
            print(f"[prepare] data.user_benchmarks.{name}: {path} is outside {tracked} (a dependency of this stage): "
                  "DVC will not see it change; move it there, or rerun with `dvc repro -f -s prepare`",
                  file=sys.stderr, flush=True)
    splits = splits_from_settings(d)
    paths.prepared.mkdir(parents=True, exist_ok=True)
    for split, name in SPLIT_FILES.items():
        save_tasks(paths.prepared / name, getattr(splits, split))
    summary = {split: len(getattr(splits, split)) for split in SPLIT_FILES}
    summary |= {f"{split}_sources": sorted({t.source for t in getattr(splits, split)}) for split in SPLIT_FILES}
    write_json(paths.metrics("prepare"), summary)
    lineage(tracker, paths, logs="prepared", metadata=summary)
    return summary
