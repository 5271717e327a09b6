"""Answering a conversation with a trained coordinator: the one path `trinity ask`, `trinity serve` and
bench/serve_load.py all take.

- `trinity.serving.messages.task_from_messages`: an OpenAI-style message list → the `Task` an episode plays (the
  mapping: that module's doc).
- `Coordinator`: a checkpoint + params loaded once (pool, encoder, response store, head). `answer(task)` plays one
  argmax episode (the training loop, `play_episodes`); concurrent calls share the pool (stored or in-flight
  requests cost no call), the encoder and the store. A repeated conversation replays stored responses and states:
  no pool call, no encoding. Every episode's trace is kept in the store (`trinity.serving.traces`), for
  TRINITY_TRACE_RETENTION_DAYS when set.
  Threads: an episode's loop runs on a thread of its own (the encoder's forward passes would otherwise hold the
  caller's event loop, e.g. every other request of the server); its pool requests run on the process's HTTP loop
  (`trinity.pool.http_loop`), which alone owns the pool's calls (HTTP clients, in-flight calls, store writes), and
  encodes take turns on one lock.
- `StopSignal`: asks an episode, from any thread, to start no further turn (the server: its client left, its
  deadline passed, the server stops). Every turn starts with its state lookup (`play_episodes` step 1), which
  refuses once the signal is set; the turn in flight is not interrupted: its call finishes and is stored (a
  concurrent request may share it), so asking again replays it.
- `EpisodeResult`: the answer (`roles.latest_answer`), who gave it, the turns with their recorded usage, and its
  outcome: answered, a pool failure (no answer, and a member's call failed: the members and reasons), no answer
  (the coordinator ended the episode without a successful Worker turn), or cancelled (stopped by its
  `StopSignal` before its end: no answer, the turns it played are traced).
"""
from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from trinity.coordinator import policy
from trinity.records import ChatMessage, ChatResponse, Task, stable_hash
from trinity.serving.messages import ANSWER_FORMATS

if TYPE_CHECKING:
    from trinity.pool.runtime import Request

EPISODE_THREADS = 64
"""Episodes played at once (each waits on its pool calls most of the time); more wait for a thread."""


# ------------------------------------------------------------------------------------------ episodes
@dataclass(frozen=True)
class TurnRecord:
    """One pool call of an episode as the trace shows it. Tokens and latency are those recorded when the call
    was paid (a stored reply keeps its figures); `stored`: the response store already held the reply (else it
    is fresh: a new call, or one shared with a concurrent request asking the same). `finish_reason` of a reply:
    "length" when it reached the call's max_tokens, else "stop"; `failure` of a failed call: its kind
    (`ChatResponse.failure`: "transient" for an outage, "deterministic" when asking again gives the same)."""

    index: int
    model: str
    role: str
    ok: bool
    text: str
    verdict: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    stored: bool
    error: str | None = None
    finish_reason: str | None = None
    failure: str | None = None

    @classmethod
    def of(cls, index: int, model: str, role: str | None, resp: ChatResponse, stored: bool,
           max_tokens: int) -> "TurnRecord":
        """The record of `resp`, a reply to a call capped at `max_tokens` completion tokens."""
        verdict = None
        if role is not None and resp.ok:
            from trinity.coordinator.roles import Role, turn_of

            verdict = turn_of(model, Role(role), resp).verdict
        finish = ("length" if resp.completion_tokens >= max_tokens else "stop") if resp.ok else None
        return cls(index=index, model=model, role=role or "direct", ok=resp.ok, text=resp.text, verdict=verdict,
                   prompt_tokens=resp.prompt_tokens, completion_tokens=resp.completion_tokens,
                   latency_s=round(resp.latency_s, 3), stored=stored, error=None if resp.ok else resp.error,
                   finish_reason=finish, failure=resp.failure)

    def summary(self) -> dict:
        """The turn without its text (what the API returns and streams)."""
        return {"index": self.index, "model": self.model, "role": self.role, "ok": self.ok, "verdict": self.verdict,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "latency_s": self.latency_s, "stored": self.stored, "finish_reason": self.finish_reason,
                **({"error": self.error, "failure": self.failure} if not self.ok else {})}

    def as_dict(self) -> dict:
        return {**self.summary(), "text": self.text}


ANSWERED, POOL_FAILURE, NO_ANSWER, CANCELLED = "answered", "pool_failure", "no_answer", "cancelled"


