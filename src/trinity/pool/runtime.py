"""The pool at run time: members + the response store. Every call goes through `Pool.complete`.

- A stored response is returned without a call (the stored sample *is* the sample for that prompt: common
  random numbers across CMA-ES candidates).
- Identical requests in flight at the same time share one call.
- Every real call is counted (`calls_made`) and stored, failures included, so a rerun pays for nothing twice.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from trinity.config import PoolMember, PoolSettings
from trinity.pool.base import ChatModel
from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.store import Store, response_key


@dataclass
class PoolStats:
    calls_made: int = 0
    store_hits: int = 0
    failures: int = 0
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls_by_model: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["calls_by_model"] = dict(self.calls_by_model)
        return d


class Pool:
    def __init__(self, members: Sequence[ChatModel], settings: Sequence[PoolMember], store: Store | None,
                 role_max_tokens: dict[str, int] | None = None):
        if len(members) != len(settings):
            raise ValueError("one PoolMember setting per member")
        self.members = list(members)
        self.settings = list(settings)
        self.store = store
        self.stats = PoolStats()
        self.role_max_tokens = dict(role_max_tokens or {})
        self._inflight: dict[str, asyncio.Future] = {}

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    def __len__(self) -> int:
        return len(self.members)

    def sampling(self, idx: int, role: str | None = None) -> SamplingParams:
        s = self.settings[idx]
        cap = self.role_max_tokens.get(role or "")
        return SamplingParams(temperature=s.temperature, top_p=s.top_p,
                              max_tokens=min(s.max_tokens, cap) if cap else s.max_tokens, seed=0)

    def key(self, idx: int, messages: Sequence[ChatMessage], role: str | None = None) -> str:
        return response_key(self.members[idx].model_id, messages, self.sampling(idx, role))

    async def complete(self, idx: int, messages: Sequence[ChatMessage], role: str | None = None) -> ChatResponse:
        key = self.key(idx, messages, role)
        sampling = self.sampling(idx, role)
        if self.store is not None:
            hit = self.store.get_response(key)
            if hit is not None:
                self.stats.store_hits += 1
                return hit
        if key in self._inflight:
            self.stats.store_hits += 1
            return await asyncio.shield(self._inflight[key])
        fut = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            member = self.members[idx]
            resp = await member.chat(messages, sampling)
            s = self.settings[idx]
            if resp.cost_usd == 0.0 and (s.price_input_per_mtok or s.price_output_per_mtok):
                resp = ChatResponse(**{**resp.__dict__, "cost_usd": (
                    resp.prompt_tokens * s.price_input_per_mtok + resp.completion_tokens * s.price_output_per_mtok) / 1e6})
            self.stats.calls_made += 1
            self.stats.calls_by_model[member.name] += 1
            self.stats.failures += 0 if resp.ok else 1
            self.stats.cost_usd += resp.cost_usd
            self.stats.prompt_tokens += resp.prompt_tokens
            self.stats.completion_tokens += resp.completion_tokens
            if self.store is not None:
                self.store.put_response(key, member.model_id, role, messages, sampling, resp)
            fut.set_result(resp)
            return resp
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # mark retrieved
            raise
        finally:
            del self._inflight[key]


def build_members(pool: PoolSettings) -> list[ChatModel]:
    """Instantiate every configured member. Fails before any work on an unknown backend or missing key."""
    members: list[ChatModel] = []
    global_limit = asyncio.Semaphore(pool.max_concurrency)
    for m in pool.members:
        if m.backend == "local":
            from trinity.pool.local import LocalChatModel

            members.append(LocalChatModel(m))
        elif m.backend == "openai":
            from trinity.pool.openai_compat import OpenAICompatibleChatModel

            members.append(OpenAICompatibleChatModel(m, global_limit))
        else:  # config validation already restricts this; kept for direct callers
            raise ValueError(f"pool member {m.name!r}: unknown backend {m.backend!r}")
    return members


def build_pool(pool: PoolSettings, store: Store | None, role_max_tokens: dict[str, int] | None = None) -> Pool:
    return Pool(build_members(pool), pool.members, store, role_max_tokens)
