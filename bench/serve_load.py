"""`trinity serve` under load: concurrent clients against the server, and what serving costs per request.

1. Load: `--clients` concurrent clients send `--requests` distinct questions (fresh: every episode pays its pool
   calls) to `trinity serve` (a child process, the real CLI) → throughput, p50 / p95 latency, errors, and for
   each request its wall time at the client minus the episode time the server reports (`trinity.episode_s`).
2. Overhead: the same conversations again (now stored: no pool call, no encoding), one at a time, through the
   server and then through `Coordinator.answer` in this process on the same store (after the server stopped:
   one writer). Both sides are warmed first and timed `--reps` times. Their difference is what serving adds to a
   request (HTTP, validation, JSON, the event loop); the figure is that difference as a share of a fresh request's
   p50 wall time from step 1 (goal: <= 5 %).

Pool: the params file's (default: the embedded pool and data/checkpoints, which must exist: `dvc repro` or
`trinity stage evolve`), or with `--fake-latency S` two members served by tests/fixtures/fake_openai_server.py answering
after S seconds (a checkpoint with a zero head is written for them). The store is a fresh temporary file unless
`--store` names one. Prints one JSON line last (the bench format).

    python -m bench.serve_load                       # embedded pool: slow (each episode is several local calls)
    python -m bench.serve_load --fake-latency 0.5 --requests 32
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import httpx
import numpy as np

from trinity.machine import commit, cpu_kind


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def questions(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [f"A shop sells {a} apples in the morning and {b} in the afternoon. How many apples does it sell in "
            f"total? (order {i})" for i, (a, b) in enumerate(rng.integers(2, 99, size=(n, 2)))]


class Child:
    """A child process whose output lines are collected; `pattern` marks it ready (its group 1 is kept)."""

    def __init__(self, cmd: list[str], pattern: str, timeout_s: float, stdin: bool = False):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     stdin=subprocess.PIPE if stdin else None)
        self.lines: list[str] = []
        self.value = ""
        ready = threading.Event()

        def read():
            for line in self.proc.stdout:
                self.lines.append(line)
                m = re.search(pattern, line)
                if m and not self.value:
                    self.value = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout_s) or not self.value:
            self.stop()
            raise SystemExit(f"{' '.join(cmd[:4])}... did not start:\n{''.join(self.lines)[-3000:]}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def fake_pool(tmp: Path, latency_s: float, encoder_dim: int) -> tuple[Child, Path, Path]:
    """tests/fixtures/fake_openai_server.py as two pool members, their params file and a zero-head checkpoint."""
    from trinity.coordinator.checkpoint_meta import CheckpointMeta
    from trinity.coordinator.policy import save_checkpoint

    fake_server = ROOT / "tests" / "fixtures" / "fake_openai_server.py"
    fake = Child([sys.executable, str(fake_server), "--latency", str(latency_s)], r"PORT (\d+)", 30, stdin=True)
    url = f"http://127.0.0.1:{fake.value}/v1"
    members = "\n".join(f"    - {{name: {n}, backend: openai, model: {n}, base_url: '{url}', max_retries: 0, "
                        f"max_concurrency: 16}}" for n in ("fake-a", "fake-b"))
    params = tmp / "params.yaml"
    params.write_text(f"pool:\n  max_concurrency: 32\n  members:\n{members}\n")
    ckpt = tmp / "checkpoints" / "coordinator"
    save_checkpoint(ckpt, np.zeros((2 + 3) * encoder_dim),
                    CheckpointMeta.model_validate({"pool": [{"name": "fake-a"}, {"name": "fake-b"}]}))
    return fake, params, ckpt.parent


async def load_phase(base: str, qs: list[str], clients: int, fmt: str) -> list[dict]:
    """`clients` workers send the questions (each once); per request: status, wall, the server's episode time."""
    todo: asyncio.Queue = asyncio.Queue()
    for q in qs:
        todo.put_nowait(q)
    out: list[dict] = []

    async def worker(http: httpx.AsyncClient) -> None:
        while not todo.empty():
            q = todo.get_nowait()
            t0 = time.perf_counter()
            try:
                r = await http.post("/chat/completions", json={"model": "trinity", "answer_format": fmt,
                                                               "messages": [{"role": "user", "content": q}]})
                body = r.json()
                ok = r.status_code == 200
                err = None if ok else f"{r.status_code}: {body.get('error', {}).get('message', '')[:200]}"
                episode_s = (body.get("trinity") or body.get("error", {}).get("trinity") or {}).get("episode_s")
            except (httpx.HTTPError, ValueError) as e:
                ok, err, episode_s = False, f"{type(e).__name__}: {e}", None
            wall = time.perf_counter() - t0
            out.append({"question": q, "ok": ok, "error": err, "wall_s": wall, "episode_s": episode_s})
            log(f"[load] {len(out)}/{len(qs)} {'ok' if ok else 'ERROR ' + str(err)} {wall:.1f}s")

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base, timeout=3600, limits=limits) as http:
        await asyncio.gather(*(worker(http) for _ in range(clients)))
    return out


async def served_stored(base: str, qs: list[str], reps: int, fmt: str) -> list[float]:
    """Per question: the median wall time of a stored replay through the server (after one warm-up)."""
    med = []
    async with httpx.AsyncClient(base_url=base, timeout=600) as http:
        for q in qs:
            walls = []
            for rep in range(reps + 1):
                t0 = time.perf_counter()
                r = await http.post("/chat/completions", json={"model": "trinity", "answer_format": fmt,
                                                               "messages": [{"role": "user", "content": q}]})
                dt = time.perf_counter() - t0
                if r.status_code != 200 or r.json()["trinity"]["fresh_replies"]:
                    raise SystemExit(f"stored replay of {q!r} was not served from the store: {r.text[:300]}")
                if rep:
                    walls.append(dt)
            med.append(statistics.median(walls))
    return med