class StopSignal:
    """A request, from any thread, that an episode start no further turn (`Coordinator.answer`). The first reason
    given is kept (it becomes the cancelled episode's reason)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._set = threading.Event()
        self.reason: str | None = None

    def stop(self, reason: str) -> None:
        with self._lock:
            if not self._set.is_set():
                self.reason = reason
                self._set.set()

    @property
    def stopped(self) -> bool:
        return self._set.is_set()


class _TurnRefused(Exception):
    """Raised on an episode's thread when its next turn would start after its `StopSignal` was set."""


@dataclass
class EpisodeResult:
    """What answering one conversation did (see the module doc for the outcomes)."""

    episode_id: str
    task: Task
    turns: list[TurnRecord]
    answer: str | None
    verifier_first: bool
    episode_s: float
    checkpoint: str
    answer_format: str
    max_tokens: int | None = None
    cancelled: str | None = None
    """Why the episode was stopped before its end (`StopSignal`): its remaining turns were not played, and it has
    no answer. None: it played to its end."""

    @property
    def answer_turn(self) -> TurnRecord | None:
        """The turn whose reply is the answer: the successful Worker turn the answer rule returned
        (`roles.returned_answer`; the latest with that text)."""
        if self.answer is None:
            return None
        return next((t for t in reversed(self.turns) if t.role == "worker" and t.ok and t.text == self.answer), None)

    @property
    def answered_by(self) -> str | None:
        """The member whose reply is the answer (None without one)."""
        turn = self.answer_turn
        return turn.model if turn is not None else None

    @property
    def finish_reason(self) -> str | None:
        """The answer's finish_reason: "length" when its Worker reply reached its max_tokens, else "stop"."""
        turn = self.answer_turn
        return turn.finish_reason if turn is not None else None

    @property
    def deterministic(self) -> bool:
        """Whether asking again gives the same outcome: no answer, not cancelled, and no call failed for an outage."""
        return self.outcome not in (ANSWERED, CANCELLED) and not any(
            t.failure == "transient" for t in self.turns if not t.ok)

    @property
    def failures(self) -> list[tuple[str, str]]:
        """(member, reason) of every failed call."""
        return [(t.model, t.error or "failed") for t in self.turns if not t.ok]

    @property
    def outcome(self) -> str:
        if self.cancelled is not None:
            return CANCELLED
        if self.answer is not None:
            return ANSWERED
        return POOL_FAILURE if self.failures else NO_ANSWER

    @property
    def reason(self) -> str | None:
        """Why there is no answer (None when there is one)."""
        if self.outcome == CANCELLED:
            return f"stopped after {len(self.turns)} turn(s): {self.cancelled}"
        if self.outcome == POOL_FAILURE:
            return "; ".join(f"pool member {m!r} failed: {why}" for m, why in self.failures)
        if self.outcome == NO_ANSWER:
            if self.verifier_first:
                return "the coordinator picked the Verifier before any Worker answered"
            return f"no Worker turn in {len(self.turns)} turn(s) (the coordinator's picks: " \
                   f"{', '.join(t.role for t in self.turns) or 'none'})"
        return None

    @property
    def usage(self) -> dict:
        """Tokens summed over every pool call of the episode (OpenAI `usage` shape)."""
        pt = sum(t.prompt_tokens for t in self.turns)
        ct = sum(t.completion_tokens for t in self.turns)
        return {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}

    def summary(self) -> dict:
        """The trace without texts (the API's `trinity` field)."""
        return {"episode_id": self.episode_id, "checkpoint": self.checkpoint, "answer_format": self.answer_format,
                **({"max_tokens": self.max_tokens} if self.max_tokens is not None else {}),
                "outcome": self.outcome, "finish_reason": self.finish_reason, "answered_by": self.answered_by,
                "reason": self.reason,
                "turns": [t.summary() for t in self.turns], "usage": self.usage,
                "fresh_replies": sum(not t.stored for t in self.turns),
                "stored_replies": sum(t.stored for t in self.turns),
                "episode_s": round(self.episode_s, 3)}

    def trace(self) -> dict:
        """The full trace (what the store keeps and `trinity trace` renders): the conversation and every text."""
        return {**self.summary(), "turns": [t.as_dict() for t in self.turns], "answer": self.answer,
                "conversation": {"history": [list(h) for h in self.task.history], "query": self.task.query}}


