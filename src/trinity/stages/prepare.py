"""prepare: draw the training, in-distribution and held-out items from the benchmarks (params `data`) and write
them to data/prepared/, guarded against contamination (`trinity.data.splits`)."""
from __future__ import annotations

from trinity.config import Settings
from trinity.files import write_json
from trinity.stages.lineage import lineage
from trinity.stages.paths import SPLIT_FILES, Paths


def run(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    from trinity.data.splits import build_all_splits, save_tasks

    d = settings.data
    splits = build_all_splits(d.resolved_root(), train=d.train, in_distribution=d.in_distribution,
                              heldout=d.heldout, seed=d.seed, math500_max_level=d.math500_max_level)
    paths.prepared.mkdir(parents=True, exist_ok=True)
    for split, name in SPLIT_FILES.items():
        save_tasks(paths.prepared / name, getattr(splits, split))
    summary = {split: len(getattr(splits, split)) for split in SPLIT_FILES}
    summary |= {f"{split}_sources": sorted({t.source for t in getattr(splits, split)}) for split in SPLIT_FILES}
    write_json(paths.prepared / "summary.json", summary)
    lineage(tracker, logs="prepared", files=[paths.prepared / n for n in (*SPLIT_FILES.values(), "summary.json")],
            metadata=summary)
    return summary
