"""After a replay (`make replay`): did it rebuild the committed report? Compares reports/ as the replay wrote it with
the committed version (git HEAD, or --ref), field by field, and prints one JSON line.

What may honestly differ is only what describes *this* run rather than the measurement: the counters of calls paid
and store hits (a replay pays none: every answer comes from the store), the wall times, and the number of
transcripts newly encoded (a replay encodes none). Those fields are listed in the output, not compared. Everything
else — every score, interval, paired comparison, token count, per-call second (stored with its reply), trace text,
training curve — must be identical; any other difference fails the check (exit 1) and is listed. Plots (PNG) are
not compared: they are drawn from the same numbers, and the renderer's bytes are not ours.

    python scripts/check_replay.py [--ref HEAD] [--dir reports]
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN_FIELDS = {"calls_made", "store_hits", "failed_calls", "transient_failures", "wall_s", "newly_encoded",
              "resumed_from_generation", "calls_new", "eval_wall_s", "wall_min"}
"""JSON keys that describe the run that wrote the file (calls it paid, hits, seconds), not the measurement."""
RUN_COLUMNS = {"new LLM calls", "store hits", "failed calls"}
"""Markdown table columns of the same kind."""
RUN_SENTENCES = [
    (re.compile(r"made \d+ new pool calls \(\d+ store hits\) in [\d.]+ min"), "made N new pool calls (M store hits) in T min"),
    (re.compile(r"\b\d+ calls paid\b"), "N calls paid"),
]


def _strip_json(obj):
    if isinstance(obj, dict):
        return {k: _strip_json(v) for k, v in obj.items() if k not in RUN_FIELDS}
    if isinstance(obj, list):
        return [_strip_json(v) for v in obj]
    return obj


def _strip_markdown(text: str) -> list[str]:
    out, blank = [], set()
    for line in text.splitlines():
        for pattern, repl in RUN_SENTENCES:
            line = pattern.sub(repl, line)
        if line.startswith("|"):
            cells = line.strip().strip("|").split("|")
            if any(c.strip() in RUN_COLUMNS for c in cells):
                blank = {i for i, c in enumerate(cells) if c.strip() in RUN_COLUMNS}
            elif blank and not set(line.replace("|", "").strip()) <= set("-: "):
                cells = ["" if i in blank else c for i, c in enumerate(cells)]
            line = "|".join(cells)
        else:
            blank = set()
        out.append(line)
    return out


def _committed(ref: str, rel: str) -> str | None:
    r = subprocess.run(["git", "show", f"{ref}:{rel}"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else None


def compare(ref: str, directory: str) -> dict:
    files = sorted(p for p in (ROOT / directory).rglob("*") if p.suffix in (".md", ".json") and p.is_file())
    result = {"ref": ref, "compared": 0, "identical": [], "differs": {}, "not_committed": [],
              "ignored_fields": sorted(RUN_FIELDS | RUN_COLUMNS)}
    for p in files:
        rel = str(p.relative_to(ROOT))
        old = _committed(ref, rel)
        if old is None:
            result["not_committed"].append(rel)
            continue
        new = p.read_text()
        result["compared"] += 1
        if p.suffix == ".json":
            a, b = _strip_json(json.loads(old)), _strip_json(json.loads(new))
            same = a == b
            detail = None if same else _json_diff(a, b)
        else:
            a, b = _strip_markdown(old), _strip_markdown(new)
            same = a == b
            detail = None if same else [f"line {i + 1}: {x[:160]!r} -> {y[:160]!r}"
                                        for i, (x, y) in enumerate(zip(a, b)) if x != y][:5] or \
                [f"{len(a)} lines committed, {len(b)} now"]
        if same:
            result["identical"].append(rel)
        else:
            result["differs"][rel] = detail
    return result


def _json_diff(a, b, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'replay' if k in b else 'committed'}")
            else:
                out += _json_diff(a[k], b[k], f"{path}.{k}")
        return out[:8]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _json_diff(x, y, f"{path}[{i}]")][:8]
    return [] if a == b else [f"{path}: {str(a)[:80]} -> {str(b)[:80]}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="HEAD", help="the committed version to compare with (default HEAD)")
    ap.add_argument("--dir", default="reports", help="the report directory (default reports)")
    args = ap.parse_args(argv)
    result = compare(args.ref, args.dir)
    ok = not result["differs"] and result["compared"] > 0
    print(json.dumps({"name": "replay_check", "figure": len(result["differs"]), "unit": "files that differ",
                      "goal": "== 0", "ok": ok, "detail": result}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
