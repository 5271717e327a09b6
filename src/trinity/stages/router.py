"""router: train the learned-router baseline (`trinity.coordinator.router`: the coordinator with one turn, Worker only)
with the evolve stage's settings, items and budget; writes data/router/ (router.{npy,json}, history, metrics)."""
from __future__ import annotations

from trinity.config import Settings
from trinity.stages.paths import Paths


def run(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    from trinity.coordinator.router import router_settings
    from trinity.stages.evolve import train_and_save

    return train_and_save(router_settings(settings), paths, tracker, name="router", checkpoint=paths.router_checkpoint,
                          out_dir=paths.router_dir)
