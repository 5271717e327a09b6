"""The whole pipeline as one Prefect flow (for deployments); `dvc repro` runs the stage flows instead."""
from _bootstrap import main  # hermetic defaults before prefect is imported

from prefect import flow

from encode import encode_flow
from evaluate import evaluate_flow
from evolve import evolve_flow
from prepare import prepare_flow
from report import report_flow
from router import router_flow


@flow(name="trinity-pipeline")
def pipeline_flow(params: str = "params.yaml") -> dict:
    """prepare → encode → evolve → router → evaluate → report, each as a subflow."""
    return {name: fl(params) for name, fl in [("prepare", prepare_flow), ("encode", encode_flow),
                                              ("evolve", evolve_flow), ("router", router_flow),
                                              ("evaluate", evaluate_flow), ("report", report_flow)]}


if __name__ == "__main__":
    main(pipeline_flow)
