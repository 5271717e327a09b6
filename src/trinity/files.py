"""Files written whole or not at all, and file hashes: the one place for both.

Every output a later step reads (stage outputs, checkpoints, resume state, prepared splits, store segments) is
written to a temporary file beside its target and renamed over it, so a crash or a kill leaves the old file or the
new one, never half of one.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def _temp_beside(path: Path) -> Path:
    """A unique temporary name in `path`'s directory (so the final rename stays on one filesystem). Files are
    created there with the process umask, as a plain open() would (not mkstemp's 0600)."""
    return path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"


@contextlib.contextmanager
def atomic_open(path: Path | str, mode: str = "w", fsync: bool = False, **kw) -> Iterator[IO]:
    """Open a temporary file beside `path` for writing; on a clean exit it replaces `path` (on an error it is
    removed and `path` is untouched). `fsync`: flush to disk before the rename (resume state)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    try:
        with open(tmp, mode.replace("w", "x"), **kw) as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temporary path beside `path`, for writers that take a file name rather than a file object (DuckDB's
    COPY, a parquet writer): on a clean exit it replaces `path` (on an error it is removed and `path` is
    untouched). The temporary file exists (empty) when the block starts; the writer overwrites it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_beside(path)
    tmp.touch(exist_ok=False)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path | str, text: str) -> None:
    with atomic_open(path, "w", encoding="utf-8") as f:
        f.write(text)


def write_json(path: Path | str, obj: Any) -> None:
    """`obj` as indented JSON with sorted keys (the stages' output format), atomically."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def file_sha256(path: Path | str) -> str:
    """The sha256 of a file's bytes (hex), read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()
