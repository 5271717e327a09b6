"""The store as shippable segments: what a run paid for, carried with the repository or a DVC remote.

A store (`trinity.store`) is one machine's DuckDB file. A measurement that anyone should be able to check ships what
it paid for beside its report: the responses (pool members and the judge alike: the judge is a pool over the same
store) and what the policy read (the encoder's hidden states). `export_segments` writes them into a directory as
segments: zstd-compressed Parquet files named by the SHA-256 of their bytes (content-addressed: a segment never
changes, two exports of the same rows share it), each holding only rows the directory did not hold yet (deduplicated
by key: a second export after more work adds one segment of the new rows). `import_segments` loads every segment of
a directory into a store, skipping the rows it holds. `trinity store export/import` are the commands;
`make replay` imports the default run's segments (replay/default) and rebuilds reports/ with no LLM call.

Only samples travel: the responses a store serves (replies, and deterministic failures), never outages. States travel
with their encoder id, which names the encoder's dtype: a bf16 run's states are found on a CPU that resolves `auto`
to fp32 only if the replay asks for bf16 (`TRINITY_ENCODER_AUTO_DTYPE`, which `make replay` sets from the segments),
and then nothing is encoded: the policy reads exactly what it read on the machine that ran it.

A team shares segments the DVC way: the directory is a DVC-tracked output (`dvc add replay/mine`, `dvc push`), and a
colleague's `dvc pull` + `trinity store import` gives their store every response already paid for (docs/operations.md).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trinity.files import atomic_path
from trinity.store import Store

RESPONSES = "responses"
STATES = "states"
KINDS = (RESPONSES, STATES)
ZSTD_LEVEL = 19
"""Written once, read by every replay: the slowest zstd level is worth its seconds."""
ROW_GROUP = 2048

_RESPONSE_COLUMNS = ("key", "model_id", "role", "messages", "sampling", "text", "ok", "error", "prompt_tokens",
                     "completion_tokens", "cost_usd", "latency_s", "failure")
_RESPONSE_SCHEMA = pa.schema([
    ("key", pa.string()), ("model_id", pa.string()), ("role", pa.string()), ("messages", pa.string()),
    ("sampling", pa.string()), ("text", pa.string()), ("ok", pa.bool_()), ("error", pa.string()),
    ("prompt_tokens", pa.int32()), ("completion_tokens", pa.int32()), ("cost_usd", pa.float64()),
    ("latency_s", pa.float64()), ("failure", pa.string())])
_STATE_SCHEMA = pa.schema([("encoder_id", pa.string()), ("key", pa.string()), ("dim", pa.int32()),
                           ("state", pa.binary())])


class SegmentError(ValueError):
    """A segment directory or file that cannot be read as one (named in the message)."""


@dataclass(frozen=True)
class SegmentCounts:
    responses: int
    states: int
    files: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.responses} responses, {self.states} states"


def segment_files(directory: Path, kind: str) -> list[Path]:
    return sorted(Path(directory).glob(f"{kind}-*.parquet"))


def _keys_in(directory: Path) -> tuple[set[str], set[tuple[str, str]]]:
    """The response keys and (encoder id, transcript key) pairs the directory's segments hold."""
    responses: set[str] = set()
    states: set[tuple[str, str]] = set()
    for p in segment_files(directory, RESPONSES):
        responses.update(_read(p, ["key"]).column("key").to_pylist())
    for p in segment_files(directory, STATES):
        t = _read(p, ["encoder_id", "key"])
        states.update(zip(t.column("encoder_id").to_pylist(), t.column("key").to_pylist()))
    return responses, states


def _read(path: Path, columns: list[str] | None = None) -> pa.Table:
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowInvalid) as e:
        raise SegmentError(f"segment {path}: not a readable Parquet file ({e})") from None


