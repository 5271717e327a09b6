"""What each pool member solves alone, per task family and reply budget: the measurement a training mix is
chosen from (issue 14, item 3).

Every member answers every item once as Worker (the same prompt as the evaluation's `alone:<member>` rows and
as an episode's first Worker turn), at each `--max-tokens` cap; the reply is graded by the project's graders
(code in the sandbox). Per family and member: accuracy, mean completion tokens, the share of replies that hit
the cap (truncated), seconds per call. Per family: the best single member and the "any member" oracle (an item
counts when at least one member solves it) — the gap between the two is all that routing can add over always
calling the best member (the figure).

Items: a seeded draw from the *training* benchmarks (`--sources`, default params.yaml data.train), MATH-500
levels <= data.math500_max_level; the pipeline's in-distribution evaluation items and the held-out benchmarks
are left out (nothing is tuned on what is evaluated). Calls go to a kept store (default
~/.cache/trinity/bench/member_accuracy.duckdb): a rerun with the same items and caps pays nothing.

Usage: .venv/bin/python -m bench.member_accuracy [--per-source 12] [--max-tokens 192,320]
       [--sources math500,mmlu,livecodebench] [--store PATH] [--markdown FILE]
Last line: one JSON object (DESIGN.md's bench format). Cost: members x items x caps calls on the embedded
pool (about 5 s each on 2 cores, 4 members in parallel); progress goes to stderr.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from trinity.machine import commit, cpu_kind

DEFAULT_STORE = Path.home() / ".cache" / "trinity" / "bench" / "member_accuracy.duckdb"


def measurement_items(settings, sources: list[str], per_source: int):
    """`per_source` training-side items of each source, never an item of the pipeline's evaluation sets."""
    from trinity.data.splits import splits_from_settings

    d = settings.data
    pipeline = splits_from_settings(d)
    evaluated = {t.id for t in [*pipeline.in_distribution, *pipeline.heldout]}
    out = []
    for src in sources:
        extra = sum(1 for t in pipeline.in_distribution if t.source == src)
        drawn = splits_from_settings(d, train={src: per_source + extra}, in_distribution={}, heldout={}).train
        out += [t for t in drawn if t.id not in evaluated][:per_source]
    return out


def with_max_tokens(settings, cap: int):
    """The same settings with every member's max_tokens set to `cap`."""
    from trinity.config import Settings

    dump = settings.model_dump(exclude={"source_path"})
    for m in dump["pool"]["members"]:
        m["max_tokens"] = cap
    return Settings.model_validate(dump)


def measure(settings, items, store, grade) -> tuple[list[dict], int]:
    """(one row per (item, member): score, completion tokens, latency, truncated, ok; new calls paid)."""
    from trinity.coordinator.roles import Role, latest_answer, role_messages, turn_of
    from trinity.coordinator.role_sampling import RoleSampling
    from trinity.pool.runtime import build_pool

    pool, roles = build_pool(settings.pool, store), RoleSampling()  # a Worker turn: each member's own cap
    caps = {i: roles.sampling(pool, i, Role.WORKER).max_tokens for i in range(len(pool))}
    requests = [roles.request(pool, i, msgs, Role.WORKER)
                for t in items for i in range(len(pool)) for msgs in [role_messages(Role.WORKER, t, ())]]
    t0 = time.monotonic()
    replies = asyncio.run(pool.complete_many(requests))
    rows = []
    for (i, *_), t, r in zip(requests, [t for t in items for _ in range(len(pool))], replies):
        answer = latest_answer((turn_of(pool.names[i], Role.WORKER, r),))
        rows.append({"item": t.id, "family": t.source, "member": pool.names[i],
                     "score": float(grade(t, answer)) if answer is not None else 0.0,
                     "completion_tokens": r.completion_tokens, "latency_s": r.latency_s, "ok": r.ok,
                     "truncated": r.completion_tokens >= caps[i]})
    print(f"[member_accuracy] {len(requests)} replies: {pool.stats.calls_made} new calls, "
          f"{pool.stats.store_hits} store hits, {time.monotonic() - t0:.0f}s", file=sys.stderr, flush=True)
    return rows, pool.stats.calls_made


