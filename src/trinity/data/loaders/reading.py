"""Reading helpers shared by every loader: every failure becomes a DataError that names the file and the record."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator

from trinity.records import Task


class DataError(ValueError):
    """A benchmark file is missing or malformed; the message names the file and the record."""


PathLike = str | os.PathLike


def default_root() -> Path:
    """The benchmark directory: env TRINITY_DATA_DIR, else params `data.root` (default ../shared/benchmarks)."""
    from trinity.config import DataSettings

    return DataSettings().resolved_root()


def require_file(root: PathLike, *parts: str) -> Path:
    p = Path(root).joinpath(*parts)
    if not p.is_file():
        raise DataError(f"{p}: file not found (benchmark root {Path(root)!s})")
    return p


def iter_jsonl(path: Path, *, gz: bool = False) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; a bad line raises DataError with its number."""
    try:
        f = gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")
        with f:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}: line {n}: not valid JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise DataError(f"{path}: line {n}: expected a JSON object, got {type(obj).__name__}")
                yield n, obj
    except (OSError, EOFError, UnicodeDecodeError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({e})") from None


def read_json(path: Path) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({e})") from None


def field(rec: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """rec[key], checked for presence and type; `where` names the file and record for the error."""
    if key not in rec:
        raise DataError(f"{where}: missing field {key!r}")
    v = rec[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
        names = "/".join(k.__name__ for k in kinds)
        raise DataError(f"{where}: field {key!r} should be {names}, got {type(v).__name__} {str(v)[:60]!r}")
    return v


def nonempty(v: str, key: str, where: str) -> str:
    if not v.strip():
        raise DataError(f"{where}: field {key!r} is empty")
    return v


def check_unique(tasks: list[Task], where: Path | str) -> list[Task]:
    seen: set[str] = set()
    for t in tasks:
        if t.id in seen:
            raise DataError(f"{where}: duplicate record id {t.id!r}")
        seen.add(t.id)
    return tasks


def stable_int(text: str) -> int:
    """A 64-bit integer that depends only on `text` (never on Python's salted hash())."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
