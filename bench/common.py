"""What several benches share: a run's stored requests, asked again through a fresh pool.

- `stored_requests`: the first n successful requests a run made (every member of the pool, roles worker / thinker /
  verifier, in the order they were made), read from its store opened read-only, each with the reply the run got.
- `replay`: those requests through a pool built from the given settings with no store, all at once behind the pool's
  own concurrency limits (`pool.max_concurrency` in flight, as a generation keeps them), from fresh servers or
  freshly loaded models, stopped again after.

Used by bench.local_engines (throughput per engine) and bench.engine_determinism (identical replies between
two fresh replays). Not a bench itself.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path


from trinity.config import PoolSettings
from trinity.coordinator.role_sampling import RoleSampling
from trinity.pool.llama_server import LLAMA_SERVERS
from trinity.pool.runtime import build_pool
from trinity.records import ChatMessage, SamplingParams
from trinity.store import Store

ROLES = ("worker", "thinker", "verifier")

StoredRequest = tuple[int, str, list[ChatMessage], SamplingParams, str]  # member index, role, messages, sampling, reply


def stored_requests(store_path: Path, pool, n: int, any_engine: bool = False,
                    members: set[str] | None = None) -> list[StoredRequest]:
    """(member index, role, messages, sampling, stored reply) of the first `n` ok requests this pool made (any_engine:
    also those its members' weights answered with other settings or another engine; members: only these members'
    requests, by name). The MT-Bench judge's calls (role "judge") are left out."""
    by_model = {m.model_id: i for i, m in enumerate(pool.members)}
    with Store(store_path, read_only=True) as store:
        rows = store.con.execute("SELECT key, model_id, role, messages, sampling, text FROM responses WHERE ok "
                                 "ORDER BY created_at, key").fetchall()
    out = []
    for key, model_id, role, messages, sampling, text in rows:
        idx = by_model.get(model_id)
        if idx is None or role not in ROLES or (members and pool.members[idx].name not in members):
            continue
        msgs = [ChatMessage(r, c) for r, c in json.loads(messages)]
        if not any_engine and RoleSampling().key(pool, idx, msgs, role) != key:
            continue  # made with other settings or another engine
        out.append((idx, role, msgs, SamplingParams(**json.loads(sampling)), text))
        if len(out) == n:
            break
    return out


@dataclass(frozen=True)
class Replayed:
    replies: list  # the members' ChatReply per request, in request order
    wall_s: float  # from the first request sent to the last reply (after the warm-up, if any)
    threads: list[int]  # threads per llama-server process (or per in-process model)

    @property
    def texts(self) -> list[str]:
        return [r.text for r in self.replies]

    @property
    def completion_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.replies)

    @property
    def failed(self) -> list[str]:
        return [r.error for r in self.replies if not r.ok]


def replay(pool_settings: PoolSettings, requests: list[StoredRequest], warm_up: bool = False) -> Replayed:
    """Every request through a fresh pool (no store, servers started anew: empty slots and prompt caches).
    warm_up: one untimed two-token call per member used first, so server start and model load are off the clock
    (throughput); without it the clock includes them and the first calls meet cold servers (as a fresh run does)."""
    LLAMA_SERVERS.stop_all()
    pool = build_pool(pool_settings, None)
    used = sorted({r[0] for r in requests})

    async def warm():
        await asyncio.gather(*(pool.members[i].chat([ChatMessage("user", "Hi")],
                                                     SamplingParams(temperature=0.0, max_tokens=2)) for i in used))

    async def ask_all():
        return await asyncio.gather(*(pool.members[i].chat(m, s) for i, _, m, s, _ in requests))

    try:
        if warm_up:
            asyncio.run(warm())
        t0 = time.perf_counter()
        replies = asyncio.run(ask_all())
        wall = time.perf_counter() - t0
        threads = sorted({s.spec.threads for s in LLAMA_SERVERS.running()}) or sorted(
            {getattr(pool.members[i], "n_threads", None) for i in used})
    finally:
        LLAMA_SERVERS.stop_all()
    out = Replayed(list(replies), wall, threads)
    if out.failed:
        print(f"[bench] {len(out.failed)} failed replies, e.g. {out.failed[0]}", file=sys.stderr)
    return out
