"""The store's writer lock (trinity.ops.checkout_lock.StoreLock), which `trinity serve` and weekly-retrain both hold:
one holder at a time, across processes; the second is refused at once, naming the first (what, pid, since); the
lock is free the moment its holder dies, however it dies (SIGKILL here). With a real Prefect server, against
`trinity serve` and a weekly-retrain run: tests/integration/test_deployments.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trinity.ops.checkout_lock import StoreBusy, StoreLock, holding_store, store_lock_path

HOLDER = """
import sys, time
sys.path.insert(0, {src!r})
from trinity.ops.checkout_lock import StoreLock
lock = StoreLock({store!r}, "trinity serve on 127.0.0.1:8000")
print("held", flush=True)
time.sleep(600)
"""


def test_one_writer_at_a_time_and_a_dead_holder_frees_the_store_at_once(tmp_path):
    store = tmp_path / "store" / "trinity.duckdb"
    import trinity

    src = str(Path(trinity.__file__).resolve().parents[1])
    holder = subprocess.Popen([sys.executable, "-c", HOLDER.format(src=src, store=str(store))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        record = json.loads(store_lock_path(store).read_text())
        assert record["pid"] == holder.pid and record["holder"] == "trinity serve on 127.0.0.1:8000"
        with pytest.raises(StoreBusy, match=rf"the store {store} is being written by trinity serve on "
                                            rf"127\.0\.0\.1:8000 \(pid {holder.pid} on .*, since 20\d\d-.*\) \(its "
                                            rf"writer lock {store}\.writer\.lock is taken\)"):
            StoreLock(store, "weekly-retrain run calm-heron")
        os.kill(holder.pid, signal.SIGKILL)  # no cleanup of its own: the kernel drops the lock with the process
        holder.wait(30)
        with holding_store(store, "weekly-retrain run calm-heron") as lock:
            assert json.loads(lock.path.read_text())["pid"] == os.getpid()
            with pytest.raises(StoreBusy, match=r"weekly-retrain run calm-heron \(pid"):
                StoreLock(store, "trinity serve on 127.0.0.1:8001")  # the same process, a second writer: refused too
        assert store_lock_path(store).read_text() == ""  # released: the record is cleared, the file stays
        StoreLock(store, "again").release()
    finally:
        holder.kill()
        holder.wait()
