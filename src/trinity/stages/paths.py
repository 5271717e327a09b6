"""Where the pipeline's files live: `Paths` for a checkout, and the store it uses (its own, or $TRINITY_STORE)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trinity.config import PROJECT_ROOT

STORE_ENV = "TRINITY_STORE"
"""The response and hidden-state store to use instead of the checkout's own (data/store/trinity.duckdb): an
absolute path. Set it where a run happens in a copy of the checkout that should not pay again for what the checkout
already stored: `make ablation` sets it for its `dvc exp run --temp` experiments (DVC runs those in a temporary
copy of the workspace); set it yourself for `dvc exp run --temp` / `--queue`. Where the store is does not change
what a stage computes (every call is keyed by its request), so it is no stage's param. DuckDB: one writer process
per file, so experiments that share a store run one at a time."""

SPLIT_FILES = {"train": "train.jsonl", "in_distribution": "in_distribution.jsonl", "heldout": "heldout.jsonl",
               "validation": "validation.jsonl"}
"""The prepare stage's outputs under data/prepared/: split → file."""


def store_path(root: Path) -> Path:
    """The store of checkout `root`: $TRINITY_STORE when set (`STORE_ENV`), else <root>/data/store/trinity.duckdb."""
    explicit = os.environ.get(STORE_ENV, "").strip()
    if not explicit:
        return Path(root) / "data" / "store" / "trinity.duckdb"
    path = Path(explicit).expanduser()
    if not path.is_absolute():
        raise ValueError(f"{STORE_ENV}={explicit!r}: the store's path must be absolute (a relative one would be "
                         f"read against each copy of the checkout a run happens in, e.g. DVC's temporary copy)")
    if path.is_dir():
        raise ValueError(f"{STORE_ENV}={explicit!r} is a directory: name the store's file (e.g. "
                         f"{path / 'trinity.duckdb'})")
    return path


@dataclass(frozen=True)
class Paths:
    root: Path = PROJECT_ROOT

    @property
    def data(self) -> Path: return self.root / "data"
    @property
    def prepared(self) -> Path: return self.data / "prepared"
    @property
    def encoded(self) -> Path: return self.data / "encode"
    @property
    def store(self) -> Path: return store_path(self.root)
    @property
    def checkpoint(self) -> Path: return self.data / "checkpoints" / "coordinator"
    @property
    def evolve_dir(self) -> Path: return self.data / "evolve"
    @property
    def router_checkpoint(self) -> Path: return self.router_dir / "router"  # not in checkpoints/: one model there
    @property
    def router_dir(self) -> Path: return self.data / "router"
    @property
    def eval_dir(self) -> Path: return self.data / "eval"
    @property
    def exports(self) -> Path: return self.data / "exports"
    @property
    def reports(self) -> Path: return self.root / "reports"
    @property
    def metrics_dir(self) -> Path: return self.reports / "metrics"

    def metrics(self, stage: str) -> Path:
        """The stage's metrics file (`dvc metrics show`, `dvc exp show`): small, so kept in git (`cache: false`),
        where a fresh clone, and every experiment's commit, has it without `dvc pull`."""
        return self.metrics_dir / f"{stage}.json"