def _write(directory: Path, kind: str, table: pa.Table) -> str:
    """Write one segment; its name is the SHA-256 of its bytes (the same rows in the same order: the same file)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{kind}.writing.parquet"
    pq.write_table(table, tmp, compression="zstd", compression_level=ZSTD_LEVEL, row_group_size=ROW_GROUP,
                   write_statistics=False, store_schema=False)
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()[:24]
    name = f"{kind}-{digest}.parquet"
    tmp.replace(directory / name)
    return name


def export_segments(store: Store, directory: str | Path) -> SegmentCounts:
    """Every sample and state of `store` that `directory`'s segments lack, as (at most) one new segment of each kind.
    Rows are sorted by key, so the same rows give the same segment."""
    directory = Path(directory)
    have_responses, have_states = _keys_in(directory)
    cols = {r[0] for r in store.con.execute("DESCRIBE responses").fetchall()}
    failure = "failure" if "failure" in cols else "NULL AS failure"
    rows = store.con.execute(
        f"SELECT {', '.join(c if c != 'failure' else failure for c in _RESPONSE_COLUMNS)} FROM responses "
        "ORDER BY key").fetchall()
    new = [r for r in rows if r[0] not in have_responses and store.get_response(r[0]) is not None]
    files = []
    if new:
        table = pa.table({c: [r[i] for r in new] for i, c in enumerate(_RESPONSE_COLUMNS)}, schema=_RESPONSE_SCHEMA)
        files.append(_write(directory, RESPONSES, table))
    index = store.con.execute("SELECT encoder_id, key FROM states ORDER BY encoder_id, key").fetchall()
    todo = [(e, k) for e, k in index if (e, k) not in have_states]
    if todo:
        by_encoder: dict[str, list[str]] = {}
        for e, k in todo:
            by_encoder.setdefault(e, []).append(k)
        enc, keys, dims, blobs = [], [], [], []
        for e, ks in by_encoder.items():
            vecs = store.get_states(e, ks)
            for k in ks:
                v = np.ascontiguousarray(vecs[k], dtype="<f4")
                enc.append(e), keys.append(k), dims.append(v.shape[0]), blobs.append(v.tobytes())
        files.append(_write(directory, STATES, pa.table({"encoder_id": enc, "key": keys, "dim": dims,
                                                         "state": blobs}, schema=_STATE_SCHEMA)))
    return SegmentCounts(len(new), len(todo), tuple(files))


def import_segments(store: Store, directory: str | Path) -> SegmentCounts:
    """Load every segment of `directory` into `store`, skipping the rows it holds already."""
    directory = Path(directory)
    if not directory.is_dir():
        raise SegmentError(f"{directory}: no such segment directory")
    files = [*segment_files(directory, RESPONSES), *segment_files(directory, STATES)]
    if not files:
        raise SegmentError(f"{directory}: no segments (responses-*.parquet, states-*.parquet) in it")
    if store.read_only:
        raise SegmentError(f"store {store.path} is open read-only: import needs its writer")
    n_resp = n_states = 0
    for p in segment_files(directory, RESPONSES):
        t = _read(p)
        missing = [c for c in _RESPONSE_COLUMNS if c not in t.column_names]
        if missing:
            raise SegmentError(f"segment {p}: missing column(s) {', '.join(missing)}")
        before = store.con.execute("SELECT count(*) FROM responses").fetchall()[0][0]
        store.con.register("_segment", t.select(list(_RESPONSE_COLUMNS)))
        try:
            store.con.execute(f"INSERT OR IGNORE INTO responses ({', '.join(_RESPONSE_COLUMNS)}) "
                              f"SELECT {', '.join(_RESPONSE_COLUMNS)} FROM _segment")
        finally:
            store.con.unregister("_segment")
        n_resp += store.con.execute("SELECT count(*) FROM responses").fetchall()[0][0] - before
    for p in segment_files(directory, STATES):
        t = _read(p)
        missing = [c for c in _STATE_SCHEMA.names if c not in t.column_names]
        if missing:
            raise SegmentError(f"segment {p}: missing column(s) {', '.join(missing)}")
        enc, keys, dims = (t.column(c).to_pylist() for c in ("encoder_id", "key", "dim"))
        blobs = t.column("state").to_pylist()
        by: dict[tuple[str, int], list[int]] = {}
        for i, (e, d) in enumerate(zip(enc, dims)):
            by.setdefault((e, d), []).append(i)
        for (e, d), ix in by.items():
            held = store.get_states(e, [keys[i] for i in ix])
            ix = [i for i in ix if keys[i] not in held]
            if not ix:
                continue
            bad = [keys[i] for i in ix if len(blobs[i]) != 4 * d]
            if bad:
                raise SegmentError(f"segment {p}: state {bad[0]} of encoder {e} is not {d} float32 values")
            vecs = np.frombuffer(b"".join(blobs[i] for i in ix), dtype="<f4").reshape(len(ix), d)
            store.put_states(e, [keys[i] for i in ix], vecs)
            n_states += len(ix)
    store.reload_responses()
    return SegmentCounts(n_resp, n_states, tuple(p.name for p in files))


def encoder_dtypes(directory: str | Path) -> set[str]:
    """The dtypes ("float32" / "bfloat16") of the encoders whose states `directory` ships (from their ids)."""
    tags = {"fp32": "float32", "bf16": "bfloat16"}
    out = set()
    for p in segment_files(Path(directory), STATES):
        for e in set(_read(p, ["encoder_id"]).column("encoder_id").to_pylist()):
            out.update(tags[part] for part in e.split("/") if part in tags)
    return out


def describe(directory: str | Path) -> dict:
    """What a segment directory holds: files, bytes, rows per kind, encoder dtypes (for README and `make replay`)."""
    directory = Path(directory)
    out: dict = {"directory": str(directory), "kinds": {}}
    for kind in KINDS:
        files = segment_files(directory, kind)
        out["kinds"][kind] = {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
                              "rows": sum(pq.ParquetFile(p).metadata.num_rows for p in files)}
    out["bytes"] = sum(k["bytes"] for k in out["kinds"].values())
    out["encoder_dtypes"] = sorted(encoder_dtypes(directory))
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m trinity.store_segments describe DIR`: what a segment directory holds, as JSON; `dtype DIR`: the
    dtype of the encoder whose states it ships (what `make replay` sets TRINITY_ENCODER_AUTO_DTYPE to)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("describe", "dtype"):
        print("usage: python -m trinity.store_segments describe|dtype DIR", file=sys.stderr)
        return 2
    if args[0] == "describe":
        print(json.dumps(describe(args[1])))
        return 0
    dtypes = encoder_dtypes(args[1])
    if len(dtypes) != 1:
        print(f"{args[1]}: states of {len(dtypes)} encoder dtypes ({', '.join(sorted(dtypes)) or 'none'}); a replay "
              f"needs exactly one", file=sys.stderr)
        return 1
    print(dtypes.pop())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


def export_parquet(store, out_dir: str | Path,
                   tables: Sequence[str] = ("responses", "failures", "states", "episodes")) -> dict[str, Path]:
    """Every table of `store` (a `trinity.store.Store`) as one Parquet file in `out_dir` (`trinity export`): rows
    in a stable order, hidden states as float32 lists; a table the store lacks is left out."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    present = {r[0] for r in store.con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    for t in tables:
        if t not in present:  # a store written before this table existed, opened read-only
            continue
        p = out_dir / f"{t}.parquet"
        with atomic_path(p) as tmp:
            if t == "states":
                _export_states(store, tmp)
            else:
                store.con.execute(f"COPY (SELECT * FROM {t} ORDER BY ALL) TO '{tmp}' (FORMAT PARQUET)")
        paths[t] = p
    return paths

def _export_states(store, dest: Path) -> None:
    rows = store.con.execute("SELECT encoder_id, key, dim FROM states ORDER BY encoder_id, key").fetchall()
    schema = pa.schema([("encoder_id", pa.string()), ("key", pa.string()), ("dim", pa.int32()),
                        ("state", pa.list_(pa.float32()))])
    with pq.ParquetWriter(dest, schema) as w:
        for i in range(0, len(rows), 10_000):
            chunk = rows[i:i + 10_000]
            by_enc: dict[str, list[str]] = {}
            for enc, k, _ in chunk:
                by_enc.setdefault(enc, []).append(k)
            vecs = {}
            for enc, ks in by_enc.items():
                vecs.update({(enc, k): v for k, v in store.get_states(enc, ks).items()})
            w.write_table(pa.table({
                "encoder_id": [r[0] for r in chunk], "key": [r[1] for r in chunk], "dim": [r[2] for r in chunk],
                "state": [vecs[(r[0], r[1])].tolist() for r in chunk]}, schema=schema))
