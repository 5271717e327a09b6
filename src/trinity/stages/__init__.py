"""The pipeline stages: prepare → encode → evolve → router → evaluate → report, one module each.

Each stage module has one `run(settings, paths, tracker=None) -> dict`: it reads the previous stage's outputs
under `<root>/data` (`paths.Paths`) and its own `params.yaml` sections, and writes its own outputs (the DVC outs in
dvc.yaml). flows/ wraps each in a Prefect flow (`trinity.ops.stage_flow`), `trinity stage <name>` runs one, tests
call them directly. The memo store (<root>/data/store/trinity.duckdb) is shared by the stages and is not a DVC
output: it is a content-addressed cache, so any rerun makes no LLM call for a stored request.
"""
from __future__ import annotations

import importlib

STAGES: dict[str, str] = {
    "prepare": "trinity.stages.prepare",    # benchmarks → data/prepared/{train,in_distribution,heldout}.jsonl
    "encode": "trinity.stages.encode",      # prepared tasks → data/encode/root_states.parquet (+ the store)
    "evolve": "trinity.stages.evolve",      # train split → data/checkpoints/coordinator.{npy,json}, data/evolve/
    "router": "trinity.stages.router",      # train split → data/router/router.{npy,json}, data/router/ (baseline)
    "evaluate": "trinity.stages.evaluate",  # checkpoint + evaluation splits → data/eval/{results.json,...}
    "report": "trinity.stages.report",      # data/eval, data/evolve → reports/summary.md, traces.md, plots/
}
"""The stages in pipeline order: name → the module whose `run` is the stage (the one dispatch)."""


def run_stage(name: str, settings, paths=None, tracker=None) -> dict:
    """Run one stage by name: the single dispatch behind every Prefect flow and `trinity stage`.
    Returns the stage's result as a JSON-able dict."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}: expected one of {', '.join(STAGES)}")
    from trinity.stages.paths import Paths

    return importlib.import_module(STAGES[name]).run(settings, paths or Paths(), tracker=tracker)
