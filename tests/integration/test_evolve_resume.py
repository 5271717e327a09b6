"""kill -9 at a random moment inside an evolve run (after its checkpoint holds at least one generation, before
the last), then the same command again: the parameters equal an uninterrupted run's (same seed) and no call
already paid for is paid again."""
import json
import os
import pickle
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
    # in-process: a resumed run is compared with an uninterrupted one made from an empty store, byte for byte
    "pool": {"local_engine": "in-process", "members": [
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


def _outcomes(history: list[dict]) -> list[dict]:
    """What each generation came to, without how this process got there (timings, calls paid, store hits): its
    fitness figures, accuracy, step size and model/role usage."""
    keep = {"generation", "sigma", "model_usage", "role_usage", "model_entropy"}
    out = [{k: v for k, v in h.items() if "fitness" in k or "accuracy" in k or k in keep} for h in history]
    assert all("mean_fitness" in o and "sigma" in o for o in out)
    return out


def _checkpoint(root: Path):
    """The evolve stage's resume pickle (a `RunState`, written atomically after every generation), or None before
    the first."""
    try:
        with open(root / "data/store/evolve_state.pkl", "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None


@pytest.mark.filterwarnings("ignore:Could not import matplotlib")  # reading the pickle imports pycma
def test_kill9_then_resume_matches_uninterrupted_run(tmp_path):
    """Reference `a`: one uninterrupted run of G+2 generations. `b`: G generations, kill -9 at a random moment inside
    generation k (0 < k < G−1, chosen at random; the checkpoint pickle must say k generations were played), the same
    command again, then asked for G+2: it carries on from k, then from G, and ends with a's exact parameters."""
    env = {**os.environ, "WANDB_MODE": "disabled"}
    G = TINY["evolve"]["generations"]
    a, b = tmp_path / "a", tmp_path / "b"
    _setup(a)
    _set_generations(a, G + 2)
    subprocess.run(_cli(a, "evolve"), check=True, capture_output=True, timeout=900, env=env)
    ha = _history(a)
    calls_a = json.loads((a / "reports/metrics/evolve.json").read_text())["calls_made"]
    calls_a_first_g = sum(h["calls_made"] for h in ha[:G])
    assert calls_a > calls_a_first_g > 0

    _setup(b)
    k = random.randint(1, G - 2)  # kill inside generation k: k generations are in the checkpoint, G - k are not
    into = random.uniform(0.0, 0.5)  # how far into generation k (a fraction of a's time for it)
    p = subprocess.Popen(_cli(b, "evolve"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        deadline = time.monotonic() + 900
        while (ck := _checkpoint(b)) is None or ck.generation < k:
            assert p.poll() is None, f"the run exited (rc {p.returncode}) before its checkpoint reached generation {k}"
            assert time.monotonic() < deadline, f"no checkpoint of generation {k} within 900 s"
            time.sleep(0.01)
        time.sleep(into * ha[k]["wall_s"])
        assert p.poll() is None, "the run finished before the kill: it would not test a resume"
        os.kill(p.pid, signal.SIGKILL)
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()
    assert p.returncode == -signal.SIGKILL  # it died of the kill, not of finishing
    ck = _checkpoint(b)
    killed_at = ck.generation
    assert k <= killed_at < G, f"checkpoint at generation {killed_at} after a kill meant for generation {k} of {G}"
    assert not (b / "data/evolve/history.json").exists()  # the stage never got to write its results
    pickled_walls = [r.wall_s for r in ck.history]
    assert len(pickled_walls) == killed_at
    paid_before = _responses(b)
    subprocess.run(_cli(b, "evolve"), check=True, capture_output=True, timeout=900, env=env)
    calls_resumed = json.loads((b / "reports/metrics/evolve.json").read_text())["calls_made"]
    hb = _history(b)
    assert len(hb) == G
    # it carried on from the checkpoint (the generations played before the kill, with their timings), not from 0
    assert [h["wall_s"] for h in hb[:killed_at]] == pickled_walls
    assert _outcomes(hb) == _outcomes(ha[:G])
    # nothing paid twice: the resumed run paid only for what the killed one had not stored
    assert paid_before >= sum(h["calls_made"] for h in ha[:killed_at]) > 0  # the killed run's generations were kept
    assert paid_before + calls_resumed == calls_a_first_g == _responses(b)

    _set_generations(b, G + 2)  # more generations: the finished run carries on, it does not start over
    subprocess.run(_cli(b, "evolve"), check=True, capture_output=True, timeout=900, env=env)
    hb = _history(b)
    assert [h["generation"] for h in hb] == list(range(G + 2))
    assert _outcomes(hb) == _outcomes(ha)
    np.testing.assert_array_equal(np.load(a / "data/checkpoints/coordinator.npy"),
                                  np.load(b / "data/checkpoints/coordinator.npy"))
    assert _responses(b) == _responses(a) == calls_a
    print(f"killed {into:.0%} into generation {k} (checkpoint at {killed_at} of {G}); paid before kill {paid_before}, "
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
