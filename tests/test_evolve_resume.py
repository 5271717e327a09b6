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


def _set_generations(root: Path, n: int) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["evolve"]["generations"] = n
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def _history(root: Path) -> list[dict]:
    return json.loads((root / "data/evolve/history.json").read_text())


def test_kill9_then_resume_matches_uninterrupted_run(tmp_path):
    """Reference `a`: one uninterrupted run of G+2 generations. `b`: G generations, kill -9 at a random moment,
    the same command again, then asked for G+2: it carries on from G, and ends with a's exact parameters."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    G = TINY["evolve"]["generations"]
    a, b = tmp_path / "a", tmp_path / "b"
    _setup(a)
    _set_generations(a, G + 2)
    subprocess.run(_cli(a, "evolve"), check=True, capture_output=True, timeout=900, env=env)
    ha = _history(a)
    calls_a = json.loads((a / "data/evolve/metrics.json").read_text())["calls_made"]
    calls_a_first_g = sum(h["calls_made"] for h in ha[:G])
    assert calls_a > calls_a_first_g > 0

    _setup(b)
    duration = sum(h["wall_s"] for h in ha[:G])
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
    hb = _history(b)
    assert len(hb) == G
    assert [h["best_fitness"] for h in hb] == [h["best_fitness"] for h in ha[:G]]
    # nothing paid twice: the resumed run paid only for what the killed one had not stored
    assert paid_before + calls_resumed == calls_a_first_g == _responses(b)

    _set_generations(b, G + 2)  # more generations: the finished run carries on, it does not start over
    subprocess.run(_cli(b, "evolve"), check=True, capture_output=True, timeout=900, env=env)
    hb = _history(b)
    assert [h["generation"] for h in hb] == list(range(G + 2))
    assert [h["best_fitness"] for h in hb] == [h["best_fitness"] for h in ha]
    np.testing.assert_array_equal(np.load(a / "data/checkpoints/coordinator.npy"),
                                  np.load(b / "data/checkpoints/coordinator.npy"))
    assert _responses(b) == _responses(a) == calls_a
    print(f"killed={killed} after {delay:.1f}s of {duration:.1f}s; paid before kill {paid_before}, "
          f"after {calls_resumed}, uninterrupted {calls_a_first_g} (+{calls_a - calls_a_first_g} for 2 more generations)")


def test_sep_cma_pickled_mid_run_asks_what_the_uninterrupted_run_asks():
    """In-process check of the mechanism: pycma's sampler must not live on numpy's global RNG (pickling its bound
    `randn` would copy a stale RandomState), and other np.random use must not shift it."""
    import pickle

    from trinity.evolve.sep_cma import SepCMA

    def fitness(X):
        return np.array([float(np.sum(x[:5])) for x in X])

    def run(o, gens, meddle=False):
        out = []
        for _ in range(gens):
            X = o.ask()
            if meddle:
                np.random.rand(7)  # someone else draws from the global RNG mid-generation
            o.tell(X, fitness(X), None)
            out.append(X)
        return out

    ref = run(SepCMA(500, 0.5, 6, seed=3), 3)
    o = SepCMA(500, 0.5, 6, seed=3)
    first = run(o, 1, meddle=True)
    blob = pickle.dumps(o)
    np.random.seed(99)  # the resuming process's global RNG is anything at all
    resumed = pickle.loads(blob)
    resumed.resume()
    rest = run(resumed, 2, meddle=True)
    for want, got in zip(ref, first + rest):
        np.testing.assert_array_equal(np.asarray(want), np.asarray(got))
    state = np.random.get_state()[1].copy()
    SepCMA(500, 0.5, 6, seed=3).ask()
    assert np.array_equal(state, np.random.get_state()[1])  # the optimiser leaves the global RNG alone