class _EpisodeStates:
    """The StateCache one episode reads on its thread: one lookup (and so one encode) at a time across episodes,
    and the episode's turn gate. Every turn starts with a lookup (`play_episodes` step 1: encode, then pick, then
    call), so once `stop` is set the lookup raises `_TurnRefused` — checked before the lock, after it and after the
    encode — and no further call of the episode is made."""

    def __init__(self, states, lock: threading.Lock, stop: StopSignal | None = None):
        self._states, self._lock, self._stop = states, lock, stop

    @property
    def dim(self) -> int:
        return self._states.dim

    def _gate(self) -> None:
        if self._stop is not None and self._stop.stopped:
            raise _TurnRefused(self._stop.reason)

    def lookup(self, keys, render, adapter=None):
        self._gate()
        with self._lock:
            self._gate()
            found = self._states.lookup(keys, render, adapter)
        self._gate()
        return found


def _ungraded(task: Task, answer: str) -> float:
    return 0.0  # a served conversation has no reference answer


class Coordinator:
    """A trained coordinator loaded to answer conversations: settings, pool, encoder, store and head, built once
    and shared by every request. Each episode plays on a thread of its own; the pool's calls run on the process's
    HTTP loop (module doc)."""

    def __init__(self, settings, checkpoint: policy.Policy, store, *, encoder=None, pool=None,
                 trace_retention_days: float | None = None):
        """`checkpoint`: the trained policy (`policy.Policy.load`), checked against `settings` and the encoder
        (`Policy.check`: a `policy.CheckpointError` when it does not fit them). `trace_retention_days`: how long the
        served conversations are kept in the store's `traces` table (0: forever; None: TRINITY_TRACE_RETENTION_DAYS,
        and forever when that is unset)."""
        from trinity.coordinator.role_sampling import RoleSampling
        from trinity.pool.runtime import build_pool
        from trinity.serving.traces import TraceLog, retention_days_from_env

        checkpoint.check(settings)  # before the pool and the encoder are built
        self.settings = settings
        self.store = store
        self.checkpoint = checkpoint
        self.pool = pool if pool is not None else build_pool(settings.pool, store)
        self.role_sampling = RoleSampling.of(settings)
        self.encoder = encoder if encoder is not None else policy.make_encoder(settings)
        checkpoint.check(settings, self.encoder)
        self.states = checkpoint.states(self.encoder, store)
        delta, self.head = checkpoint.split(settings, self.encoder)
        self.adapters = None if delta is None else [delta]
        self.checkpoint_path = str(checkpoint.path)
        self.checkpoint_id = stable_hash({
            "params": hashlib.sha256(np.ascontiguousarray(checkpoint.params, dtype=np.float64).tobytes()).hexdigest(),
            "features": checkpoint.meta.features, "encoder": self.encoder.encoder_id,
            "pool": repr(self.role_sampling.signature(self.pool)), "coordinator": settings.coordinator.model_dump()})[:16]
        if trace_retention_days is None:
            trace_retention_days = retention_days_from_env()
        self.traces = TraceLog(store, retention_days=trace_retention_days)  # pruned now and on each save
        self._owns_store = False
        self._states_lock = threading.Lock()
        self._episode_threads = ThreadPoolExecutor(max_workers=EPISODE_THREADS, thread_name_prefix="trinity-episode")

    @classmethod
    def load(cls, checkpoint: str | Path, params: str | Path, store_path: str | Path, *, writer: bool = True,
             encoder=None, trace_retention_days: float | None = None) -> "Coordinator":
        """Load params + checkpoint and open the store (closed by `close`, or at the end of a `with` block).
        writer=True: this process must be the store's writer (DuckDB: one writer process), else a RuntimeError;
        writer=False: a reader when another process writes it (`Store.open_or_read`: then what this process
        computes is not saved)."""
        from trinity.config import load_settings
        from trinity.store import Store
        from trinity.redact import register_pool

        settings = load_settings(params)
        register_pool(settings.pool)
        trained = policy.Policy.load(checkpoint)
        store = Store(store_path) if writer else Store.open_or_read(store_path)
        try:
            coordinator = cls(settings, trained, store, encoder=encoder, trace_retention_days=trace_retention_days)
        except BaseException:
            store.close()
            raise
        coordinator._owns_store = True
        return coordinator

    def close(self) -> None:
        """Close the trace log, and the store when `load` opened it."""
        self._episode_threads.shutdown(wait=True)
        self.traces.close()
        if self._owns_store:
            self.store.close()

    def __enter__(self) -> "Coordinator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def episode_id(self, task: Task, max_tokens: int | None = None) -> str:
        """The same conversation asked of the same coordinator (with the same answer cap) has the same id (its
        replay is the same episode)."""
        ident = {"checkpoint": self.checkpoint_id, "history": task.history, "query": task.query, "grader": task.grader}
        if max_tokens is not None:
            ident["max_tokens"] = max_tokens
        return "ep-" + stable_hash(ident)[:16]

    def _role_sampling_for(self, max_tokens: int | None):
        """What each role asks of a member, with every answer capped at `max_tokens` when it is set
        (`RoleSampling.answers_capped`)."""
        return self.role_sampling if max_tokens is None else self.role_sampling.answers_capped(max_tokens)

    async def answer(self, task: Task, on_turn: Callable[[TurnRecord], None] | None = None,
                     max_tokens: int | None = None, stop: StopSignal | None = None) -> EpisodeResult:
        """Play one argmax episode for `task`; `on_turn` sees each turn as its reply arrives. The trace is saved.
        `max_tokens`: caps every Worker answer of the episode (a member's own lower cap still applies).
        `stop`: once set, the episode starts no further turn and ends as CANCELLED (the turn in flight finishes
        and is stored; the trace keeps the turns played)."""
        from trinity.coordinator.episode import Episode, play_episodes
        from trinity.coordinator.roles import allowed_roles

        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        records: list[TurnRecord] = []
        pool, role_sampling = self.pool, self._role_sampling_for(max_tokens)

        def on_reply(r: Request, resp: ChatResponse, stored: bool) -> None:  # on the episode's thread
            rec = TurnRecord.of(len(records), pool.names[r.idx], r.label, resp, stored, r.sampling.max_tokens)
            records.append(rec)
            if on_turn is not None:
                loop.call_soon_threadsafe(on_turn, rec)

        ep = Episode(task=task, candidate=0, rng=None)
        states = _EpisodeStates(self.states, self._states_lock, stop)

        def play() -> None:  # the episode's requests run on the pool's HTTP loop; its replies are traced
            with pool.observe(on_reply):
                asyncio.run(play_episodes([ep], [self.head], pool, states, self.settings.coordinator.max_turns,
                                          self.settings.reward, _ungraded, adapters=self.adapters,
                                          roles=allowed_roles(self.settings.coordinator),
                                          answer_rule=self.settings.coordinator.answer_rule,
                                          role_sampling=role_sampling))

        cancelled = None
        try:
            await loop.run_in_executor(self._episode_threads, play)
        except _TurnRefused as refused:
            cancelled = str(refused)
        fmt = next(k for k, v in ANSWER_FORMATS.items() if v == task.grader)
        result = EpisodeResult(episode_id=self.episode_id(task, max_tokens), task=task, turns=records,
                               answer=None if cancelled is not None else ep.answer, verifier_first=ep.verifier_first,
                               episode_s=time.perf_counter() - t0, checkpoint=self.checkpoint_id, answer_format=fmt,
                               max_tokens=max_tokens, cancelled=cancelled)
        self.traces.save(result.trace())
        return result

    def member_index(self, name: str) -> int | None:
        return self.pool.names.index(name) if name in self.pool.names else None

    async def ask_member(self, name: str, messages: Sequence[ChatMessage], max_tokens: int | None = None) -> TurnRecord:
        """One call to pool member `name`, bypassing the coordinator (through the response store all the same);
        `max_tokens` caps its reply (the member's own lower cap still applies)."""
        idx = self.member_index(name)
        if idx is None:
            raise KeyError(name)
        request = self._role_sampling_for(max_tokens).request(self.pool, idx, messages, None)  # a direct call
        turns: list[TurnRecord] = []
        with self.pool.observe(lambda r, resp, stored: turns.append(
                TurnRecord.of(0, name, None, resp, stored, request.sampling.max_tokens))):
            await self.pool.complete_many([request])
        return turns[0]


def answer_now(coordinator: Coordinator, task: Task) -> EpisodeResult:
    """`Coordinator.answer` from synchronous code (the CLI), on a fresh event loop."""
    return asyncio.run(coordinator.answer(task))

