"""Hidden-state store: write + read 100k x 1024 float32 vectors (goal <= 3 s).
Compared with numpy save/load of the same array (same run): the raw-IO floor."""
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from trinity.store import Store


def main():
    n, d = 100_000, 1024
    vecs = np.random.default_rng(0).standard_normal((n, d), dtype=np.float32)
    keys = [f"{i:064x}" for i in range(n)]
    store_s, numpy_s = [], []
    for rep in range(3):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            with Store(Path(tmp) / "s.duckdb") as s:
                s.put_states("enc", keys, vecs)
                got = s.get_states("enc", keys)
            store_s.append(time.perf_counter() - t0)
            assert len(got) == n and np.array_equal(got[keys[123]], vecs[123])
            t0 = time.perf_counter()
            np.save(Path(tmp) / "a.npy", vecs)
            back = np.load(Path(tmp) / "a.npy")
            numpy_s.append(time.perf_counter() - t0)
            assert back.shape == vecs.shape
    print(json.dumps({"name": "state_store", "figure": round(statistics.median(store_s), 3), "unit": "s",
                      "goal": "<= 3", "compared_to": "np.save + np.load of the same array (same run)",
                      "detail": {"store_write_read_s": [round(x, 3) for x in store_s],
                                 "numpy_save_load_s": [round(x, 3) for x in numpy_s], "vectors": n, "dim": d}}))


if __name__ == "__main__":
    sys.exit(main())
