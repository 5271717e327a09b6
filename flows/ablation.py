"""Prefect flow for the optimiser ablation (`dvc repro ablation/dvc.yaml` runs `python flows/ablation.py`).

Not part of the default chain: plain `dvc repro` reproduces ./dvc.yaml only (prepare → … → report);
the ablation's stage lives in its own pipeline file, ablation/dvc.yaml, and trains three coordinators.
"""
from _bootstrap import main, run_stage  # hermetic defaults before prefect is imported

from prefect import flow


def _scalars(out: dict) -> dict:
    """W&B summary: every numeric result of every method, as '<method>/<key>'."""
    return {f"{r['method']}/{k}": v for r in out["methods"] for k, v in r.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)}


@flow(name="trinity-ablation")
def ablation_flow(params: str = "params.yaml", timeout_minutes: float | None = None) -> dict:
    """Train sep-CMA-ES, REINFORCE and random search on the same budget; write reports/ablation.md."""
    return run_stage("ablation", params, summarize=_scalars, timeout_minutes=timeout_minutes)


if __name__ == "__main__":
    main(ablation_flow)