def summarise(rows: list[dict], within: tuple[int, ...] = ()) -> dict:
    """family -> {members: {member: stats}, best_member, best_accuracy, any_member_accuracy, n}. For each cap c in
    `within` (below the measured cap), `accuracy_within_c` counts only the replies that ended before c tokens:
    replies are seeded, so a reply capped at c is the first c tokens of this one, and one that needs c tokens or
    more is cut before its final answer."""
    out = {}
    for fam in dict.fromkeys(r["family"] for r in rows):
        fr = [r for r in rows if r["family"] == fam]
        items = list(dict.fromkeys(r["item"] for r in fr))
        members = {}
        for m in dict.fromkeys(r["member"] for r in fr):
            mr = [r for r in fr if r["member"] == m]
            members[m] = {"accuracy": round(sum(r["score"] for r in mr) / len(mr), 3),
                          "mean_completion_tokens": round(sum(r["completion_tokens"] for r in mr) / len(mr), 1),
                          "truncated": round(sum(r["truncated"] for r in mr) / len(mr), 3),
                          "seconds_per_call": round(sum(r["latency_s"] for r in mr) / len(mr), 2),
                          "failed": sum(not r["ok"] for r in mr)}
            for c in within:
                members[m][f"accuracy_within_{c}"] = round(
                    sum(r["score"] for r in mr if r["completion_tokens"] < c) / len(mr), 3)
        best = max(members, key=lambda m: members[m]["accuracy"])
        solved = {it: max(r["score"] for r in fr if r["item"] == it) for it in items}
        out[fam] = {"n": len(items), "members": members, "best_member": best,
                    "best_accuracy": members[best]["accuracy"],
                    "any_member_accuracy": round(sum(solved.values()) / len(items), 3)}
    return out


def markdown(res: dict, command: str) -> str:
    d = res["detail"]
    lines = ["# Member accuracy by task family and reply cap", "",
             f"Measured at commit `{d['commit']}` on {d['cpu']} by `{command}` ({d['wall_s'] / 60:.1f} min, "
             f"{d['new_calls']} new calls; replies already in the kept store are served from it, with the latency recorded "
             "when they were paid: four local models sharing two cores, so seconds per call are contended figures). "
             f"Items: {d['per_source']} per family, drawn from the training side "
             "(never an evaluation item). Cells: accuracy (share of replies that hit the cap, mean completion "
             "tokens, seconds per call); [<c: x] = accuracy counting only replies that ended before c tokens (what a cap "
             "of c would keep: replies are seeded, so a capped reply is this reply's first c tokens).", ""]
    for cap, fams in d["by_cap"].items():
        members = list(next(iter(fams.values()))["members"])
        lines += [f"## max_tokens {cap}", "", "| family | " + " | ".join(members) + " | best | any member |",
                  "|---|" + "---|" * (len(members) + 2)]
        for fam, s in fams.items():
            cells = [f"{s['members'][m]['accuracy']:.2f}"
                     + "".join(f" [<{c}: {v:.2f}]" for k, v in s['members'][m].items()
                               if k.startswith("accuracy_within_") for c in [k.rsplit("_", 1)[1]])
                     + f" ({s['members'][m]['truncated']:.0%}, "
                     f"{s['members'][m]['mean_completion_tokens']:.0f} tok, {s['members'][m]['seconds_per_call']:.1f}s)"
                     for m in members]
            lines.append(f"| {fam} (n={s['n']}) | " + " | ".join(cells) +
                         f" | {s['best_accuracy']:.2f} {s['best_member']} | {s['any_member_accuracy']:.2f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-source", type=int, default=12)
    ap.add_argument("--max-tokens", default="320", help="comma-separated reply caps (every member), each measured")
    ap.add_argument("--within", default="192", help="comma-separated smaller caps, derived from the measured replies")
    ap.add_argument("--sources", default=None, help="comma-separated training benchmarks (default data.train's)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--store", type=Path, default=DEFAULT_STORE)
    ap.add_argument("--markdown", type=Path, default=None, help="also write the tables here")
    a = ap.parse_args(argv)

    from trinity.config import load_settings
    from trinity.grading import grade, preflight
    from trinity.store import Store

    t_start = time.monotonic()
    settings = load_settings(a.params)
    sources = a.sources.split(",") if a.sources else list(settings.data.train)
    caps = [int(c) for c in a.max_tokens.split(",")]
    within = tuple(int(c) for c in a.within.split(",")) if a.within else ()
    items = measurement_items(settings, sources, a.per_source)
    preflight(items)
    a.store.parent.mkdir(parents=True, exist_ok=True)
    by_cap, new_calls = {}, 0
    with Store(a.store) as store:
        for cap in caps:
            rows, paid = measure(with_max_tokens(settings, cap), items, store, grade)
            new_calls += paid
            by_cap[str(cap)] = summarise(rows, tuple(c for c in within if c < cap))
    # headroom at the largest cap: what routing could add over always calling the best member, averaged over families
    top = by_cap[str(max(caps))]
    headroom = sum(f["any_member_accuracy"] - f["best_accuracy"] for f in top.values()) / len(top)
    res = {"name": "member_accuracy", "figure": round(headroom, 3),
           "unit": "mean over families of (any-member oracle accuracy - best single member accuracy), "
                   f"max_tokens {max(caps)}",
           "compared_to": "the best single member of each family, same items and replies",
           "detail": {"by_cap": by_cap, "per_source": a.per_source, "sources": sources,
                      "items": [t.id for t in items], "new_calls": new_calls,
                      "pool": [m.name for m in settings.pool.members],
                      "wall_s": round(time.monotonic() - t_start, 1), "commit": commit(), "cpu": cpu_kind()}}
    if a.markdown:
        a.markdown.write_text(markdown(res, "python -m bench." + " ".join([Path(__file__).stem, *(argv or sys.argv[1:])])) + "\n")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
