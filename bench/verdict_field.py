"""How often a Verifier reply has no verdict field, per pool member: with the output constraint the product runs
(a llama.cpp grammar for local members, `response_format` for API members) and with the same prompt unconstrained
(what a backend without grammars or structured outputs gives).

Items: the committed training set (params.yaml data.train): data/prepared/train.jsonl when the prepare stage has
run, else built the way the prepare stage builds it (`trinity.data.splits.splits_from_settings` with params.yaml's data
settings). Each item gets one fixed proposed answer: one Worker reply (`--worker`, default qwen-coder-1.5b). Every
pool member of params.yaml is then asked as Verifier (cap coordinator.verifier_max_tokens) on every item, twice:
(a) constrained: the Verifier request exactly as an episode sends it (SamplingParams.output_format "verdict");
(b) free text: the same messages and sampling without the output format.
A reply "has no field" when `trinity.verdict.parse_verdict` returns None (failed calls are counted apart).

Calls go through the Pool into a store of this bench's own (default /tmp/trinity-bench/verdict_field.duckdb, never
the pipeline's data/store: DuckDB allows one writer per file): a rerun pays nothing.

Usage: .venv/bin/python -m bench.verdict_field [--worker qwen-coder-1.5b] [--store PATH] [--out-dir reports]
Writes <out-dir>/verdict_field.json and <out-dir>/verdict_field.md; the last stdout line is one JSON object
(DESIGN.md's bench format). Cost: items x (1 Worker call + 2 x members Verifier calls of <= 48 tokens).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from trinity.machine import commit, cpu_kind

DEFAULT_STORE = Path("/tmp/trinity-bench/verdict_field.duckdb")
FREE_TEXT_ROLE = "verifier-free-text"
"""The role name variant (b) is asked under: the Verifier's token cap, no output format (`RoleSampling` gives one
only to "verifier"), so its requests have their own store keys."""
VARIANTS = {"constrained": "verifier", "free_text": FREE_TEXT_ROLE}


def training_items(settings) -> tuple[list, str]:
    """The committed training set: the prepared file if present, else built as the prepare stage builds it."""
    from trinity.data.splits import load_tasks, splits_from_settings

    prepared = ROOT / "data" / "prepared" / "train.jsonl"
    if prepared.exists():
        return load_tasks(prepared), str(prepared.relative_to(ROOT))
    splits = splits_from_settings(settings.data)
    return list(splits.train), "built with trinity.data.splits.splits_from_settings (params.yaml data)"


def measure(settings, items, store, worker: str) -> tuple[list[dict], list[dict], dict]:
    """(Worker rows, Verifier rows: one per (member, item, variant), pool stats)."""
    from trinity.coordinator.roles import Role, role_messages, turn_of
    from trinity.verdict import parse_verdict
    from trinity.coordinator.role_sampling import RoleSampling
    from trinity.pool.runtime import build_pool

    cap = settings.coordinator.verifier_max_tokens
    roles = RoleSampling.capped({"thinker": settings.coordinator.thinker_max_tokens, "verifier": cap,
                                 FREE_TEXT_ROLE: cap})
    pool = build_pool(settings.pool, store)
    w = pool.names.index(worker)
    asks = [role_messages(Role.WORKER, t, ()) for t in items]
    answers = asyncio.run(pool.complete_many([roles.request(pool, w, m, Role.WORKER) for m in asks]))
    worker_turns = [turn_of(worker, Role.WORKER, r) for r in answers]
    worker_rows = [{"item": t.id, "ok": r.ok, "completion_tokens": r.completion_tokens, "text": r.text}
                   for t, r in zip(items, answers)]
    requests, meta = [], []
    for t, turn in zip(items, worker_turns):
        msgs = role_messages(Role.VERIFIER, t, (turn,))
        for i in range(len(pool)):
            for variant, role in VARIANTS.items():  # interleaved: both sides of the comparison in one batch
                requests.append(roles.request(pool, i, msgs, role))
                meta.append((t.id, pool.names[i], variant))
    replies = asyncio.run(pool.complete_many(requests))
    rows = []
    for (item, member, variant), r in zip(meta, replies):
        verdict = parse_verdict(r.text) if r.ok else None
        rows.append({"item": item, "member": member, "variant": variant, "ok": r.ok, "verdict": verdict,
                     "completion_tokens": r.completion_tokens, "cut": r.completion_tokens >= cap,
                     "latency_s": round(r.latency_s, 2), "text": r.text})
    return worker_rows, rows, pool.stats.as_dict()


def summarise(rows: list[dict]) -> dict:
    """member -> variant -> counts: replies, failed calls, no field (ok replies without a verdict), of which cut at
    the cap, ACCEPT, REJECT, and the missing-field rate over all replies (a failed call has no field either)."""
    out: dict = {}
    for member in dict.fromkeys(r["member"] for r in rows):
        out[member] = {}
        for variant in VARIANTS:
            rs = [r for r in rows if r["member"] == member and r["variant"] == variant]
            missing = [r for r in rs if r["verdict"] is None]
            out[member][variant] = {
                "n": len(rs), "failed_calls": sum(not r["ok"] for r in rs), "missing_field": len(missing),
                "missing_rate": round(len(missing) / len(rs), 3) if rs else None,
                "missing_and_cut": sum(r["cut"] for r in missing if r["ok"]),
                "accept": sum(r["verdict"] == "ACCEPT" for r in rs), "reject": sum(r["verdict"] == "REJECT" for r in rs),
                "mean_completion_tokens": round(sum(r["completion_tokens"] for r in rs) / len(rs), 1) if rs else None}
    return out


def _reason_bound(max_tokens: int) -> int:
    """The reason's character bound in the local members' verdict grammar at `max_tokens`."""
    from trinity import verdict

    return verdict.VERDICT_REASON_CHARS_PER_TOKEN * (max_tokens - verdict.VERDICT_FIELD_TOKENS)


def _dirty() -> bool:
    try:
        return bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "src", "bench"],
                                   capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
        return False


def markdown(res: dict, command: str) -> str:
    d = res["detail"]
    lines = ["# Verifier replies without a verdict field", "",
             f"Measured at commit `{d['commit']}` on {d['cpu']} by `{command}` ({d['wall_s'] / 60:.1f} min, "
             f"{d['pool_stats']['calls_made']} new calls, {d['pool_stats']['store_hits']} store hits). "
             f"Items: the {d['n_items']} training items ({d['items_from']}); proposed answer: one "
             f"{d['worker']} Worker reply per item. Every member is asked as Verifier (max_tokens "
             f"{d['verifier_max_tokens']}, temperature per params.yaml, seed 0), (a) constrained as an episode asks "
             "(the verdict grammar of `trinity.pool.local`), (b) the same prompt as free text. No field = "
             "`parse_verdict` finds no last `Verdict: ACCEPT|REJECT` line (such a reply is no verdict: the episode "
             "goes on).", "",
             "| member | (a) constrained: no field | (b) free text: no field | (a) ACCEPT / REJECT | "
             "(b) ACCEPT / REJECT | (b) no field and cut at the cap |", "|---|---|---|---|---|---|"]
    for member, s in d["by_member"].items():
        a, b = s["constrained"], s["free_text"]
        lines.append(f"| {member} | {a['missing_field']}/{a['n']} ({a['missing_rate']:.0%}) | "
                     f"{b['missing_field']}/{b['n']} ({b['missing_rate']:.0%}) | {a['accept']} / {a['reject']} | "
                     f"{b['accept']} / {b['reject']} | {b['missing_and_cut']} |")
    t = d["total"]
    lines += [f"| all | {t['constrained']['missing_field']}/{t['constrained']['n']} "
              f"({t['constrained']['missing_rate']:.0%}) | {t['free_text']['missing_field']}/{t['free_text']['n']} "
              f"({t['free_text']['missing_rate']:.0%}) | | | |", "",
              "Failed calls (counted as no field): " + ", ".join(
                  f"{m} {s['constrained']['failed_calls']}+{s['free_text']['failed_calls']}"
                  for m, s in d["by_member"].items()) + ".", "",
              "One free-text reply per member (the first item), as the model wrote it:", ""]
    for member, text in d["free_text_examples"].items():
        lines.append(f"- {member}: `{json.dumps(text)[1:-1][:240]}`")
    con = [r for r in d["rows"] if r["variant"] == "constrained" and r["ok"]]
    bound = d.get("reason_chars_bound")
    at_bound = sum(len(r["text"].rsplit("\nVerdict:", 1)[0]) >= bound for r in con if "\nVerdict:" in r["text"])
    lines += ["", f"Constrained replies used at most {max((r['completion_tokens'] for r in con), default=0)} of the "
              f"{d['verifier_max_tokens']} tokens; {at_bound} of {len(con)} stopped their reason at the grammar's "
              f"{bound}-character bound (the verdict line follows a reason cut mid-sentence).",
              "", "Raw replies: verdict_field.json (`detail.rows`)."]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worker", default="qwen-coder-1.5b", help="the pool member whose Worker reply is verified")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--store", type=Path, default=DEFAULT_STORE)
    ap.add_argument("--out-dir", type=Path, default=ROOT / "reports")
    a = ap.parse_args(argv)

    from trinity.config import load_settings
    from trinity.store import Store

    t0 = time.monotonic()
    settings = load_settings(a.params)
    items, source = training_items(settings)
    a.store.parent.mkdir(parents=True, exist_ok=True)
    with Store(a.store) as store:
        worker_rows, rows, stats = measure(settings, items, store, a.worker)
    by_member = summarise(rows)
    total = {v: {"n": sum(s[v]["n"] for s in by_member.values()),
                 "missing_field": sum(s[v]["missing_field"] for s in by_member.values())} for v in VARIANTS}
    for v in total.values():
        v["missing_rate"] = round(v["missing_field"] / v["n"], 3)
    first = items[0].id
    res = {"name": "verdict_field", "figure": total["constrained"]["missing_rate"],
           "unit": "share of Verifier replies without a verdict field, constrained (all members, training items)",
           "goal": "== 0", "compared_to": f"the same prompt unconstrained: {total['free_text']['missing_rate']}",
           "detail": {"by_member": by_member, "total": total, "n_items": len(items), "items_from": source,
                      "items": [t.id for t in items], "worker": a.worker, "worker_replies": worker_rows,
                      "verifier_max_tokens": settings.coordinator.verifier_max_tokens,
                      "reason_chars_bound": _reason_bound(settings.coordinator.verifier_max_tokens),
                      "pool": [m.model_dump(include={"name", "backend", "model", "temperature", "top_p", "max_tokens"})
                               for m in settings.pool.members],
                      "free_text_examples": {r["member"]: r["text"] for r in rows
                                             if r["item"] == first and r["variant"] == "free_text"},
                      "pool_stats": stats, "wall_s": round(time.monotonic() - t0, 1),
                      "commit": commit() + ("+uncommitted" if _dirty() else ""), "cpu": cpu_kind(),
                      "rows": rows}}
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "verdict_field.json").write_text(json.dumps(res, indent=1) + "\n")
    command = "python -m bench." + " ".join([Path(__file__).stem, *(argv if argv is not None else sys.argv[1:])])
    (a.out_dir / "verdict_field.md").write_text(markdown(res, command) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "detail"}
                     | {"detail": {k: v for k, v in res["detail"].items() if k not in ("rows", "worker_replies")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
