"""Where the pipeline's files live: `Paths` for a checkout, and the workspace whose store a DVC experiment shares."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trinity.config import PROJECT_ROOT

DVC_EXPERIMENT_DIRS = (".dvc", "tmp", "exps")
"""Where DVC runs an experiment outside the workspace: a temporary copy under <workspace>/.dvc/tmp/exps/ (`tmpXXXX`, or
`standalone/tmpXXXX` for `dvc exp run --temp`), removed once the experiment is committed."""

SPLIT_FILES = {"train": "train.jsonl", "in_distribution": "in_distribution.jsonl", "heldout": "heldout.jsonl"}
"""The prepare stage's outputs under data/prepared/: split → file."""


def dvc_workspace(root: Path) -> Path:
    """The workspace `root` is a checkout of: `root` itself, or, when `root` is a temporary copy DVC made to run a
    queued or `--temp` experiment (under <workspace>/.dvc/tmp/exps/), that workspace. Its store is the one the
    experiment shares: the calls and hidden states the workspace already paid for are not paid again, and an
    ablation's experiments reuse one another's (DuckDB's one writer at a time: one experiment at a time)."""
    root = Path(root)
    for ws in root.parents:
        if ws.joinpath(*DVC_EXPERIMENT_DIRS) in root.parents and (ws / ".dvc" / "config").is_file():
            return ws
    return root


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
    def store(self) -> Path: return dvc_workspace(self.root) / "data" / "store" / "trinity.duckdb"
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
