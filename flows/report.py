"""Prefect flow for the 'report' stage (`dvc repro` runs `python flows/report.py`)."""
from _bootstrap import main, run_stage  # hermetic defaults before prefect is imported

from prefect import flow


@flow(name="trinity-report")
def report_flow(params: str = "params.yaml") -> dict:
    """Run the report stage with the given params file (relative paths are from the project root)."""
    return run_stage("report", params)


if __name__ == "__main__":
    main(report_flow)
