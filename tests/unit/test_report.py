"""The stage dispatch names an unknown stage (the report itself: tests/unit/test_report_module.py)."""
import pytest

from trinity.stages import run_stage


def test_unknown_stage_is_named():
    with pytest.raises(ValueError, match="unknown stage 'evolv'.*prepare, encode, evolve"):
        run_stage("evolv", None)
