"""Local pool members run in process with llama-cpp-python (`PoolMember.engine: in-process`), and what every local
member shares whatever runs it (`GGUFModel`, which both local members hold): the GGUF's identity, the completion
prompt of base models, the verdict grammar. The default engine, llama.cpp's own server, is `trinity.pool.llama_server`.

A model file is loaded once per process (`LLAMA_MODELS`, shared by every member that names it). Calls run
in a worker thread (asyncio.to_thread) so the event loop never blocks; one lock per loaded model serialises
calls, since a llama.cpp context is not thread-safe and the CPU is the bottleneck anyway.

A stored response must be the answer to the same question, so what keys a local member's responses
(`GGUFModel.model_id` + `request_identity`) is everything that shapes the reply besides the messages
and the sampling settings: the GGUF's sha256 (its weights and its chat template), the prompt style, for a
completion-style (base) model the exact prompt text rendered from the messages (its template, few-shot
example and stop strings included), the context size, the thread count and the llama.cpp version, and for a
request with an output format (`SamplingParams.output_format`) the text of the grammar that enforces it.

Output formats: a "verdict" request (the Verifier's) is decoded under a GBNF grammar (`trinity.verdict.verdict_grammar`) that
admits only a short reason on one line, then a last line `Verdict: ACCEPT` or `Verdict: REJECT`: every reply
that is not cut carries the field. The reason is bounded in characters so that the field fits in the request's
max_tokens at the tokenisation the bundled models show (a reply cut before its field has no verdict).
"""
from __future__ import annotations

import asyncio
import importlib.metadata
import threading
import time
from pathlib import Path
from typing import Sequence

from trinity.config import PoolMember
from trinity.pool.bundled import BUNDLED, gguf_sha256, resolve_gguf
from trinity.pool.errors import PoolConfigError
from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.verdict import VERDICT_FORMAT, verdict_grammar

class LoadedModels:
    """The llama.cpp models this process has loaded: one instance, and one lock serialising its calls, per
    (GGUF file, n_ctx, n_threads), shared by every member that names it and loaded on first use.

    A loaded model is process-wide state (its memory and threads), so there is one of these per process:
    `LLAMA_MODELS`, the only process-level cache of the pool besides `trinity.pool.worker.PROCESS_MEMBERS`."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, int, int], tuple[object, threading.Lock]] = {}
        self._lock = threading.Lock()
        self.loads: list[str] = []
        """Every model load of this process, in order (a process loads each (file, n_ctx, n_threads) once)."""

    def get(self, path: Path, n_ctx: int, n_threads: int) -> tuple[object, threading.Lock]:
        """The instance for a GGUF file and its lock (loaded now if it is not yet)."""
        key = (str(path), n_ctx, n_threads)
        with self._lock:
            if key not in self._models:
                from llama_cpp import Llama  # imported lazily: compiling it is part of setup, not of import

                llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads,
                            verbose=False, seed=0)
                self._models[key] = (llm, threading.Lock())
                self.loads.append(path.name)
            return self._models[key]


IN_PROCESS_THREADS = 2
"""Threads of a model run in process when its member sets no `n_threads`."""

LLAMA_MODELS = LoadedModels()
"""This process's loaded llama.cpp models (see LoadedModels)."""


def load_llama(path: Path, n_ctx: int, n_threads: int):
    """The process-wide llama.cpp instance for a GGUF file and its lock (loaded on first use)."""
    return LLAMA_MODELS.get(path, n_ctx, n_threads)


COMPLETION_EXAMPLE = ("Question: What is 12 + 30? Put the final answer in \\boxed{}.\n\n"
                      "Answer: 12 + 30 = 42, so the answer is \\boxed{42}.")
"""The one worked example a base model sees before the task (part of the rendered prompt, hence the key)."""
COMPLETION_STOP: tuple[str, ...] = ("\n\nQuestion:",)
"""Where a base model's completion is cut (it would go on to invent the next question)."""


def completion_prompt(messages: Sequence[ChatMessage]) -> str:
    """Few-shot completion prompt for base (non-chat) models: the instruction, one worked example of the
    format, then the task with an open 'Answer:' for the model to continue."""
    system = " ".join(m.content for m in messages if m.role == "system")
    convo = "\n\n".join(f"{'Question' if m.role == 'user' else 'Answer'}: {m.content}"
                        for m in messages if m.role != "system")
    return f"{system}\n\n{COMPLETION_EXAMPLE}\n\n{convo}\n\nAnswer:"


def output_grammar(sampling: SamplingParams) -> str | None:
    """The grammar that enforces `sampling.output_format` (None: free text)."""
    if sampling.output_format is None:
        return None
    if sampling.output_format == VERDICT_FORMAT:
        return verdict_grammar(sampling.max_tokens)
    raise ValueError(f"local members have no grammar for output_format {sampling.output_format!r}")


