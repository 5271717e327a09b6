"""The memo store: every LLM response, hidden state and episode, keyed by content hash.

One DuckDB file (one writer process at a time: DuckDB's rule) with three tables:
- responses: key = hash(model id, messages, sampling, what else shapes the reply) → text, ok/error, tokens,
             cost. A hit makes no call. Only *samples* are served: successful replies and deterministic failures
             (the request itself is refused: it would fail the same way again). An outage (429, 5xx, timeout,
             dropped connection) is not a sample: it goes to `failures` only and the next run asks again.
             `Store(retry_failures=True)` (env TRINITY_RETRY_FAILURES=1) serves no stored failure at all.
- failures:  every failed call, append-only (key, model, kind, error, tokens, cost, time): outages counted
             and priced, never served.
- states:    (encoder id, transcript hash) → float32 vector. The vectors live in append-only .npy segment
             files beside the database (`<store>.states/`), one per write batch, and the table indexes them:
             bulk writes and reads run at disk speed instead of paying DuckDB's WAL + checkpoint on 4 KB blobs.
             A segment is written (atomic rename) before its index rows commit, so a crash leaves at most an
             unreferenced file, never a row without its vector.
- episodes:  (run, generation, candidate, task) → path, reward, cost.
Each write is one transaction, so a crash mid-write leaves no half rows. `store_segments.export_parquet` writes each
table to Parquet for DVC and for scans with DuckDB/pyarrow.

Readers (the report stage, `trinity ask`) open the store with `read_only=True` (or `Store.open_or_read`),
which works while another process writes it: DuckDB lets one writer *or* readers hold the file, so a reader
that finds a writer reads a snapshot. A read-only store keeps what the process adds (new responses, states)
in memory only and counts it in `unsaved_writes`: nothing is lost from the file, nothing is written to it.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from trinity.env import env_flag
from trinity.files import atomic_open
from trinity.records import ChatMessage, ChatResponse, SamplingParams, stable_hash

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key VARCHAR PRIMARY KEY,
    model_id VARCHAR NOT NULL,
    role VARCHAR,
    messages VARCHAR NOT NULL,
    sampling VARCHAR NOT NULL,
    text VARCHAR NOT NULL,
    ok BOOLEAN NOT NULL,
    error VARCHAR,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cost_usd DOUBLE,
    latency_s DOUBLE,
    created_at TIMESTAMP DEFAULT current_timestamp
);
ALTER TABLE responses ADD COLUMN IF NOT EXISTS failure VARCHAR;
CREATE TABLE IF NOT EXISTS failures (
    key VARCHAR NOT NULL,
    model_id VARCHAR NOT NULL,
    role VARCHAR,
    failure VARCHAR NOT NULL,
    error VARCHAR,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    cost_usd DOUBLE,
    latency_s DOUBLE,
    created_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS states (
    encoder_id VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    dim INTEGER NOT NULL,
    segment VARCHAR NOT NULL,
    row INTEGER NOT NULL,
    PRIMARY KEY (encoder_id, key)
);
CREATE TABLE IF NOT EXISTS episodes (
    run_id VARCHAR NOT NULL,
    generation INTEGER NOT NULL,
    candidate INTEGER NOT NULL,
    task_id VARCHAR NOT NULL,
    path VARCHAR NOT NULL,
    reward DOUBLE NOT NULL,
    correct DOUBLE NOT NULL,
    cost_usd DOUBLE NOT NULL,
    PRIMARY KEY (run_id, generation, candidate, task_id)
);
"""


def response_key(model_id: str, messages: Sequence[ChatMessage], sampling: SamplingParams,
                 identity: dict | None = None) -> str:
    """The response-store key: what was asked of which model with which sampling settings, and `identity`:
    whatever else shapes the reply (a local member's file hash, rendered prompt, context size: see
    `LocalChatModel.request_identity`)."""
    key = {"model": model_id, "messages": [[m.role, m.content] for m in messages], "sampling": sampling}
    if identity:
        key["identity"] = identity
    return stable_hash(key)


def retry_failures_from_env() -> bool:
    """TRINITY_RETRY_FAILURES=1: serve no stored failure (deterministic ones are asked again too)."""
    return env_flag("TRINITY_RETRY_FAILURES")


REPLAY_ENV = "TRINITY_REPLAY"
"""Set to 1 for a replay (`make replay`): every answer and every hidden state must come from the store. A request
it lacks is an error (`ReplayMiss`, raised by the pool) instead of an LLM call, and so is a transcript whose state
it lacks (raised by the state cache) instead of an encode: a replay that would pay or recompute anything says so
at once, naming what is missing, rather than silently becoming a new measurement."""


