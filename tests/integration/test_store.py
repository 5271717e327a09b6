import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.store import Store, response_key
from trinity.store_segments import export_parquet


def test_response_roundtrip_and_reopen(tmp_path):
    msgs = [ChatMessage("user", "hi")]
    sp = SamplingParams(max_tokens=8)
    k = response_key("m", msgs, sp)
    assert k != response_key("m", msgs, SamplingParams(max_tokens=9))
    assert k != response_key("m2", msgs, sp)
    with Store(tmp_path / "s.duckdb") as s:
        s.put_response(k, "m", "worker", msgs, sp, ChatResponse(text="hello", prompt_tokens=3, completion_tokens=1))
        s.put_response("k2", "m", "worker", msgs, sp,
                       ChatResponse(text="", ok=False, error="http 400: too long", failure="deterministic"))
    with Store(tmp_path / "s.duckdb") as s:
        assert s.get_response(k).text == "hello"
        assert s.get_response("k2").ok is False and s.get_response("k2").error == "http 400: too long"
        assert s.get_response("k2").failure == "deterministic"
        assert s.response_count() == 2


def test_states_roundtrip(tmp_path):
    rng = np.random.default_rng(0)
    v = rng.standard_normal((50, 16)).astype(np.float32)
    keys = [f"k{i}" for i in range(50)]
    with Store(tmp_path / "s.duckdb") as s:
        s.put_states("enc", keys, v)
        got = s.get_states("enc", keys[::-1] + ["missing"])
        assert set(got) == set(keys)
        np.testing.assert_array_equal(got["k7"], v[7])
        assert s.get_states("other-encoder", keys) == {}
        with pytest.raises(ValueError):
            s.put_states("enc", keys[:3], v)


def test_parquet_export(tmp_path):
    import pyarrow.parquet as pq

    with Store(tmp_path / "s.duckdb") as s:
        s.put_states("enc", ["a"], np.ones((1, 4), np.float32))
        s.put_episodes([{"run_id": "r", "generation": 0, "candidate": 1, "task_id": "t", "path": [["0", "worker"]],
                         "reward": 1.0, "correct": 1.0, "cost_usd": 0.0}])
        paths = export_parquet(s, tmp_path / "out")
    assert pq.read_table(paths["states"]).num_rows == 1
    assert pq.read_table(paths["episodes"]).num_rows == 1
    assert pq.read_table(paths["responses"]).num_rows == 0


B, DIM = 2000, 16  # rows per state batch, vector width


def _vectors(batch):
    """Batch `batch`'s vectors: row j is batch*B + j + (0, 1/32, ..., 15/32): every value identifies its row."""
    return ((batch * B + np.arange(B, dtype=np.float64))[:, None] + np.arange(DIM) / 32).astype(np.float32)


def _keys(batch):
    return [f"b{batch}-{j}" for j in range(B)]


def _episode_rows(run_id, gen, n=7):
    return [{"run_id": run_id, "generation": gen, "candidate": c, "task_id": f"t{c}", "path": [[str(c), "worker"]],
             "reward": gen + c / 8, "correct": float(c % 2), "cost_usd": 0.0} for c in range(n)]


class _HangWhenAllRowsIn:
    """A DuckDB connection that, once every row of the crash batch has been INSERTed (whatever transactions the
    store uses) and before the store's write returns, sets `inside` and blocks: the parent kills the process
    there — the latest possible moment of the write, when a store that commits as it goes has committed rows."""

    def __init__(self, con, inside):
        self._con, self._inside, self.check = con, inside, None  # check: SQL counting the crash batch's rows, and n

    def execute(self, sql, *args, **kwargs):
        out = self._con.execute(sql, *args, **kwargs)
        if self.check is not None and sql.lstrip().upper().startswith("INSERT"):
            query, n = self.check
            if self._con.execute(query).fetchone()[0] >= n:
                self._inside.set()
                while True:  # killed here
                    time.sleep(1)
        return out

    def __getattr__(self, name):
        return getattr(self._con, name)


def _crashing_writer(path, first_batch, n_batches, crash_in, inside):
    """Commits state batches first_batch..first_batch+n_batches-1 and episode generations of run 'ok' alike, then
    starts one more write (`crash_in`: 'states' or 'episodes') and is killed inside it."""
    s = Store(path)
    s.con = _HangWhenAllRowsIn(s.con, inside)
    for b in range(first_batch, first_batch + n_batches):
        s.put_states("enc", _keys(b), _vectors(b))
        s.put_episodes(_episode_rows("ok", b))
    if crash_in == "states":
        s.con.check = ("SELECT count(*) FROM states WHERE key LIKE 'crash-%'", B)
        s.put_states("enc", [f"crash-{j}" for j in range(B)], _vectors(99))
    else:
        s.con.check = ("SELECT count(*) FROM episodes WHERE run_id = 'crash'", 7)
        s.put_episodes(_episode_rows("crash", 99))
    raise AssertionError("the crash write returned")


def _crash(path, first_batch, n_batches, crash_in):
    ctx = mp.get_context("spawn")
    inside = ctx.Event()
    p = ctx.Process(target=_crashing_writer, args=(str(path), first_batch, n_batches, crash_in, inside))
    p.start()
    try:
        assert inside.wait(120), f"the writer never got inside its {crash_in} write (exit code {p.exitcode})"
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.join()
    assert p.exitcode == -signal.SIGKILL  # it died of the kill, mid-write


