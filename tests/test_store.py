import multiprocessing as mp
import os
import signal

import numpy as np
import pytest

from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.store import Store, response_key


def test_response_roundtrip_and_reopen(tmp_path):
    msgs = [ChatMessage("user", "hi")]
    sp = SamplingParams(max_tokens=8)
    k = response_key("m", msgs, sp)
    assert k != response_key("m", msgs, SamplingParams(max_tokens=9))
    assert k != response_key("m2", msgs, sp)
    with Store(tmp_path / "s.duckdb") as s:
        s.put_response(k, "m", "worker", msgs, sp, ChatResponse(text="hello", prompt_tokens=3, completion_tokens=1))
        s.put_response("k2", "m", "worker", msgs, sp, ChatResponse(text="", ok=False, error="timeout"))
    with Store(tmp_path / "s.duckdb") as s:
        assert s.get_response(k).text == "hello"
        assert s.get_response("k2").ok is False and s.get_response("k2").error == "timeout"
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
        paths = s.export_parquet(tmp_path / "out")
    assert pq.read_table(paths["states"]).num_rows == 1
    assert pq.read_table(paths["episodes"]).num_rows == 1
    assert pq.read_table(paths["responses"]).num_rows == 0


def _writer(path, ready):
    s = Store(path)
    v = np.ones((20000, 64), np.float32)
    ready.set()
    while True:  # killed mid-write
        s.put_states("enc", [f"k{i}-{os.getpid()}-{np.random.default_rng().integers(1e9)}" for i in range(20000)], v)


def test_crash_mid_write_leaves_no_half_rows(tmp_path):
    path = tmp_path / "s.duckdb"
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_writer, args=(str(path), ready))
    p.start()
    assert ready.wait(60)
    import time
    time.sleep(1.5)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    with Store(path) as s:
        n = s.state_count("enc")
        assert n % 20000 == 0  # whole batches only
        assert s.con.execute("SELECT count(*) FROM states WHERE dim <> 64").fetchone()[0] == 0
        segs = [r[0] for r in s.con.execute("SELECT DISTINCT segment FROM states").fetchall()]
        assert all((s.segments_dir / seg).exists() for seg in segs)  # no row without its vectors
        keys = [r[0] for r in s.con.execute("SELECT key FROM states LIMIT 5").fetchall()]
        assert all(v.shape == (64,) for v in s.get_states("enc", keys).values())


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