class ReplayMiss(RuntimeError):
    """A replay (TRINITY_REPLAY=1) needed something the store does not hold: the shipped segments do not cover the
    run being replayed (or the code or settings changed what it asks)."""


def replay_only() -> bool:
    """Whether this process replays (TRINITY_REPLAY=1): no LLM call, no encode."""
    return env_flag(REPLAY_ENV)


def text_key(text: str) -> str:
    return stable_hash(text)


class Store:
    """DuckDB-backed memo of responses, hidden states and episodes (see module doc)."""

    def __init__(self, path: str | Path, read_only: bool = False, retry_failures: bool | None = None):
        self.path = Path(path)
        self.read_only = read_only
        self.retry_failures = retry_failures_from_env() if retry_failures is None else retry_failures
        self._snapshot_dir: str | None = None
        if read_only:
            self.con = self._connect_reader()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.con = duckdb.connect(str(self.path))
            except duckdb.IOException as e:
                raise RuntimeError(
                    f"cannot open store {self.path}: {e}. DuckDB allows one writer process per file; "
                    "stop the other process or give this one its own store file") from None
            self.con.execute(_SCHEMA)
        self._lock = threading.Lock()
        self._responses: dict[str, ChatResponse] = {}
        self._segments: dict[str, np.ndarray] = {}
        self._mem_states: dict[tuple[str, str], np.ndarray] = {}  # read-only stores: states added in memory
        self.unsaved_writes = 0
        """Rows a read-only store kept in memory instead of writing them."""
        self._load_responses()

    @classmethod
    def open_or_read(cls, path: str | Path) -> "Store":
        """The store as a writer if no other process writes it, else read-only (a snapshot; additions stay
        in memory). For occasional users such as `trinity ask` that must work while a pipeline runs."""
        try:
            return cls(path)
        except RuntimeError:
            print(f"[store] {path} is open for writing by another process: reading it, new results of this "
                  "run are not saved", file=sys.stderr, flush=True)
            return cls(path, read_only=True)

    # ---------------------------------------------------------------- responses
    def _connect_reader(self):
        """A read-only connection, also while another process writes the store: DuckDB gives the file to one
        writer *or* to readers, so when a writer holds it, read a snapshot (the database file and its WAL
        copied to a temp dir, retried until the copy opens: a copy taken mid-checkpoint may not). The
        state vectors are read from the original segment files, which are immutable once indexed."""
        if not self.path.exists():
            raise FileNotFoundError(f"store {self.path} does not exist: run the stages that fill it first")
        try:
            return duckdb.connect(str(self.path), read_only=True)
        except duckdb.IOException as e:
            if "lock" not in str(e).lower():
                raise RuntimeError(f"cannot open store {self.path} read-only: {e}") from None
            held_by = str(e)
        last: Exception | None = None
        for _ in range(20):
            snap = tempfile.mkdtemp(prefix="trinity-store-snapshot-")
            dest = Path(snap) / self.path.name
            try:
                shutil.copyfile(self.path, dest)
                wal = self.path.with_name(self.path.name + ".wal")
                if wal.exists():
                    shutil.copyfile(wal, dest.with_name(dest.name + ".wal"))
                con = duckdb.connect(str(dest))  # replays the copied WAL into the copy
                con.execute("CHECKPOINT")
                con.close()
                con = duckdb.connect(str(dest), read_only=True)
                con.execute("SELECT count(*) FROM responses").fetchone()
            except (duckdb.Error, OSError) as e:
                last = e
                shutil.rmtree(snap, ignore_errors=True)
                time.sleep(0.25)
                continue
            self._snapshot_dir = snap
            print(f"[store] {self.path} is being written by another process ({held_by.splitlines()[0][:160]}); "
                  f"reading a snapshot of it", file=sys.stderr, flush=True)
            return con
        raise RuntimeError(f"cannot read store {self.path} while another process writes it: {last}")

    def reload_responses(self) -> None:
        """Serve what the file holds now (after rows were added to it directly, e.g. `store_segments.import_segments`)."""
        self._responses.clear()
        self._load_responses()

    def _load_responses(self) -> None:
        cols = {r[0] for r in self.con.execute("DESCRIBE responses").fetchall()}
        failure = "failure" if "failure" in cols else "NULL"  # a store written before failure kinds existed
        rows = self.con.execute(
            "SELECT key, text, ok, error, prompt_tokens, completion_tokens, cost_usd, latency_s, model_id, "
            f"{failure} FROM responses").fetchall()
        for k, text, ok, err, pt, ct, cost, lat, mid, kind in rows:
            resp = ChatResponse(text=text, ok=ok, error=err, prompt_tokens=pt or 0, completion_tokens=ct or 0,
                                cost_usd=cost or 0.0, latency_s=lat or 0.0, model=mid,
                                failure=None if ok else (kind or "transient"))
            if self._serves(resp):
                self._responses[k] = resp

    def _serves(self, resp: ChatResponse) -> bool:
        """Whether a stored row is served for its request: a sample (ok, or a deterministic failure), and no
        failure at all under retry_failures. An old row of unknown failure kind counts as an outage."""
        return resp.ok or (resp.is_sample and not self.retry_failures)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """One write transaction (the caller holds `_lock`). When the COMMIT itself fails (a full disk: "No space
        left on device"), DuckDB has already ended the transaction and a ROLLBACK would raise "no transaction is
        active", hiding the real error: the error raised is always the first one, with the rollback's failure
        noted on it. Nothing of the failed transaction is kept."""
        self.con.execute("BEGIN")
        try:
            yield
            self.con.execute("COMMIT")
        except BaseException as first:
            try:
                self.con.execute("ROLLBACK")
            except duckdb.Error as rollback_error:
                first.add_note(f"[store] {self.path}: the write was not kept (rollback: {rollback_error})")
            raise

    def get_response(self, key: str) -> ChatResponse | None:
        return self._responses.get(key)

    def put_response(self, key: str, model_id: str, role: str | None, messages: Sequence[ChatMessage],
                     sampling: SamplingParams, resp: ChatResponse) -> None:
        """Record one real call. A sample (see module doc) becomes the stored answer to `key`; every failure,
        outage or not, is appended to `failures` (counted and priced, never served)."""
        if self.read_only:
            self.unsaved_writes += 1
            if self._serves(resp):
                self._responses[key] = resp
            return
        with self._lock:
            with self._transaction():
                if resp.is_sample:
                    self.con.execute(
                        "INSERT OR REPLACE INTO responses (key, model_id, role, messages, sampling, text, ok, error, "
                        "prompt_tokens, completion_tokens, cost_usd, latency_s, failure) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                        [key, model_id, role, json.dumps([[m.role, m.content] for m in messages]),
                         json.dumps(sampling.__dict__), resp.text, resp.ok, resp.error, resp.prompt_tokens,
                         resp.completion_tokens, resp.cost_usd, resp.latency_s, resp.failure])
                if not resp.ok:
                    self.con.execute(
                        "INSERT INTO failures (key, model_id, role, failure, error, prompt_tokens, completion_tokens, "
                        "cost_usd, latency_s) VALUES (?,?,?,?,?,?,?,?,?)",
                        [key, model_id, role, resp.failure, resp.error, resp.prompt_tokens, resp.completion_tokens,
                         resp.cost_usd, resp.latency_s])
            if self._serves(resp):
                self._responses[key] = resp
            else:
                self._responses.pop(key, None)

    def response_count(self) -> int:
        return len(self._responses)

    def failure_counts(self) -> dict[str, int]:
        """Failed calls recorded so far, by kind ({"transient": n, "deterministic": m})."""
        return dict(self.con.execute("SELECT failure, count(*) FROM failures GROUP BY failure").fetchall())

    # ---------------------------------------------------------------- states
    @property
    def segments_dir(self) -> Path:
        return self.path.with_name(self.path.name + ".states")

    def _segment(self, name: str) -> np.ndarray:
        seg = self._segments.get(name)
        if seg is None:
            seg = np.load(self.segments_dir / name, mmap_mode="r")
            self._segments[name] = seg
        return seg

    def get_states(self, encoder_id: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        if not keys:
            return {}
        if self._mem_states:
            mem = {k: v for k in keys if (v := self._mem_states.get((encoder_id, k))) is not None}
            rest = [k for k in keys if k not in mem]
            return {**self._get_stored_states(encoder_id, rest), **mem} if rest else mem
        return self._get_stored_states(encoder_id, keys)

    def _get_stored_states(self, encoder_id: str, keys: Sequence[str]) -> dict[str, np.ndarray]:
        if not keys:
            return {}
        want = pa.table({"key": pa.array(list(dict.fromkeys(keys)), pa.string())})
        with self._lock:
            self.con.register("_want_keys", want)
            try:
                tbl = self.con.sql(
                    "SELECT s.key, s.segment, s.row FROM states s JOIN _want_keys w ON s.key = w.key "
                    "WHERE s.encoder_id = ? ORDER BY s.segment, s.row", params=[encoder_id]).to_arrow_table()
            finally:
                self.con.unregister("_want_keys")
        out: dict[str, np.ndarray] = {}
        if tbl.num_rows == 0:
            return out
        k_all = tbl.column("key").to_pylist()
        seg_all = tbl.column("segment").to_numpy(zero_copy_only=False)
        row_all = tbl.column("row").to_numpy()
        bounds = np.flatnonzero(seg_all[1:] != seg_all[:-1]) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(seg_all)]):
            block = np.asarray(self._segment(seg_all[lo])[row_all[lo:hi]], dtype=np.float32)
            for j, k in enumerate(k_all[lo:hi]):
                out[k] = block[j]
        return out

    def put_states(self, encoder_id: str, keys: Sequence[str], vectors: np.ndarray) -> None:
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or len(keys) != vectors.shape[0]:
            raise ValueError(f"put_states: {len(keys)} keys for an array of shape {vectors.shape}")
        if not len(keys):
            return
        if self.read_only:
            self.unsaved_writes += len(keys)
            self._mem_states.update({(encoder_id, k): v for k, v in zip(keys, vectors)})
            return
        name = f"{uuid.uuid4().hex}.npy"
        with atomic_open(self.segments_dir / name, "wb") as f:
            np.save(f, vectors)
        tbl = pa.table({
            "encoder_id": pa.array([encoder_id] * len(keys), pa.string()),
            "key": pa.array(list(keys), pa.string()),
            "dim": pa.array(np.full(len(keys), vectors.shape[1], dtype=np.int32)),
            "segment": pa.array([name] * len(keys), pa.string()),
            "row": pa.array(np.arange(len(keys), dtype=np.int32)),
        })
        with self._lock:
            self.con.register("_new_states", tbl)
            try:
                with self._transaction():
                    self.con.execute("INSERT OR REPLACE INTO states SELECT encoder_id, key, dim, segment, row "
                                     "FROM _new_states")
            except BaseException:
                (self.segments_dir / name).unlink(missing_ok=True)  # no row points at it: leave nothing partial
                raise
            finally:
                self.con.unregister("_new_states")

    def state_count(self, encoder_id: str | None = None) -> int:
        if encoder_id is None:
            return self.con.execute("SELECT count(*) FROM states").fetchone()[0]
        return self.con.execute("SELECT count(*) FROM states WHERE encoder_id = ?", [encoder_id]).fetchone()[0]

    # ---------------------------------------------------------------- episodes
    def put_episodes(self, rows: Iterable[dict[str, Any]]) -> None:
        """One transaction for a whole generation's rows, inserted from an Arrow table (executemany costs
        ~10 ms per row in DuckDB; a generation writes popsize x tasks rows). `path`: a list, or its JSON."""
        rows = list(rows)
        if not rows:
            return
        if self.read_only:
            self.unsaved_writes += len(rows)
            return
        tbl = pa.table({
            "run_id": pa.array([r["run_id"] for r in rows], pa.string()),
            "generation": pa.array([r["generation"] for r in rows], pa.int32()),
            "candidate": pa.array([r["candidate"] for r in rows], pa.int32()),
            "task_id": pa.array([r["task_id"] for r in rows], pa.string()),
            "path": pa.array([p if isinstance(p := r["path"], str) else json.dumps(p) for r in rows], pa.string()),
            "reward": pa.array([float(r["reward"]) for r in rows], pa.float64()),
            "correct": pa.array([float(r["correct"]) for r in rows], pa.float64()),
            "cost_usd": pa.array([float(r["cost_usd"]) for r in rows], pa.float64()),
        })
        with self._lock:
            self.con.register("_new_episodes", tbl)
            try:
                with self._transaction():
                    self.con.execute("INSERT OR REPLACE INTO episodes SELECT run_id, generation, candidate, task_id, "
                                     "path, reward, correct, cost_usd FROM _new_episodes")
            finally:
                self.con.unregister("_new_episodes")

    def close(self) -> None:
        self.con.close()
        if self._snapshot_dir is not None:
            shutil.rmtree(self._snapshot_dir, ignore_errors=True)
            self._snapshot_dir = None

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
