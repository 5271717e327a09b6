"""Prefect flow for the 'encode' stage (`dvc repro` runs `python flows/encode.py`)."""
from _bootstrap import main  # hermetic defaults and this checkout's src/ first, before prefect is imported

from prefect import flow

from trinity.ops.stage_flow import run_stage


@flow(name="trinity-encode")
def encode_flow(params: str = "params.yaml") -> dict:
    """Run the encode stage with the given params file (relative paths are from the project root)."""
    return run_stage("encode", params)


if __name__ == "__main__":
    main(encode_flow)
