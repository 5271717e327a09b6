"""kill -9 at a random moment of an evolve run, then the same command again: the parameters equal an
uninterrupted run's (same seed) and no call already paid for is paid again."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml

from trinity.config import PROJECT_ROOT, load_settings

TINY = {
    "data": {"root": str((PROJECT_ROOT / "../shared/benchmarks").resolve()), "train": {"math500": 3, "mmlu": 1},
             "heldout": {"gsm8k": 1}, "math500_max_level": 1},
    "pool": {"members": [
        {"name": "smol-a", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 24, "temperature": 0.8},
        {"name": "smol-b", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 16, "temperature": 0.3},
    ]},
    "coordinator": {"max_turns": 3, "thinker_max_tokens": 16, "verifier_max_tokens": 4, "max_encode_tokens": 384},
    "evolve": {"generations": 4, "popsize": 6, "episodes_per_candidate": 2, "sigma0": 0.5},
}


def _cli(root: Path, *args) -> list[str]:
    return [sys.executable, "-m", "trinity.cli", "stage", *args, "--root", str(root), "--params", str(root / "params.yaml")]


def _setup(root: Path) -> None:
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(TINY))
    load_settings(root / "params.yaml")
    for stage in ("prepare", "encode"):
        subprocess.run(_cli(root, stage), check=True, capture_output=True, timeout=600)


def _responses(root: Path) -> int:
    con = duckdb.connect(str(root / "data/store/trinity.duckdb"), read_only=True)
    try:
        return con.execute("SELECT count(*) FROM responses").fetchone()[0]
    finally:
        con.close()


def test_kill9_then_resume_matches_uninterrupted_run(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled"}
    a, b = tmp_path / "a", tmp_path / "b"
    _setup(a)
    t0 = time.perf_counter()
    subprocess.run(_cli(a, "evolve"), check=True, capture_output=True, timeout=900, env=env)
    duration = time.perf_counter() - t0
    calls_a = json.loads((a / "data/evolve/metrics.json").read_text())["calls_made"]
    assert calls_a > 0

    _setup(b)
    delay = random.uniform(0.3, 0.9) * duration
    p = subprocess.Popen(_cli(b, "evolve"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    time.sleep(delay)
    killed = p.poll() is None
    if killed:
        os.kill(p.pid, signal.SIGKILL)
    p.wait()
    paid_before = _responses(b)
    subprocess.run(_cli(b, "evolve"), check=True, capture_output=True, timeout=900, env=env)
    calls_resumed = json.loads((b / "data/evolve/metrics.json").read_text())["calls_made"]

    np.testing.assert_array_equal(np.load(a / "data/checkpoints/coordinator.npy"),
                                  np.load(b / "data/checkpoints/coordinator.npy"))
    ha = json.loads((a / "data/evolve/history.json").read_text())
    hb = json.loads((b / "data/evolve/history.json").read_text())
    assert [h["best_fitness"] for h in ha] == [h["best_fitness"] for h in hb]
    # nothing paid twice: the resumed run paid only for what the killed one had not stored
    assert paid_before + calls_resumed == calls_a == _responses(b) == _responses(a)
    print(f"killed={killed} after {delay:.1f}s of {duration:.1f}s; paid before kill {paid_before}, "
          f"after {calls_resumed}, uninterrupted {calls_a}")
