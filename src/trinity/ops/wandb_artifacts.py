"""W&B artifacts of the stage runs (trinity.ops.tracking logs them): their names, the content alias that names the
exact version of their files, what a file or metadata becomes when logged (redacted, JSON-safe), and the lineage of
offline runs: the inputs a run recorded, declared through W&B's public API once `sync` has uploaded the runs.
"""
from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from trinity.redact import redact_text

INPUTS_FILE = "trinity_inputs.json"
"""The run's exact inputs, as a file of the run (in its files/ directory), for `restore_lineage` after a sync."""

# Files whose text is checked for secrets before it goes into an artifact.
_TEXT_SUFFIXES = frozenset({".json", ".jsonl", ".md", ".txt", ".yaml", ".yml", ".csv", ".tsv", ".log",
                            ".html", ".toml", ".ini", ".cfg", ".py", ".lock"})
_NAME_MAXLEN = 128


def artifact_name(name: str) -> str:
    """`name` as a valid W&B artifact name: letters, digits, '-', '_' and '.', at most 128 characters
    (other runs of characters, e.g. '/', ':' or spaces, become one '-')."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "-", redact_text(str(name))).strip("-.")
    return clean[:_NAME_MAXLEN].rstrip("-.") or "artifact"


def content_alias(paths: Iterable[Path]) -> str:
    """`c-<hash>` of the files an artifact holds (each file by its name as logged, a directory by its tree): the
    same files give the same alias, so a consumer names the exact version a producer logged."""
    import hashlib

    h = hashlib.sha256()
    entries = []
    for p in map(Path, paths):
        if p.is_dir():
            entries += [(f"{p.name}/{f.relative_to(p).as_posix()}", f) for f in sorted(p.rglob("*")) if f.is_file()]
        elif p.is_file():
            entries.append((p.name, p))
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    for entry, f in sorted(entries):
        h.update(entry.encode() + b"\0" + hashlib.sha256(f.read_bytes()).digest())
    return "c-" + h.hexdigest()[:20]


def _artifact_type(type: str) -> str:
    clean = artifact_name(type)
    return clean if not clean.startswith("wandb-") else "trinity-" + clean  # "wandb-*" types are reserved


def _json_safe(obj: Any) -> Any:
    """Artifact metadata as W&B accepts it: JSON types only, no NaN/inf (the backend refuses them)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        try:
            return _json_safe(obj.item())
        except (TypeError, ValueError):
            pass
    return str(obj)


def _redacted_text_of(path: Path) -> str | None:
    """The redacted text of a text file that contains a secret, else None (clean, or not text)."""
    if path.suffix.lower() not in _TEXT_SUFFIXES:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    red = redact_text(text)
    return red if red != text else None


def recorded_inputs(run_dir: Path) -> list[dict]:
    """The exact inputs an (offline) run recorded (`INPUTS_FILE` in its files/ directory); [] when it used none."""
    path = Path(run_dir) / "files" / INPUTS_FILE
    return json.loads(path.read_text()) if path.exists() else []


def restore_lineage(api, run_path: str, inputs: list[dict]) -> list[str]:
    """Declare, through W&B's public API (`wandb.Api()`), the inputs an offline run recorded as used by that run
    once synced (`run_path`: entity/project/run_id): the versions `<name>:<alias>` of the run's project. Returns
    the artifacts declared."""
    entity_project = run_path.rsplit("/", 1)[0]
    run = api.run(run_path)
    done = []
    for e in inputs:
        ref = f"{entity_project}/{e['name']}:{e['alias']}"
        run.use_artifact(api.artifact(ref, type=e["type"]))
        done.append(ref)
    return done


def sync(wandb_dir: Path, project: str = "trinity", entity: str | None = None,
         timeout_s: float = 600) -> list[tuple[str, list[str]]]:
    """`wandb sync` every offline run under `wandb_dir` (each under a timeout: it hangs when the server is out of
    reach), then `restore_lineage` of each; returns (run path, artifacts declared) per run. Needs W&B online."""
    import subprocess

    import wandb

    api = wandb.Api()
    out = []
    for run_dir in sorted(Path(wandb_dir).glob("wandb/offline-run-*")):
        cmd = [sys.executable, "-m", "wandb", "sync", "--project", project, *(["--entity", entity] if entity else []),
               str(run_dir)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        if r.returncode != 0:
            raise RuntimeError(f"`wandb sync {run_dir}` failed (exit {r.returncode}): {(r.stderr or r.stdout)[-500:]}")
        run_id = run_dir.name.rsplit("-", 1)[-1]
        path = f"{entity or api.default_entity}/{project}/{run_id}"
        out.append((path, restore_lineage(api, path, recorded_inputs(run_dir))))
    return out


__all__ = ["INPUTS_FILE", "artifact_name", "content_alias", "recorded_inputs", "restore_lineage", "sync"]
