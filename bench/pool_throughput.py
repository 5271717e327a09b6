"""P-bench: a local member's real requests through the in-process path vs llama.cpp's own server (issue 26).

Replays requests a `make run` actually made: the stored responses of one pool member (default qwen-coder-1.5b) in
the pipeline's response store (data/store/trinity.duckdb, opened read-only: a snapshot if another process writes
it), the first --requests of them in the order they were made (by default the evolve roles worker/thinker/verifier,
i.e. the start of generation 0; the evaluation's judge calls are left out), each with its stored messages and
sampling settings (temperature, top_p, max_tokens, seed; a Verifier request's "verdict" output format as the same
GBNF grammar on both sides). They are sent --concurrency at a time (default 8: the pool's global cap, what a
generation keeps in flight), a new one as soon as one returns, through

  (a) in-process: trinity.pool.local.LocalChatModel with the member's settings from params.yaml (llama-cpp-python,
      n_ctx and n_threads as configured; one lock per model, so one sequence is decoded at a time), and
  (b) llama-server: llama.cpp's server built for this CPU by scripts/build_llama_server.sh, started here on the
      member's GGUF with -np <concurrency> -c <--ctx-per-slot x concurrency> -t <--threads> --cache-reuse 256 on a
      free loopback port (continuous batching over parallel slots, a prompt cache per slot), called over HTTP on
      its OpenAI-compatible /v1/chat/completions (/v1/completions with the member's rendered prompt and stop string
      for a completion-style member) with the same messages and sampling (top_k 40 and min_p 0.05 sent explicitly:
      llama-cpp-python's defaults) — the pool's own request bodies (`trinity.pool.llama_server.server_request`) —,
      sent by plain aiohttp rather than the pool's HTTP client (`EndpointClient`), which drops the replies' `timings`.
      The server is the pool's `ServerProcess` with this bench's -t/-c; it is stopped at the end, also on an error
      or SIGTERM, and dies with this process (PR_SET_PDEATHSIG) if it is killed.
  (c) the pool's own path since issue 26: the member as the pipeline runs it (`pool.local_engine: llama-server`,
      trinity.pool.llama_server.LlamaServerChatModel: its server started by the member, --concurrency slots, every
      core's threads, called through the pool's HTTP client). (b) and (c) differ only in the client; (b)
      gives the server's per-reply timings, which the pool does not keep.

The three sides run one after the other in the same run (a server is started only after the side before it is
done, so they never share the cores), each after one short warm-up call that is not timed; model load and server
start are not timed.
Per side: aggregate completion tokens/s, requests/s, mean and max latency per request (from issuing the request to
its reply, queueing included: what a caller at this concurrency sees) and total wall. Where the time of a call goes,
reading the prompt vs decoding: for (b) from the server's per-reply `timings` (prompt_ms, predicted_ms; prompt_n
counts only the prompt tokens not served from the slot's cache, cache_n those that were), for (a) from llama.cpp's
perf counters of the in-process context over the whole run (t_p_eval_ms vs t_eval_ms). The figure is the
requests/s speed-up of (c) over (a); the issue's goal (>= 2.5x) is on aggregate completion tokens/s, in `detail`.
The replies of the two sides are compared byte for byte (informative: batched decoding is not batch-invariant, and
the two sampler implementations need not draw alike), and (a)'s with the stored ones (the store's replay anchor).

The two sides sample freely (temperature 0.7 for most stored requests), so their replies and hence completion
lengths differ: tokens/s is the throughput that does not depend on how long the replies happen to be.

Usage: .venv/bin/python -m bench.pool_throughput [--member qwen-coder-1.5b] [--requests 16] [--concurrency 8]
       [--roles worker,thinker,verifier] [--store data/store/trinity.duckdb] [--server-bin PATH]
       [--threads 2] [--ctx-per-slot 4096] [--cache-reuse 256]
Needs the server binary: bash scripts/build_llama_server.sh (once per CPU, ~4 min on 2 cores).
Last line: one JSON object (see bench format in DESIGN.md).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from trinity.config import load_settings
from trinity.pool.llama_server import ServerProcess, ServerSpec, server_binary, server_request
from trinity.pool.local import LocalChatModel, load_llama
from trinity.records import ChatMessage, SamplingParams
from trinity.store import Store


@dataclass(frozen=True)
class Request:
    role: str
    messages: list[ChatMessage]
    sampling: SamplingParams
    stored_text: str


def load_requests(store_path: Path, model_id: str, roles: set[str], n: int) -> list[Request]:
    """The first `n` successful stored requests of `model_id` in the roles asked, in the order they were made."""
    with Store(store_path, read_only=True) as store:
        rows = store.con.execute(
            "SELECT role, messages, sampling, text FROM responses WHERE model_id = ? AND ok "
            "ORDER BY created_at, key", [model_id]).fetchall()
    out = []
    for role, messages, sampling, text in rows:
        if roles and role not in roles:
            continue
        msgs = [ChatMessage(r, c) for r, c in json.loads(messages)]
        out.append(Request(role or "", msgs, SamplingParams(**json.loads(sampling)), text))
        if len(out) == n:
            break
    return out


@dataclass
class Result:
    text: str
    ok: bool
    error: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    timings: dict | None = None


def summarise(results: list[Result], wall_s: float) -> dict:
    ct = sum(r.completion_tokens for r in results)
    lat = [r.latency_s for r in results]
    return {"wall_s": round(wall_s, 2), "requests": len(results), "ok": sum(r.ok for r in results),
            "completion_tokens": ct, "prompt_tokens": sum(r.prompt_tokens for r in results),
            "completion_tok_per_s": round(ct / wall_s, 2), "requests_per_s": round(len(results) / wall_s, 4),
            "mean_latency_s": round(statistics.fmean(lat), 2), "max_latency_s": round(max(lat), 2)}


async def replay(call, requests: list[Request], concurrency: int) -> tuple[list[Result], float]:
    """Send `requests` through `call` at most `concurrency` at a time; each result's latency runs from issuing the
    request to its reply."""
    sem = asyncio.Semaphore(concurrency)

    async def one(r: Request) -> Result:
        async with sem:
            t0 = time.perf_counter()
            res = await call(r)
            res.latency_s = time.perf_counter() - t0
            return res

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(r) for r in requests))
    return list(results), time.perf_counter() - t0


# ------------------------------------------------------------------------------------------- (a) in-process
def perf_counters(llm) -> dict:
    import llama_cpp

    d = llama_cpp.llama_perf_context(llm.ctx)
    return {"prompt_ms": d.t_p_eval_ms, "predicted_ms": d.t_eval_ms, "prompt_n": d.n_p_eval, "predicted_n": d.n_eval}


def run_inprocess(model: LocalChatModel, requests: list[Request], concurrency: int) -> tuple[list[Result], float, dict]:
    llm, _ = load_llama(model.gguf.path, model.member.n_ctx, model.member.n_threads)  # load before the clock starts
    model.generate([ChatMessage("user", "Hi")], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up
    before = perf_counters(llm)

    async def call(r: Request) -> Result:
        resp = await model.chat(r.messages, r.sampling)
        return Result(resp.text, resp.ok, resp.error, resp.prompt_tokens, resp.completion_tokens, 0.0)

    results, wall = asyncio.run(replay(call, requests, concurrency))
    after = perf_counters(llm)
    return results, wall, {k: after[k] - before[k] for k in after}


# ------------------------------------------------------------------------------------------- (b) llama-server
def run_server(server: ServerProcess, model: LocalChatModel, requests: list[Request],
               concurrency: int) -> tuple[list[Result], float]:
    """(b): the pool's own request bodies (`server_request`), sent by plain aiohttp to keep the replies' `timings`."""
    import aiohttp

    async def main() -> tuple[list[Result], float]:
        timeout = aiohttp.ClientTimeout(total=1800)
        async with aiohttp.ClientSession(timeout=timeout,
                                         connector=aiohttp.TCPConnector(limit=concurrency + 2)) as http:
            async def call(r: Request) -> Result:
                route, body = server_request(model.name, model.gguf, r.messages, r.sampling)
                async with http.post(server.base_url + route, json=body) as resp:
                    raw = await resp.text()
                try:
                    data = json.loads(raw)
                except ValueError:
                    data = None
                if resp.status != 200 or not isinstance(data, dict) or not data.get("choices"):
                    return Result("", False, f"http {resp.status}: {raw[:300]}", 0, 0, 0.0)
                choice = data["choices"][0]
                text = choice["text"] if model.gguf.completion_style else (choice["message"].get("content") or "")
                usage = data.get("usage") or {}
                return Result(text, bool(text.strip()), None, int(usage.get("prompt_tokens", 0)),
                              int(usage.get("completion_tokens", 0)), 0.0, data.get("timings"))

            warm = Request("warm-up", [ChatMessage("user", "Hi")], SamplingParams(temperature=0.0, max_tokens=4), "")
            await call(warm)
            return await replay(call, requests, concurrency)

    return asyncio.run(main())


def run_pool_member(member, requests: list[Request], concurrency: int) -> tuple[list[Result], float, str]:
    """(c) the pool's own path: the member as the pipeline runs it (`pool.local_engine: llama-server`), its server
    started by the member on the untimed warm-up call, with `concurrency` slots."""
    from trinity.pool.llama_server import LLAMA_SERVERS, LlamaServerChatModel

    model = LlamaServerChatModel(member.model_copy(update={"engine": "llama-server", "max_concurrency": concurrency}))

    async def main() -> tuple[list[Result], float]:
        await model.chat([ChatMessage("user", "Hi")], SamplingParams(temperature=0.0, max_tokens=4))

        async def call(r: Request) -> Result:
            resp = await model.chat(r.messages, r.sampling)
            return Result(resp.text, resp.ok, resp.error, resp.prompt_tokens, resp.completion_tokens, 0.0)

        return await replay(call, requests, concurrency)

    try:
        results, wall = asyncio.run(main())
        cmd = " ".join(Path(c).name if i in (0, 2) else c for i, c in enumerate(model.spec.command(0)))
    finally:
        LLAMA_SERVERS.stop_all()
    return results, wall, cmd


def time_split(prompt_ms: float, predicted_ms: float) -> dict:
    total = prompt_ms + predicted_ms
    return {"prompt_ms": round(prompt_ms), "predicted_ms": round(predicted_ms),
            "prompt_share": round(prompt_ms / total, 3) if total else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--member", default="qwen-coder-1.5b", help="a local pool member of params.yaml")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--roles", default="worker,thinker,verifier", help="stored roles to replay ('' = all)")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--store", default=str(ROOT / "data" / "store" / "trinity.duckdb"))
    ap.add_argument("--server-bin", default=str(server_binary()))
    ap.add_argument("--threads", type=int, default=2, help="llama-server -t")
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="llama-server -c is this x --concurrency")
    ap.add_argument("--cache-reuse", type=int, default=256, help="llama-server --cache-reuse")
    args = ap.parse_args()

    # SIGTERM ends the bench through the normal exit path, so the server is stopped (finally, below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    server_bin = Path(args.server_bin)
    if not os.access(server_bin, os.X_OK):
        print(f"no llama-server at {server_bin}: build it with `bash scripts/build_llama_server.sh`", file=sys.stderr)
        return 2
    settings = load_settings(args.params)
    members = {m.name: m for m in settings.pool.members}
    if args.member not in members or members[args.member].backend != "local":
        print(f"--member {args.member!r} is not a local member of {args.params} "
              f"(local: {[m.name for m in settings.pool.members if m.backend == 'local']})", file=sys.stderr)
        return 2
    model = LocalChatModel(members[args.member])
    roles = {r for r in args.roles.split(",") if r}
    requests = load_requests(Path(args.store), model.model_id, roles, args.requests)
    if not requests:
        print(f"no stored requests of {model.model_id} in roles {sorted(roles)} in {args.store}", file=sys.stderr)
        return 2
    print(f"[pool_throughput] {len(requests)} stored requests of {args.member} ({model.model_id[:60]}...), "
          f"concurrency {args.concurrency}", file=sys.stderr, flush=True)

    a_results, a_wall, a_perf = run_inprocess(model, requests, args.concurrency)
    a = summarise(a_results, a_wall)
    print(f"[pool_throughput] (a) in-process: {json.dumps(a)}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="trinity-bench-llama-server-") as tmp:
        spec = ServerSpec(binary=str(server_bin), gguf=str(model.gguf.path), ctx_per_slot=args.ctx_per_slot,
                          slots=args.concurrency, threads=args.threads, cache_reuse=args.cache_reuse)
        server = ServerProcess(spec, Path(tmp)).start()
        try:
            b_results, b_wall = run_server(server, model, requests, args.concurrency)
            start_s, cmd = server.start_s, spec.command(server.port)
        finally:
            server.stop()
    b = summarise(b_results, b_wall)
    print(f"[pool_throughput] (b) llama-server: {json.dumps(b)}", file=sys.stderr, flush=True)
    c_results, c_wall, c_cmd = run_pool_member(members[args.member], requests, args.concurrency)
    c = summarise(c_results, c_wall)
    print(f"[pool_throughput] (c) the pool's llama-server member: {json.dumps(c)}", file=sys.stderr, flush=True)

    timings = [r.timings for r in b_results if r.timings]
    b_split = time_split(sum(t.get("prompt_ms", 0.0) for t in timings), sum(t.get("predicted_ms", 0.0) for t in timings))
    b_split.update(prompt_n=sum(t.get("prompt_n", 0) for t in timings), cache_n=sum(t.get("cache_n", 0) for t in timings),
                   predicted_n=sum(t.get("predicted_n", 0) for t in timings), replies_with_timings=len(timings))
    a_split = time_split(a_perf["prompt_ms"], a_perf["predicted_ms"])
    a_split.update(prompt_n=a_perf["prompt_n"], predicted_n=a_perf["predicted_n"])

    rps_speedup = c["requests_per_s"] / a["requests_per_s"]
    tps_speedup = c["completion_tok_per_s"] / a["completion_tok_per_s"] if a["completion_tok_per_s"] else None
    identical = sum(x.ok and y.ok and x.text == y.text for x, y in zip(a_results, b_results))
    a_matches_store = sum(x.text == r.stored_text for x, r in zip(a_results, requests))
    same_prompt_tokens = sum(x.prompt_tokens == y.prompt_tokens for x, y in zip(a_results, b_results))
    errors = [e for e in ([x.error for x in a_results if not x.ok] + [y.error for y in b_results if not y.ok]
                          + [z.error for z in c_results if not z.ok]) if e]
    print(json.dumps({
        "name": "pool_throughput", "figure": round(rps_speedup, 3), "unit": "x requests/s",
        "goal": ">= 2.5x aggregate completion tokens/s (issue 26; detail.tok_per_s_speedup)",
        "compared_to": f"(c) the pool's llama-server member vs (a) in-process LocalChatModel (llama-cpp-python, "
                       f"one sequence at a time) on the same {len(requests)} stored requests of {args.member}, "
                       f"same concurrency, same run; (b) the bare server in detail",
        "detail": {
            "member": args.member, "model_id": model.model_id, "gguf": model.gguf.path.name,
            "requests": len(requests), "concurrency": args.concurrency,
            "roles": {r: sum(q.role == r for q in requests) for r in sorted({q.role for q in requests})},
            "tok_per_s_speedup": round(tps_speedup, 3) if tps_speedup else None,
            "latency_speedup": round(a["mean_latency_s"] / b["mean_latency_s"], 3) if b["mean_latency_s"] else None,
            "raw_server_tok_per_s_speedup": round(b["completion_tok_per_s"] / a["completion_tok_per_s"], 3)
            if a["completion_tok_per_s"] else None,
            "inprocess": {**a, "n_ctx": model.member.n_ctx, "n_threads": model.n_threads,
                          "time_split_llama_perf": a_split},
            "llama_server": {**b, "cmd": " ".join(Path(c).name if i in (0, 2) else c for i, c in enumerate(cmd)),
                             "start_s": round(start_s, 1), "time_split_timings": b_split},
            "pool_member": {**c, "cmd": c_cmd.replace("--port 0", "--port <free>")},
            "identical_replies_raw_vs_member": sum(y.text == z.text for y, z in zip(b_results, c_results)),
            "identical_replies": identical, "inprocess_replies_equal_to_store": a_matches_store,
            "same_prompt_token_count": same_prompt_tokens,
            "errors": errors[:5],
            "per_request": [{"role": q.role, "max_tokens": q.sampling.max_tokens,
                             "prompt_tokens": [x.prompt_tokens, y.prompt_tokens],
                             "completion_tokens": [x.completion_tokens, y.completion_tokens],
                             "latency_s": [round(x.latency_s, 1), round(y.latency_s, 1)],
                             "cache_n": (y.timings or {}).get("cache_n"), "identical": x.text == y.text}
                            for q, x, y in zip(requests, a_results, b_results)],
        }}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
