"""Shipping a store: content-addressed segments (export/import), and a replay that pays for nothing."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trinity.config import PoolMember
from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.store import REPLAY_ENV, ReplayMiss, Store, response_key
from trinity.store_segments import (SegmentError, describe, encoder_dtypes, export_segments, import_segments,
                                    segment_files)

ENC = "smollm2@sha256:x/gguf/fp32/h30of30-penultimate-max2048-c128"
SP = SamplingParams(max_tokens=8)


def ask(q: str) -> list[ChatMessage]:
    return [ChatMessage("user", q)]


def fill(store: Store, n: int, start: int = 0) -> dict[str, str]:
    texts = {}
    for i in range(start, start + n):
        k = response_key("m", ask(f"q{i}"), SP)
        store.put_response(k, "m", "worker", ask(f"q{i}"), SP,
                           ChatResponse(text=f"answer {i}", prompt_tokens=3, completion_tokens=2, latency_s=1.5 + i))
        texts[k] = f"answer {i}"
    return texts


def test_export_then_import_gives_every_sample_and_state_and_nothing_else(tmp_path):
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((5, 16)).astype(np.float32)
    with Store(tmp_path / "a.duckdb") as a:
        texts = fill(a, 4)
        a.put_response("det", "m", "worker", ask("long"), SP,
                       ChatResponse(text="", ok=False, error="http 400: too long", failure="deterministic"))
        a.put_response("outage", "m", "worker", ask("x"), SP,
                       ChatResponse(text="", ok=False, error="http 503", failure="transient"))
        a.put_states(ENC, [f"t{i}" for i in range(5)], vecs)
        counts = export_segments(a, tmp_path / "seg")
    assert (counts.responses, counts.states) == (5, 5)  # the outage is not a sample: it does not travel
    assert encoder_dtypes(tmp_path / "seg") == {"float32"}
    with Store(tmp_path / "b.duckdb") as b:
        got = import_segments(b, tmp_path / "seg")
        assert (got.responses, got.states) == (5, 5)
        for k, t in texts.items():
            r = b.get_response(k)
            assert r.text == t and r.ok and r.prompt_tokens == 3 and r.latency_s > 1.0
        assert b.get_response("det").failure == "deterministic" and b.get_response("outage") is None
        states = b.get_states(ENC, [f"t{i}" for i in range(5)])
        np.testing.assert_array_equal(np.stack([states[f"t{i}"] for i in range(5)]), vecs)
        again = import_segments(b, tmp_path / "seg")  # idempotent
        assert (again.responses, again.states) == (0, 0)


def test_segments_are_content_addressed_and_deduplicated_by_key(tmp_path):
    with Store(tmp_path / "a.duckdb") as a:
        fill(a, 3)
        first = export_segments(a, tmp_path / "seg")
        assert export_segments(a, tmp_path / "seg").files == ()  # nothing new: no segment
        fill(a, 2, start=3)
        second = export_segments(a, tmp_path / "seg")
        assert second.responses == 2 and len(second.files) == 1
        export_segments(a, tmp_path / "other")  # the same rows, exported elsewhere from scratch
    names = [p.name for p in segment_files(tmp_path / "seg", "responses")]
    assert len(names) == 2 and first.files[0] in names
    for p in segment_files(tmp_path / "seg", "responses"):
        import hashlib

        assert p.name == f"responses-{hashlib.sha256(p.read_bytes()).hexdigest()[:24]}.parquet"
    assert describe(tmp_path / "seg")["kinds"]["responses"]["rows"] == 5
    assert describe(tmp_path / "other")["kinds"]["responses"]["rows"] == 5


def test_import_names_what_is_wrong(tmp_path):
    with Store(tmp_path / "b.duckdb") as b:
        with pytest.raises(SegmentError, match="no such segment directory"):
            import_segments(b, tmp_path / "nowhere")
        (tmp_path / "empty").mkdir()
        with pytest.raises(SegmentError, match="no segments"):
            import_segments(b, tmp_path / "empty")
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "responses-0.parquet").write_text("not parquet")
        with pytest.raises(SegmentError, match="responses-0.parquet"):
            import_segments(b, tmp_path / "bad")


def test_cli_store_export_and_import(tmp_path):
    with Store(tmp_path / "a.duckdb") as a:
        fill(a, 3)
        a.put_states(ENC, ["t"], np.ones((1, 4), np.float32))
    cli = [sys.executable, "-m", "trinity.cli", "store"]
    out = subprocess.run([*cli, "export", str(tmp_path / "seg"), "--store", str(tmp_path / "a.duckdb")],
                         capture_output=True, text=True, check=True).stdout
    assert "3 responses, 1 states" in out
    out = subprocess.run([*cli, "import", str(tmp_path / "seg"), "--store", str(tmp_path / "b.duckdb")],
                         capture_output=True, text=True, check=True).stdout
    assert "imported 3 responses, 1 states" in out
    r = subprocess.run([*cli, "import", str(tmp_path / "nowhere"), "--store", str(tmp_path / "b.duckdb")],
                       capture_output=True, text=True)
    assert r.returncode == 4 and "no such segment directory" in r.stderr
    dtype = subprocess.run([sys.executable, "-m", "trinity.store_segments", "dtype", str(tmp_path / "seg")],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert dtype == "float32"


def test_a_replay_serves_the_store_and_refuses_to_call(tmp_path, monkeypatch):
    """TRINITY_REPLAY=1: stored answers are served; a request the store lacks raises ReplayMiss before any call."""
    from trinity.pool.runtime import Pool

    class Counting:
        name, model_id = "m", "m"

        def __init__(self):
            self.calls = 0

        async def chat(self, messages, sampling):
            self.calls += 1
            return ChatResponse(text="fresh", ok=True)

    with Store(tmp_path / "a.duckdb") as st:
        member = Counting()
        pool = Pool([member], [PoolMember(name="m", backend="local", model="x", max_tokens=8)], st)
        asyncio.run(pool.complete_many([pool.request(0, ask("stored"), label="worker")]))
        assert member.calls == 1
        monkeypatch.setenv(REPLAY_ENV, "1")
        assert asyncio.run(pool.complete(0, ask("stored"), label="worker")).text == "fresh"
        with pytest.raises(ReplayMiss, match="1 request"):
            asyncio.run(pool.complete(0, ask("never asked"), label="worker"))
        assert member.calls == 1 and pool.stats.calls_made == 1


def test_a_replay_refuses_to_encode(tmp_path, monkeypatch):
    from trinity.coordinator.episode import StateCache

    class Encoder:
        encoder_id, dim = ENC, 4

        def encode(self, texts):
            return np.ones((len(texts), 4), np.float32)

    with Store(tmp_path / "a.duckdb") as st:
        cache = StateCache(Encoder(), st)
        cache.states(["seen"])
        monkeypatch.setenv(REPLAY_ENV, "1")
        assert cache.states(["seen"]).shape == (1, 4)
        with pytest.raises(ReplayMiss, match="TRINITY_ENCODER_AUTO_DTYPE"):
            cache.states(["unseen"])


def test_auto_dtype_follows_the_replays_choice(monkeypatch):
    import torch

    from trinity.coordinator.encoder_loading import AUTO_DTYPE_ENV, resolve_dtype

    monkeypatch.setenv(AUTO_DTYPE_ENV, "bfloat16")
    assert resolve_dtype("auto") is torch.bfloat16 and resolve_dtype("float32") is torch.float32
    monkeypatch.setenv(AUTO_DTYPE_ENV, "float32")
    assert resolve_dtype("auto") is torch.float32
    monkeypatch.setenv(AUTO_DTYPE_ENV, "fp16")
    with pytest.raises(ValueError, match=AUTO_DTYPE_ENV):
        resolve_dtype("auto")


def test_check_replay_ignores_only_the_runs_own_counters():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from check_replay import _strip_json, _strip_markdown

    a = {"saved_fitness": 0.4, "calls_made": 348, "wall_s": 87.0, "x": {"store_hits": 3, "score": 1.0}}
    b = {"saved_fitness": 0.4, "calls_made": 0, "wall_s": 12.0, "x": {"store_hits": 701, "score": 1.0}}
    assert _strip_json(a) == _strip_json(b)
    assert _strip_json(a) != _strip_json({**b, "saved_fitness": 0.5})
    table = ("| method | tokens / task | new LLM calls | failed calls |\n|---|---|---|---|\n| trinity | 1349 | {} | 0 |\n"
             "This evaluation made {} new pool calls (34 store hits) in 23.4 min.")
    assert _strip_markdown(table.format(18, 151)) == _strip_markdown(table.format(0, 0))
    assert _strip_markdown(table.format(18, 151)) != _strip_markdown(table.format(18, 151).replace("1349", "1350"))
    assert json.dumps(_strip_json(a))  # plain data