def _check_store(path, n_batches):
    """Exactly the committed batches 0..n_batches-1, whole and with their exact values; nothing of a crashed write."""
    with Store(path) as s:
        assert s.state_count("enc") == s.state_count() == n_batches * B
        stored = {r[0] for r in s.con.execute("SELECT key FROM states").fetchall()}
        assert stored == {k for b in range(n_batches) for k in _keys(b)}  # no 'crash-*' key
        assert s.con.execute("SELECT count(*) FROM states WHERE dim <> ?", [DIM]).fetchone()[0] == 0
        segs = [r[0] for r in s.con.execute("SELECT DISTINCT segment FROM states").fetchall()]
        assert len(segs) == n_batches and all((s.segments_dir / seg).exists() for seg in segs)
        for b in range(n_batches):
            got = s.get_states("enc", _keys(b))
            np.testing.assert_array_equal(np.stack([got[k] for k in _keys(b)]), _vectors(b))
        eps = s.con.execute("SELECT run_id, generation, candidate, task_id, reward FROM episodes ORDER BY ALL").fetchall()
        assert eps == [("ok", r["generation"], r["candidate"], r["task_id"], r["reward"])
                       for b in range(n_batches) for r in _episode_rows("ok", b)]


def test_crash_mid_write_leaves_no_half_rows(tmp_path):
    path = tmp_path / "s.duckdb"
    # 3 batches committed, then killed with the 4th put_states' rows all inserted but not committed
    _crash(path, 0, 3, "states")
    _check_store(path, 3)
    # the same store again: 2 more batches, then killed inside a put_episodes
    _crash(path, 3, 2, "episodes")
    _check_store(path, 5)


def test_second_writer_gets_clear_error(tmp_path):
    path = tmp_path / "s.duckdb"
    s = Store(path)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_open_and_report, args=(str(path), q))
    p.start()
    p.join(60)
    s.close()
    msg = q.get(timeout=5)
    assert "one writer process" in msg


def _open_and_report(path, q):
    try:
        Store(path)
        q.put("opened")
    except RuntimeError as e:
        q.put(str(e))


_FULL_DISK_SCRIPT = r'''
import os, sys
import numpy as np
from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.store import Store

d = sys.argv[1]
msgs, sp = [ChatMessage("user", "hi")], SamplingParams(max_tokens=8)
s = Store(os.path.join(d, "s.duckdb"))
s.put_response("kept", "m", "worker", msgs, sp, ChatResponse(text="before the disk filled"))
filler = os.path.join(d, "filler")
with open(filler, "wb") as f:
    try:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    except OSError:
        pass
errors, failed = [], None
for i in range(50):   # the WAL grows until a write meets the full disk
    try:
        s.put_response(f"big{i}", "m", "worker", msgs, sp, ChatResponse(text="x" * 20000))
    except Exception as e:
        errors.append(f"{type(e).__name__}: {e}")
        failed = f"big{i}"
        break
try:
    s.put_states("enc", [f"s{i}" for i in range(64)], np.ones((64, 4096), np.float32))
except Exception as e:
    errors.append(f"{type(e).__name__}: {e}")
segments = sorted(os.listdir(s.segments_dir)) if s.segments_dir.exists() else []
os.remove(filler)
s.put_response("after", "m", "worker", msgs, sp, ChatResponse(text="space again"))
s.close()
with Store(os.path.join(d, "s.duckdb")) as again:
    print(repr({"errors": errors, "segments": segments, "states": again.state_count(), "failed": failed,
                "kept": [k for k in ("kept", "after", failed) if k and again.get_response(k)]}))
'''


def test_full_disk_surfaces_its_own_error_and_keeps_nothing_partial(tmp_path):
    """A full disk fails the COMMIT; the error the caller sees is "No space left on device" (not the ROLLBACK's
    "no transaction is active" that hid it), a state segment whose index rows could not commit is removed, and
    the store works again once space is freed, with what was committed before. A real tiny tmpfs, mounted in a
    private mount namespace."""
    import ast
    import shutil
    import subprocess
    import sys

    mnt = tmp_path / "mnt"
    mnt.mkdir()
    unshare = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    if shutil.which("unshare") is None or subprocess.run([*unshare, "true"], capture_output=True).returncode != 0:
        pytest.skip("needs a private mount namespace (unshare -m) to mount a tiny tmpfs")
    script = tmp_path / "full_disk.py"
    script.write_text(_FULL_DISK_SCRIPT)
    out = subprocess.run([*unshare, "sh", "-c", f'mount -t tmpfs -o size=3M tmpfs "{mnt}" && '
                          f'"{sys.executable}" "{script}" "{mnt}"'], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert len(result["errors"]) == 2, result
    assert all("No space left on device" in e for e in result["errors"]), result["errors"]
    assert not any("no transaction is active" in e for e in result["errors"]), result["errors"]
    assert result["segments"] == [], "a segment no committed row points at was left behind"
    assert result["failed"] is not None
    assert result["kept"] == ["kept", "after"], "the failed write must be absent, the others kept"
    assert result["states"] == 0
