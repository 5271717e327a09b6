"""P-bench: concurrent vs sequential calls through the OpenAI-compatible pool backend.

100 chat requests to a loopback fake endpoint (real HTTP, tests/fixtures/fake_openai_server.py, run as its own
process like any real endpoint, so its threads do not compete for the client's GIL) that answers
after 50 ms. Sequential = one `await model.chat(...)` after another (max_concurrency=1); concurrent =
all 100 gathered through a model with max_concurrency=50 under a global limit of 50. Both sides use
the full client path (semaphores, SDK, HTTP transport, JSON parsing, accounting), are warmed up once (so
connection setup is not measured on either side), and are measured interleaved in the same run;
the figure is the median over repetitions of sequential_wall / concurrent_wall.

Usage: .venv/bin/python -m bench.pool_concurrency [--requests 100] [--latency-ms 50] [--concurrency 50]
       [--reps 3] [--transport auto|aiohttp|httpx]
Last line: one JSON object (see bench format in DESIGN.md).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from trinity.config import PoolMember
from trinity.pool.openai_compat import OpenAICompatibleChatModel
from trinity.records import ChatMessage, SamplingParams

KEY_ENV = "TRINITY_BENCH_FAKE_KEY"


async def _run_sequential(model: OpenAICompatibleChatModel, n: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    ok = 0
    for i in range(n):
        r = await model.chat([ChatMessage("user", f"question {i}")], SamplingParams(seed=i))
        ok += r.ok
    return time.perf_counter() - t0, ok


async def _run_concurrent(model: OpenAICompatibleChatModel, n: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    rs = await asyncio.gather(*(model.chat([ChatMessage("user", f"question {i}")], SamplingParams(seed=i))
                                for i in range(n)))
    return time.perf_counter() - t0, sum(r.ok for r in rs)


class _ServerProcess:
    """tests/fixtures/fake_openai_server.py in a child process; counters over its /_fake/ routes."""

    def __init__(self, latency_s: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "fixtures" / "fake_openai_server.py"), "--latency", str(latency_s)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line.startswith("PORT "):
            self.stop()
            raise SystemExit(f"fake server did not start (got {line!r})")
        self.root = f"http://127.0.0.1:{int(line.split()[1])}"
        self.base_url = self.root + "/v1"

    def _call(self, method: str, route: str) -> dict:
        req = urllib.request.Request(self.root + route, method=method, data=b"" if method == "POST" else None)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())

    def stats(self) -> dict:
        return self._call("GET", "/_fake/stats")

    def reset_counters(self) -> None:
        self._call("POST", "/_fake/reset")

    def stop(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()  # the server exits when its stdin closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _bench(args: argparse.Namespace, srv: _ServerProcess) -> dict:
    def member(name: str, conc: int) -> PoolMember:
        return PoolMember(name=name, backend="openai", model="bench-model", base_url=srv.base_url,
                          api_key_env=KEY_ENV, max_concurrency=conc, timeout_s=30.0, max_retries=0)

    global_limit = asyncio.Semaphore(args.concurrency)
    seq = OpenAICompatibleChatModel(member("sequential", 1), asyncio.Semaphore(1), transport=args.transport)
    conc = OpenAICompatibleChatModel(member("concurrent", args.concurrency), global_limit, transport=args.transport)
    try:
        await _run_sequential(seq, 3)  # warm-up: connection + first-call costs off the clock
        await _run_concurrent(conc, args.concurrency)
        srv.reset_counters()
        seq_walls, conc_walls, speedups, max_in_flight = [], [], [], []
        for rep in range(args.reps):
            order = ("seq", "conc") if rep % 2 == 0 else ("conc", "seq")
            walls = {}
            for side in order:
                srv.reset_counters()
                if side == "seq":
                    wall, ok = await _run_sequential(seq, args.requests)
                else:
                    wall, ok = await _run_concurrent(conc, args.requests)
                    max_in_flight.append(srv.stats()["max_in_flight"])
                if ok != args.requests:
                    raise SystemExit(f"{side}: only {ok}/{args.requests} requests succeeded")
                walls[side] = wall
            seq_walls.append(walls["seq"])
            conc_walls.append(walls["conc"])
            speedups.append(walls["seq"] / walls["conc"])
            print(f"rep {rep + 1}: sequential {walls['seq']:.3f}s, concurrent {walls['conc']:.3f}s, "
                  f"speed-up {speedups[-1]:.1f}x", file=sys.stderr)
        return {
            "speedup": statistics.median(speedups),
            "sequential_wall_s": seq_walls,
            "concurrent_wall_s": conc_walls,
            "speedups": speedups,
            "server_max_in_flight": max_in_flight,
            "totals": {"sequential": seq.totals.__dict__, "concurrent": conc.totals.__dict__},
            "transport": type(conc.client._sdk._client).__name__,
        }
    finally:
        await seq.aclose()
        await conc.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--transport", choices=["auto", "aiohttp", "httpx"], default="auto")
    args = ap.parse_args()
    os.environ.setdefault(KEY_ENV, "sk-bench-not-a-real-key-0000000000")

    load_before = os.getloadavg()[0]
    srv = _ServerProcess(args.latency_ms / 1000.0)
    try:
        res = asyncio.run(_bench(args, srv))
    finally:
        srv.stop()

    print(json.dumps({
        "name": "pool_concurrency",
        "figure": round(res["speedup"], 2),
        "unit": "x",
        "goal": ">= 20",
        "compared_to": "sequential requests to the same endpoint",
        "detail": {
            "requests": args.requests,
            "server_latency_ms": args.latency_ms,
            "max_concurrency": args.concurrency,
            "reps": args.reps,
            "statistic": "median of per-rep speed-ups (sides interleaved, alternating order)",
            "sequential_wall_s": [round(x, 4) for x in res["sequential_wall_s"]],
            "concurrent_wall_s": [round(x, 4) for x in res["concurrent_wall_s"]],
            "median_sequential_wall_s": round(statistics.median(res["sequential_wall_s"]), 4),
            "median_concurrent_wall_s": round(statistics.median(res["concurrent_wall_s"]), 4),
            "speedups": [round(x, 2) for x in res["speedups"]],
            "server_max_in_flight": res["server_max_in_flight"],
            "client_totals": res["totals"],
            "cpus": os.cpu_count(),
            "load_avg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "http_transport": res["transport"],
            "note": "the concurrent side is bound by CPU (~1 ms/request on the client with the aiohttp "
                    "transport, ~2 ms with httpx), so the figure drops when other processes load the machine; "
                    "see load_avg_1min_before_after",
        },
    }))


if __name__ == "__main__":
    main()
