"""report: reports/summary.md, traces.md and plots/ from the run's own files (`trinity.evaluation.report`)."""
from __future__ import annotations

from trinity.config import Settings
from trinity.stages.paths import Paths


def run(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    """reports/summary.md, reports/plots/*.png and reports/traces.md from the run's own files (trinity.evaluation.report):
    its declared dependencies only. (The store's Parquet export is `trinity export`: the store is a cache every
    run adds to, so its export is no output of this stage's dependencies.)"""
    from trinity.evaluation.report import write_report

    written = write_report(paths.eval_dir, paths.evolve_dir, paths.checkpoint.with_suffix(".json"), paths.reports)
    if tracker is not None:  # the tables were logged by the evaluate stage's run; the report's run shows the plots
        for name, p in written.items():
            if p.suffix == ".png":
                tracker.image(f"plots/{name}", p)
    return {name: str(p) for name, p in written.items()}
