"""Calls against a real llama-server while the caller blocks its own event loop for longer than the server's 5 s
keep-alive timeout (what an encode or a sandboxed grade does), with the pool's connection retries off.

Four calls are started, the caller's loop is let run for k iterations (so the calls are at some point of opening
their connections), then it blocks for 6 s; k sweeps 1..12. Before the pool's calls had a loop of their own
(f611ab6), 4 of 4 calls failed with "Cannot write to closing transport" at k = 5 and k = 8 on a 2-core EPYC, and
every call that succeeded counted the stall in its seconds. Runs against any checkout: PYTHONPATH=<checkout>/src.
Prints one JSON line: figure = calls failed (goal 0), with the longest call's seconds (goal: well under the stall).

    .venv/bin/python -m bench.loop_stall
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STALL_S = 6.0
SMOL = {"name": "smol", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 8, "temperature": 0.0}


def main() -> int:
    import trinity
    from trinity.machine import commit, cpu_kind

    from trinity.config import PoolSettings
    from trinity.pool import llama_server
    from trinity.pool.runtime import build_pool
    from trinity.records import ChatMessage

    llama_server.CONNECTION_RETRIES = 0
    pool = build_pool(PoolSettings.model_validate({"members": [SMOL], "max_concurrency": 8}), None)

    def ask(i: int) -> list[ChatMessage]:
        return [ChatMessage("user", f"Say the number {i}.")]

    async def caller() -> list[dict]:
        await pool.complete(0, ask(0))  # the server is started
        out = []
        for k in (1, 2, 3, 5, 8, 12):
            calls = [asyncio.create_task(pool.complete(0, ask(10 * k + i))) for i in range(4)]
            for _ in range(k):
                await asyncio.sleep(0)
            time.sleep(STALL_S)  # the caller's loop is held (an encode, a grade)
            replies = await asyncio.gather(*calls)
            out.append({"iterations": k, "failed": sum(not r.ok for r in replies),
                        "error": next((r.error[:120] for r in replies if not r.ok), None),
                        "max_call_s": round(max(r.latency_s for r in replies), 2)})
            time.sleep(STALL_S)  # the connections sit idle past the server's keep-alive timeout
        return out

    sweep = asyncio.run(caller())
    failed = sum(s["failed"] for s in sweep)
    print(json.dumps({"name": "loop_stall", "figure": failed, "unit": "calls failed", "goal": "== 0",
                      "compared_to": f"{4 * len(sweep)} calls, caller's loop blocked {STALL_S:g} s per batch, "
                                     "pool retries off",
                      "max_call_s": max(s["max_call_s"] for s in sweep), "code": trinity.__file__,
                      "commit": commit(), "cpu": cpu_kind(), "detail": {"sweep": sweep}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
