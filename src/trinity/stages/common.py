"""What more than one stage needs: the prepared splits (re-checked by the contamination guard). The encoder and
role caps the settings name are the trained policy's (`trinity.coordinator.policy`)."""
from __future__ import annotations

from trinity.stages.paths import SPLIT_FILES, Paths


def load_tasks(paths: Paths):
    """The prepared splits (train, in_distribution, heldout, validation), re-checked by the contamination guard: an edited
    file that puts an evaluation item in training fails here, loudly, before any model is called."""
    from trinity.data.splits import Splits, assert_no_contamination, load_tasks as load

    for name in SPLIT_FILES.values():
        if not (paths.prepared / name).exists():
            raise FileNotFoundError(f"{paths.prepared / name} is missing: run the prepare stage first")
    splits = Splits(**{split: load(paths.prepared / name) for split, name in SPLIT_FILES.items()})
    assert_no_contamination(splits.train, [*splits.in_distribution, *splits.heldout, *splits.validation])
    assert_no_contamination(splits.validation, [*splits.in_distribution, *splits.heldout])
    return splits
