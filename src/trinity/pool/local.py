"""Local pool members: GGUF models run in-process with llama-cpp-python.

A model file is loaded once per process (shared by every member that names it). Calls run in a worker
thread (asyncio.to_thread) so the event loop never blocks; one lock per loaded model serialises calls,
since a llama.cpp context is not thread-safe and the CPU is the bottleneck anyway.
"""
from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Sequence

from trinity.config import PoolMember
from trinity.pool.bundled import BUNDLED, resolve_gguf
from trinity.records import ChatMessage, ChatResponse, SamplingParams

_LOADED: dict[tuple[str, int, int], tuple[object, threading.Lock]] = {}
_LOAD_LOCK = threading.Lock()
LOADS: list[str] = []
"""Every model load of this process, in order (a process loads each (file, n_ctx, n_threads) once)."""


def load_llama(path: Path, n_ctx: int, n_threads: int):
    """The process-wide llama.cpp instance for a GGUF file (loaded on first use)."""
    key = (str(path), n_ctx, n_threads)
    with _LOAD_LOCK:
        if key not in _LOADED:
            from llama_cpp import Llama  # imported lazily: compiling it is part of setup, not of import

            llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                        verbose=False, seed=0)
            _LOADED[key] = (llm, threading.Lock())
            LOADS.append(path.name)
        return _LOADED[key]


def completion_prompt(messages: Sequence[ChatMessage]) -> str:
    """Few-shot completion prompt for base (non-chat) models: the instruction, one worked example of the
    format, then the task with an open 'Answer:' for the model to continue."""
    system = " ".join(m.content for m in messages if m.role == "system")
    convo = "\n\n".join(f"{'Question' if m.role == 'user' else 'Answer'}: {m.content}"
                        for m in messages if m.role != "system")
    example = ("Question: What is 12 + 30? Put the final answer in \\boxed{}.\n\n"
               "Answer: 12 + 30 = 42, so the answer is \\boxed{42}.")
    return f"{system}\n\n{example}\n\n{convo}\n\nAnswer:"


class LocalChatModel:
    """A pool member backed by a local GGUF file (bundled id or path)."""

    def __init__(self, member: PoolMember):
        self.member = member
        self.name = member.name
        self.path = resolve_gguf(member.model)
        spec = BUNDLED.get(member.model)
        self.model_id = f"gguf:{spec.id if spec else self.path.name}"
        self.completion_style = member.prompt_style == "completion" or (spec is not None and not spec.chat)

    def _generate(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        llm, lock = load_llama(self.path, self.member.n_ctx, self.member.n_threads)
        t0 = time.perf_counter()
        with lock:
            # Evaluate every prompt from a clean context: reusing the previous call's KV prefix changes the
            # batch layout and, through float rounding, can change a sampled token. A stored response must
            # be exactly what a fresh process would produce (resume = uninterrupted run).
            llm.reset()
            if self.completion_style:
                out = llm.create_completion(
                    completion_prompt(messages), max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                    top_p=sampling.top_p, seed=sampling.seed, stop=["\n\nQuestion:"])
                text = out["choices"][0]["text"]
            else:
                out = llm.create_chat_completion(
                    messages=[{"role": m.role, "content": m.content} for m in messages],
                    max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                    seed=sampling.seed)
                text = out["choices"][0]["message"]["content"] or ""
        usage = out.get("usage") or {}
        ok = bool(text.strip())
        return ChatResponse(text=text, ok=ok, error=None if ok else "empty reply",
                            prompt_tokens=int(usage.get("prompt_tokens", 0)),
                            completion_tokens=int(usage.get("completion_tokens", 0)),
                            latency_s=time.perf_counter() - t0, model=self.model_id)

    def generate(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        """The blocking call (what `chat` runs on a worker thread); never raises for model-side failures."""
        try:
            return self._generate(messages, sampling)
        except Exception as e:  # a model-side failure is a failed call, not a crash
            return ChatResponse(text="", ok=False, error=f"{type(e).__name__}: {e}", model=self.model_id)

    async def chat(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        return await asyncio.to_thread(self.generate, messages, sampling)
