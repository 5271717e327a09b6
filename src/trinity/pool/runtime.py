"""The pool at run time: members + the response store. Every call goes through `Pool.complete_many`
(`Pool.complete` is the one-request case): one store lookup per request, one concurrency limit.

- A stored response is returned without a call (the stored sample *is* the sample for that prompt: common
  random numbers across CMA-ES candidates).
- Identical requests in one batch, or in flight at the same time, share one call.
- The requests left — never-seen nodes — are handed together to the pool's `Executor`, chosen when the pool is
  built (`build_pool(..., executor=)`): in process (`InProcessExecutor`, the default: HTTP members on the
  pool's HTTP loop — local models served by llama-server among them —, local models run in process on asyncio
  worker threads), or through a Prefect task runner
  (`trinity.pool.task_runner.TaskRunnerExecutor`: threads, or Dask worker processes). Whatever runs them,
  responses come back to this process, which alone writes the store (DuckDB: one writer).
- Concurrency: the pool's `ConcurrencyLimits` (`pool.max_concurrency` in all, `member.max_concurrency` per HTTP
  member), shared by the members and the task-runner executor (`trinity.pool.base`).
- Every real call is counted (`calls_made`, `failures`, cost) and recorded as soon as it returns. A sample
  (a reply, or a deterministic failure) is stored as *the* answer to its request, so a rerun pays for
  nothing twice; an outage (transient failure) is logged but not served: the next run asks again
  (`trinity.store` module doc).
- Where the calls run: on the process's HTTP loop (`trinity.pool.http_loop`), a loop on a thread of its own where
  nothing slow runs, whatever loop or thread asks. The callers' slow work (encoding, grading) then never stalls a
  connection (a stall over llama-server's 5 s keep-alive timeout killed it) nor a call's measured seconds. Callers
  see every reply as it is returned (`Pool.observe`: the reply, and whether the store held it), in their own
  context.
- What a request asks of a member's sampling is the caller's to say (`Ask`: a cap on the member's max_tokens and an
  output format, or a ready `SamplingParams`); the pool resolves it against the member's own settings and keys the
  request by the result. A request's `label` (what the caller calls it) is recorded beside the response and never
  read.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterator, NamedTuple, Protocol, Sequence

from trinity.config import PoolMember, PoolSettings
from trinity.pool.base import ChatModel, LoopLocalSemaphore
from trinity.pool.http_loop import run_on_http_loop
from trinity.pool.llama_server import with_thread_budget
from trinity.pool.members import build_member, over_http
from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.store import REPLAY_ENV, ReplayMiss, Store, replay_only, response_key


@dataclass
class PoolStats:
    calls_made: int = 0
    store_hits: int = 0
    failures: int = 0
    transient_failures: int = 0
    """Outages among `failures`: recorded and priced, not stored as answers (the next run asks again)."""
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls_by_model: Counter = field(default_factory=Counter)

    def count_call(self, member: str, resp: ChatResponse) -> None:
        """One real call to `member` and its reply."""
        self.calls_made += 1
        self.calls_by_model[member] += 1
        self.failures += 0 if resp.ok else 1
        self.transient_failures += 1 if resp.failure == "transient" else 0
        self.cost_usd += resp.cost_usd
        self.prompt_tokens += resp.prompt_tokens
        self.completion_tokens += resp.completion_tokens

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["calls_by_model"] = dict(self.calls_by_model)
        return d


class Ask(NamedTuple):
    """What a caller asks of a member's sampling (`Pool.sampling`): a cap on the member's own max_tokens (None or
    0: the member's), and the output format its reply must have (`SamplingParams.output_format`; None: free text).
    Temperature, top_p and the seed stay the member's."""

    max_tokens: int | None = None
    output_format: str | None = None


class Request(NamedTuple):
    """One pool request (`Pool.request`): member index, the caller's label (recorded with the response, never
    read), store key, messages, and the sampling it is asked with."""

    idx: int
    label: str | None
    key: str
    messages: Sequence[ChatMessage]
    sampling: SamplingParams


class Executor(Protocol):
    """Runs the requests no store row or in-flight call answers (never-seen nodes), all of one step.
    Yields (position in `requests`, response) as each call finishes; never touches the store."""

    def expand(self, pool: "Pool", requests: Sequence[Request]) -> AsyncIterator[tuple[int, ChatResponse]]: ...


class InProcessExecutor:
    """Every request as a coroutine of the member in this process (local models run on asyncio worker
    threads, one call at a time per loaded model; HTTP members share this event loop and take their slots of
    the pool's limits while on the wire)."""

    async def expand(self, pool: "Pool", requests: Sequence[Request]) -> AsyncIterator[tuple[int, ChatResponse]]:
        async def one(j: int, r: Request):
            return j, await pool.members[r.idx].chat(r.messages, r.sampling)

        for fut in asyncio.as_completed([one(j, r) for j, r in enumerate(requests)]):
            yield await fut


OnReply = Callable[[Request, ChatResponse, bool], None]
"""An observer of replies (`Pool.observe`): the request, its reply, and whether the response store held it (else
it is fresh: a new call, or one shared with an identical request of the batch or in flight)."""


class Pool:
    """Members + settings + the response store, the executor of never-seen requests (fixed at construction) and
    the concurrency limits (`limits`: the ones its members were built with; default: `member.max_concurrency`
    per HTTP member, no pool-wide cap)."""

    def __init__(self, members: Sequence[ChatModel], settings: Sequence[PoolMember], store: Store | None,
                 executor: Executor | None = None, limits: ConcurrencyLimits | None = None):
        if len(members) != len(settings):
            raise ValueError("one PoolMember setting per member")
        self.members = list(members)
        self.settings = list(settings)
        self.store = store
        self.stats = PoolStats()
        self._executor: Executor = executor or InProcessExecutor()
        self.limits = limits if limits is not None else ConcurrencyLimits(None, self.settings)
        self._inflight: dict[str, asyncio.Future] = {}
        self._sampling: dict[tuple[int, Ask], SamplingParams] = {}
        self._names: list[str] = [m.name for m in self.members]
        self._caller: contextvars.ContextVar[_Caller] = contextvars.ContextVar(f"pool-caller-{id(self)}",
                                                                               default=_Caller())

    @property
    def executor(self) -> Executor:
        """What runs the never-seen requests (chosen when the pool is built)."""
        return self._executor

    @property
    def names(self) -> list[str]:
        names = [m.name for m in self.members]
        if names != self._names:  # (members is a plain list; rebuild if someone swapped one)
            self._names = names
        return self._names

    def __len__(self) -> int:
        return len(self.members)

    def sampling(self, idx: int, ask: Ask | SamplingParams = Ask()) -> SamplingParams:
        """Member `idx`'s sampling settings under what the caller asks: its temperature and top_p, seed 0, its
        max_tokens capped at `ask.max_tokens`, and `ask.output_format`. A ready `SamplingParams` is taken as is."""
        if isinstance(ask, SamplingParams):
            return ask
        sp = self._sampling.get((idx, ask))
        if sp is None:
            s, cap = self.settings[idx], ask.max_tokens
            sp = self._sampling[(idx, ask)] = SamplingParams(
                temperature=s.temperature, top_p=s.top_p, max_tokens=min(s.max_tokens, cap) if cap else s.max_tokens,
                seed=0, output_format=ask.output_format)
        return sp

    def signature(self, asks: Sequence[Ask]) -> tuple:
        """What the response keys of requests asking `asks` depend on: member names, model ids, what else shapes
        each member's replies (`request_identity` of an empty request, per ask), and the sampling of each ask."""
        return tuple((m.name, m.model_id, tuple(repr(self._identity(i, (), self.sampling(i, a))) for a in asks),
                      tuple(self.sampling(i, a) for a in asks))
                     for i, m in enumerate(self.members))

    def _identity(self, idx: int, messages: Sequence[ChatMessage], sampling: SamplingParams) -> dict | None:
        identity = getattr(self.members[idx], "request_identity", None)
        return identity(messages, sampling) if identity is not None else None

    def request(self, idx: int, messages: Sequence[ChatMessage], ask: Ask | SamplingParams = Ask(),
                label: str | None = None) -> Request:
        """The request of `messages` to member `idx` under `ask` (`sampling`), keyed for the response store: model
        id, messages, sampling, and whatever else the member says shapes its reply (`request_identity`: a local
        member's file hash, rendered prompt, context, the grammar or response_format of a constrained output
        format...). `label` is recorded with the response (`Store.put_response`) and shapes nothing."""
        sampling = self.sampling(idx, ask)
        key = response_key(self.members[idx].model_id, messages, sampling, self._identity(idx, messages, sampling))
        return Request(idx, label, key, messages, sampling)

    def key(self, idx: int, messages: Sequence[ChatMessage], ask: Ask | SamplingParams = Ask()) -> str:
        """The response-store key of `request(idx, messages, ask)`."""
        return self.request(idx, messages, ask).key

    async def complete(self, idx: int, messages: Sequence[ChatMessage], ask: Ask | SamplingParams = Ask(),
                       label: str | None = None) -> ChatResponse:
        return (await self.complete_many([self.request(idx, messages, ask, label)]))[0]

    @contextlib.contextmanager
    def observe(self, on_reply: OnReply) -> Iterator[None]:
        """Within the block, in this context (this thread, or this task and the tasks it starts), every reply
        `complete_many` returns is also reported to `on_reply` (the request, the reply, whether the store held
        it), in request order, before `complete_many` returns: serving's per-episode trace and streaming."""
        caller = self._caller.get()
        token = self._caller.set(_Caller(caller.observers + (on_reply,), caller.tallies))
        try:
            yield
        finally:
            self._caller.reset(token)

    @contextlib.contextmanager
    def tally(self) -> Iterator[PoolStats]:
        """Within the block, in this context (this task and the tasks it starts): the calls it pays and the
        lookups it is spared are also counted in the `PoolStats` yielded, as in `stats` — a call shared by
        requests in flight together counts for the caller that started it, a hit for each request it served.
        Evaluation runs its methods at the same time and accounts each one's calls this way."""
        caller = self._caller.get()
        mine = PoolStats()
        token = self._caller.set(_Caller(caller.observers, caller.tallies + (mine,)))
        try:
            yield mine
        finally:
            self._caller.reset(token)

    async def complete_many(self, requests: Sequence[Request | tuple]) -> list[ChatResponse]:
        """Responses to `requests` (in order): stored ones from the store, repeated or in-flight ones shared,
        and the never-seen rest expanded together by `self.executor`. Runs on the process's HTTP loop
        (`trinity.pool.http_loop`) whatever loop or thread calls it; reports every reply to the observers of
        `observe`, on the caller's side."""
        caller = self._caller.get()
        out, stored = await run_on_http_loop(self._complete_many(requests, caller.tallies))
        for on_reply in caller.observers:
            for r, resp, s in zip(requests, out, stored):
                on_reply(Request(*r), resp, s)
        return out

    async def _complete_many(self, requests: Sequence[Request | tuple],
                             tallies: tuple[PoolStats, ...] = ()) -> tuple[list[ChatResponse], list[bool]]:
        """complete_many's work: (responses, whether each came from the store), counted in `stats` and `tallies`."""
        store = self.store
        out: list[ChatResponse | None] = [None] * len(requests)
        stored = [False] * len(requests)
        fresh: dict[str, list[int]] = {}
        waits: list[tuple[int, asyncio.Future]] = []
        hits = 0
        for i, r in enumerate(requests):
            key = r[2]
            if store is not None:
                hit = store.get_response(key)
                if hit is not None:
                    hits += 1
                    out[i] = hit
                    stored[i] = True
                    continue
            if key in fresh:
                hits += 1
                fresh[key].append(i)
                continue
            fut = self._inflight.get(key)
            if fut is not None:
                hits += 1
                waits.append((i, fut))
                continue
            fresh[key] = [i]
        for stats in (self.stats, *tallies):
            stats.store_hits += hits
        if fresh:
            await self._expand([Request(*requests[ix[0]]) for ix in fresh.values()], list(fresh.values()), out,
                               tallies)
        for i, fut in waits:
            out[i] = await asyncio.shield(fut)
        return out, stored  # type: ignore[return-value]

    async def _expand(self, todo: list[Request], positions: list[list[int]], out: list,
                      tallies: tuple[PoolStats, ...] = ()) -> None:
        if replay_only():
            r = todo[0]
            raise ReplayMiss(f"replay ({REPLAY_ENV}=1): {len(todo)} request(s) not in the store, e.g. "
                             f"{self.names[r.idx]} as {r.label or 'direct'} (key {r.key[:16]}): the imported segments "
                             f"do not hold the run being replayed, or the code or settings changed what it asks")
        loop = asyncio.get_running_loop()
        progress = _BatchProgress(len(todo), self.stats)
        futs = []
        for r in todo:
            fut = loop.create_future()
            self._inflight[r.key] = fut
            futs.append(fut)
        try:
            async for j, resp in self._executor.expand(self, todo):
                resp = self._record(todo[j], resp, tallies)
                progress.done_one()
                futs[j].set_result(resp)
                for i in positions[j]:
                    out[i] = resp
            missing = [todo[j].key for j, f in enumerate(futs) if not f.done()]
            if missing:
                raise RuntimeError(f"pool executor returned no response for {len(missing)} request(s)")
        except BaseException as e:
            for f in futs:
                if not f.done():
                    f.set_exception(e)
                    f.exception()  # mark retrieved
            raise
        finally:
            for r in todo:
                self._inflight.pop(r.key, None)

    def _record(self, r: Request, resp: ChatResponse, tallies: tuple[PoolStats, ...] = ()) -> ChatResponse:
        """Price, count (in `stats` and `tallies`) and store one real call (in this process: the store's only
        writer)."""
        member, s = self.members[r.idx], self.settings[r.idx]
        if resp.cost_usd == 0.0 and (s.price_input_per_mtok or s.price_output_per_mtok):
            resp = ChatResponse(**{**resp.__dict__, "cost_usd": (
                resp.prompt_tokens * s.price_input_per_mtok + resp.completion_tokens * s.price_output_per_mtok) / 1e6})
        for stats in (self.stats, *tallies):
            stats.count_call(member.name, resp)
        if self.store is not None:
            self.store.put_response(r.key, member.model_id, r.label, r.messages, r.sampling, resp)
        return resp


@dataclass(frozen=True)
class _Caller:
    """What `Pool.observe` and `Pool.tally` set for a context: its reply observers, the stats its calls are also
    counted in."""

    observers: tuple[OnReply, ...] = ()
    tallies: tuple[PoolStats, ...] = ()


PROGRESS_EVERY_S = 20.0
"""A batch of new calls that runs longer than this reports its progress at this interval (stderr)."""


class _BatchProgress:
    """A progress line for a long batch of new calls (a generation's never-seen nodes can take many minutes on
    a CPU): calls done in the batch, calls paid, failures and store hits so far, and the batch's ETA. Printed
    to stderr, so it reaches the terminal under `dvc repro` and Prefect alike."""

    def __init__(self, n: int, stats: PoolStats):
        self.n, self.stats, self.done = n, stats, 0
        self.t0 = self.last = time.monotonic()

    def done_one(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S or self.done == self.n:
            return
        self.last = now
        s = self.stats
        eta = (now - self.t0) / self.done * (self.n - self.done)
        print(f"[pool] {self.done}/{self.n} new calls of this batch, ETA {eta:.0f}s; so far {s.calls_made} calls "
              f"paid ({s.failures} failed, {s.transient_failures} outages), {s.store_hits} store hits",
              file=sys.stderr, flush=True)


class ConcurrencyLimits:
    """The pool's one concurrency limit: at most `pool.max_concurrency` calls in flight in all (`total`), and at
    most `member.max_concurrency` per member called over HTTP (`per_member[idx]`: an OpenAI-compatible member, or a
    local member served by llama-server, whose slots it is; None for a local member run in process, whose calls a
    lock per loaded model already serialises: one at a time per model and process).

    The same semaphores serve every path (`build_members` hands them to the HTTP members; the task-runner
    executor acquires them per submitted request):
    - in process, an HTTP member holds its slots only while a request is on the wire, never while backing off
      (`trinity.pool.openai_compat`);
    - through a task runner (Prefect threads, Dask workers), the main process holds a request's slots from
      submission until its reply is back, so the limits hold across every worker process (a worker does not
      know what the others run)."""

    def __init__(self, total: int | None, members: Sequence["PoolMember"]):
        self.total = LoopLocalSemaphore(total) if total else None
        self.per_member: list[LoopLocalSemaphore | None] = [
            LoopLocalSemaphore(m.max_concurrency) if over_http(m) else None for m in members]

    @contextlib.asynccontextmanager
    async def slot(self, idx: int) -> AsyncIterator[None]:
        """Member `idx`'s slot, then one of the pool-wide slots (the order HTTP members take them in)."""
        member = self.per_member[idx]
        async with (member.get() if member is not None else contextlib.nullcontext()), \
                (self.total.get() if self.total is not None else contextlib.nullcontext()):
            yield


def build_members(pool: PoolSettings, limits: ConcurrencyLimits | None = None) -> list[ChatModel]:
    """Instantiate every configured member, HTTP members under `limits` (default: new ones from `pool`), llama-server
    members with their share of the cores (`with_thread_budget`). Fails before any work on an unknown backend or
    missing key."""
    members: list[ChatModel] = []
    pool = with_thread_budget(pool)
    limits = limits if limits is not None else ConcurrencyLimits(pool.max_concurrency, pool.members)
    for i, m in enumerate(pool.members):
        members.append(build_member(m, limits.total, limits.per_member[i]))
    return members


def build_pool(pool: PoolSettings, store: Store | None, executor: Executor | None = None) -> Pool:
    """The pool of `pool`'s members over `store`. executor: what runs never-seen requests (default: in process;
    `trinity.pool.task_runner.executor_for` picks the task runner of `pool.task_runner`)."""
    pool = with_thread_budget(pool)  # the settings a task runner's workers get name the threads too
    limits = ConcurrencyLimits(pool.max_concurrency, pool.members)
    return Pool(build_members(pool, limits), pool.members, store, executor, limits)