class GGUFModel:
    """The model of a local member, whatever engine runs it (`LocalChatModel` in process, and
    `trinity.pool.llama_server.LlamaServerChatModel`, both hold one): the GGUF file (a bundled id or a path), its
    identity, how it is prompted, and what of a request keys its reply besides the engine."""

    def __init__(self, member: PoolMember):
        self.path = resolve_gguf(member.model)
        bundled = BUNDLED.get(member.model)
        self.sha256 = gguf_sha256(member.model, self.path)
        self.model_id = f"gguf:{bundled.id if bundled else self.path.name}@sha256:{self.sha256}"
        """Readable name + the file's content hash: same name, other weights → other responses."""
        self.completion_style = member.prompt_style == "completion" or (bundled is not None and not bundled.chat)
        """A base model (or a member that asks for it): the messages rendered as a few-shot prompt
        (`completion_prompt`), cut at `COMPLETION_STOP`."""

    def prompt_identity(self) -> dict:
        """The prompt's part of an engine's identity: the prompt style and, for a completion, the stop strings."""
        return {"prompt_style": "completion" if self.completion_style else "chat",
                "stop": list(COMPLETION_STOP) if self.completion_style else []}

    def request_identity(self, engine_identity: dict, messages: Sequence[ChatMessage],
                         sampling: SamplingParams) -> dict:
        """What, besides model_id, messages and sampling, shapes a local member's reply to `messages` (part of
        the response-store key; see the module doc): its engine's identity and, for a completion-style model, the
        rendered prompt, so editing its template or few-shot example is a store miss; so is the grammar of an
        output format, so editing the grammar asks again (a free-text request's identity has no grammar entry)."""
        identity = engine_identity
        if self.completion_style:
            identity = {**identity, "prompt": completion_prompt(messages)}
        grammar = output_grammar(sampling)
        if grammar is not None:
            identity = {**identity, "grammar": grammar}
        return identity


IN_PROCESS_EXTRA = "in-process"
"""The install extra that brings the binding (`pip install -e '.[in-process]'`; `make setup-in-process` builds it)."""


def binding_version() -> str | None:
    """The installed llama-cpp-python's version (None: not installed; the default engine does not need it)."""
    try:
        return importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return None


def binding_problem() -> str | None:
    """Why the in-process engine cannot run here (the binding is not installed, and how to install it), or None."""
    if binding_version() is not None:
        return None
    return (f"engine in-process needs llama-cpp-python, not installed in this environment: `make setup-in-process` "
            f"(compiles it, ~13 min on 2 cores) or `pip install -e '.[{IN_PROCESS_EXTRA}]'`; or engine: llama-server "
            f"(the default, which `make setup` builds)")


class LocalChatModel:
    """A pool member backed by a local GGUF file (bundled id or path), run in process."""

    def __init__(self, member: PoolMember):
        self.member = member
        self.name = member.name
        self.gguf = GGUFModel(member)
        self.model_id = self.gguf.model_id
        self.n_threads = member.n_threads or IN_PROCESS_THREADS
        self._identity = self._engine_identity()

    def _engine_identity(self) -> dict:
        """What of this member's engine keys every response (see the module doc); the binding's version here."""
        problem = binding_problem()
        if problem is not None:
            raise PoolConfigError(f"pool member {self.name!r}: {problem}")
        version = binding_version()
        return {**self.gguf.prompt_identity(),
                "n_ctx": self.member.n_ctx, "n_threads": self.n_threads, "llama_cpp": version}

    def request_identity(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> dict:
        """What, besides model_id, messages and sampling, shapes this member's reply (`GGUFModel.request_identity`)."""
        return self.gguf.request_identity(self._identity, messages, sampling)

    def _generate(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        llm, lock = load_llama(self.gguf.path, self.member.n_ctx, self.n_threads)
        grammar_text = output_grammar(sampling)
        constrained = {}
        if grammar_text is not None:
            from llama_cpp import LlamaGrammar

            constrained["grammar"] = LlamaGrammar.from_string(grammar_text, verbose=False)
        with lock:
            t0 = time.perf_counter()  # the model's time on this call: the wait for the model's lock left out
            # Evaluate every prompt from a clean context: reusing the previous call's KV prefix changes the
            # batch layout and, through float rounding, can change a sampled token. A stored response must
            # be exactly what a fresh process would produce (resume = uninterrupted run).
            llm.reset()
            if self.gguf.completion_style:
                out = llm.create_completion(
                    completion_prompt(messages), max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                    top_p=sampling.top_p, seed=sampling.seed, stop=list(COMPLETION_STOP), **constrained)
                text = out["choices"][0]["text"]
            else:
                out = llm.create_chat_completion(
                    messages=[{"role": m.role, "content": m.content} for m in messages],
                    max_tokens=sampling.max_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                    seed=sampling.seed, **constrained)
                text = out["choices"][0]["message"]["content"] or ""
        usage = out.get("usage") or {}
        ok = bool(text.strip())
        # an empty reply is what this model, seeded, says to this prompt: a sample (deterministic)
        return ChatResponse(text=text, ok=ok, error=None if ok else "empty reply",
                            failure=None if ok else "deterministic",
                            prompt_tokens=int(usage.get("prompt_tokens", 0)),
                            completion_tokens=int(usage.get("completion_tokens", 0)),
                            latency_s=time.perf_counter() - t0, model=self.model_id)

    def generate(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        """The blocking call (what `chat` runs on a worker thread); never raises for model-side failures."""
        try:
            return self._generate(messages, sampling)
        except Exception as e:  # a model-side failure is a failed call, not a crash
            return ChatResponse(text="", ok=False, error=f"{type(e).__name__}: {e}", model=self.model_id,
                                failure="deterministic" if _is_request_error(e) else "transient")

    async def chat(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        return await asyncio.to_thread(self.generate, messages, sampling)


def _is_request_error(e: Exception) -> bool:
    """llama-cpp-python's refusal of the request itself (the prompt does not fit the context window): the
    same request always fails, so it is stored. Anything else (out of memory, a load failure) is an outage."""
    return isinstance(e, ValueError) and "context window" in str(e)