async def in_process_stored(coordinator, qs: list[str], reps: int, fmt: str) -> list[float]:
    """The same replays through Coordinator.answer in this process (one warm-up each)."""
    from trinity.serving.messages import task_from_messages

    med = []
    for q in qs:
        task = task_from_messages([{"role": "user", "content": q}], fmt)
        walls = []
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            res = await coordinator.answer(task)
            dt = time.perf_counter() - t0
            if res.summary()["fresh_replies"]:
                raise SystemExit(f"in-process replay of {q!r} made pool calls")
            if rep:
                walls.append(dt)
        med.append(statistics.median(walls))
    return med


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=8, help="distinct questions sent in the load phase")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients")
    ap.add_argument("--reps", type=int, default=5, help="timed stored replays per question (overhead phase)")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--checkpoint", type=Path, default=ROOT / "data" / "checkpoints")
    ap.add_argument("--store", type=Path, default=None, help="default: a fresh temporary store")
    ap.add_argument("--fake-latency", type=float, default=None,
                    help="serve a fake OpenAI pool answering after this many seconds instead of the params' pool")
    ap.add_argument("--answer-format", default="math", choices=["free", "math", "choice", "code"])
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from trinity.coordinator.policy import make_encoder
    from trinity.config import load_settings
    from trinity.serving.conversation import Coordinator

    load_before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="trinity-serve-load-"))
    store = args.store or tmp / "store" / "trinity.duckdb"
    t_load = time.perf_counter()
    fake = None
    params, checkpoint = args.params, args.checkpoint
    if args.fake_latency is not None:
        encoder = make_encoder(load_settings(args.params))  # (the default coordinator LM)
        fake, params, checkpoint = fake_pool(tmp, args.fake_latency, encoder.dim)
    else:
        encoder = make_encoder(load_settings(params))
    qs = questions(args.requests, args.seed)
    server = Child([sys.executable, "-m", "trinity.cli", "serve", "--port", "0", "--params", str(params),
                    "--checkpoint", str(checkpoint), "--store", str(store), "--log-level", "warning"],
                   r"listening on (http://\S+)", 600)
    base = server.value
    log(f"[serve_load] server at {base}; pool {'fake, latency ' + str(args.fake_latency) + 's' if fake else params}")
    try:
        t0 = time.perf_counter()
        results = asyncio.run(load_phase(base, qs, args.clients, args.answer_format))
        load_wall = time.perf_counter() - t0
        answered = [r for r in results if r["ok"]]
        log(f"[serve_load] load phase: {len(answered)}/{len(results)} answered in {load_wall:.1f}s; overhead phase")
        served = asyncio.run(served_stored(base, [r["question"] for r in answered], args.reps, args.answer_format))
    finally:
        rc = server.stop()
    if rc != 0:
        log(f"[serve_load] server exited with {rc}:\n{''.join(server.lines)[-2000:]}")
    try:
        with Coordinator.load(checkpoint, params, store, encoder=encoder) as coordinator:
            inproc = asyncio.run(in_process_stored(coordinator, [r["question"] for r in answered], args.reps,
                                                   args.answer_format))
    finally:
        if fake is not None:
            fake.stop()

    walls = [r["wall_s"] for r in answered]
    timed = [r for r in answered if r["episode_s"] is not None]
    under_load = [r["wall_s"] - r["episode_s"] for r in timed]
    overhead_s = statistics.median(served) - statistics.median(inproc) if served else float("nan")
    p50 = pct(walls, 50)
    figure = 100 * overhead_s / p50 if walls else float("nan")
    print(json.dumps({
        "name": "serve_load",
        "figure": round(figure, 3),
        "unit": "% of a request's p50 wall time",
        "goal": "<= 5",
        "compared_to": "the same conversations through Coordinator.answer in process (the episode function), "
                       "stored replays, one at a time",
        "detail": {
            "pool": f"fake OpenAI endpoint, {args.fake_latency}s latency" if fake else f"params {params}",
            "requests": args.requests, "clients": args.clients, "errors": len(results) - len(answered),
            "error_samples": [r["error"] for r in results if not r["ok"]][:3],
            "load_wall_s": round(load_wall, 2), "throughput_rps": round(len(answered) / load_wall, 4),
            "p50_s": round(p50, 3), "p95_s": round(pct(walls, 95), 3),
            "overhead_ms_per_request": round(1000 * overhead_s, 3),
            "served_stored_replay_ms_median": round(1000 * statistics.median(served), 3) if served else None,
            "in_process_stored_replay_ms_median": round(1000 * statistics.median(inproc), 3) if inproc else None,
            "under_load_wall_minus_episode_ms_median": round(1000 * statistics.median(under_load), 1)
            if under_load else None,
            "under_load_wall_minus_episode_share_pct_median": round(100 * statistics.median(
                [u / r["wall_s"] for u, r in zip(under_load, timed)]), 2) if under_load else None,
            "reps": args.reps, "answer_format": args.answer_format, "store": str(store),
            "server_exit_code": rc, "setup_s": round(t0 - t_load, 1),
            "load_avg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "commit": commit(), "cpu": cpu_kind(),
        },
    }))


if __name__ == "__main__":
    main()
