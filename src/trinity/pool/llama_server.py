"""Local pool members served by llama.cpp's own server (`PoolMember.engine: llama-server`, the default).

One `llama-server` process per model (per GGUF file and settings), started by the first call that needs it and
shared by every member that names it (`LLAMA_SERVERS`, one per process). It decodes up to `max_concurrency`
calls at once as one batch (parallel slots, continuous batching) and keeps each slot's prompt in its KV cache,
reusing the longest common prefix of the next prompt (`--cache-reuse`): an episode's later turns repeat the
earlier transcript, and every candidate of a generation starts from the same task prompts. The member holds an
HTTP client of its running server, the client the OpenAI-compatible member holds too
(`trinity.pool.openai_client.EndpointClient`): one call path, retries, limits and failure kinds, for local and
remote members. A user's own server (llama.cpp, vLLM, Ollama, on a GPU box) is that same path, written as an
`openai` member with its URL (README, "Point Trinity at real endpoints").

The binary is built once per CPU by `scripts/build_llama_server.sh` (`make setup` runs it) from the llama.cpp that
llama-cpp-python vendors, into ~/.cache/trinity/llama-server/cpu-<CPU_KEY>/ (env TRINITY_LLAMA_SERVER: another one),
with the sources it came from recorded beside it (`server_build`): the binding itself is not needed to run or name it.

Lifetime: a server lives as long as the process that started it. It is stopped at exit (atexit), and it dies with
that process however the process dies, SIGKILL included: it is started from a thread that lives as long as the
process, with PR_SET_PDEATHSIG (Linux), and it inherits the process guard's mark (`trinity.ops.process_guard`)
like every child of a guarded run. A server found dead is started again on the next call.

Same requests as in process: a chat member's messages go to /v1/chat/completions (the GGUF's own chat template,
as llama-cpp-python renders it), a base model's rendered few-shot prompt and stop string to /v1/completions, a
Verifier's reply under the same GBNF grammar (`grammar`), with llama-cpp-python's sampler defaults sent
explicitly (`LLAMA_SAMPLERS`). A stored response's key (`request_identity`) names the engine: replies of the two
engines are never mixed in one store. Batched decoding is not batch-invariant, so two fresh runs can differ in a
sampled token where their calls overlapped differently; the store is the replay anchor (a rerun pays no call and
reproduces the run exactly). How many replies differ: docs/benchmarks.md, "Local engine".
"""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import ctypes
import dataclasses
import hashlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from trinity.config import PoolMember, PoolSettings
from trinity.pool.base import LoopLocalSemaphore
from trinity.pool.errors import PoolConfigError
from trinity.pool.local import COMPLETION_STOP, GGUFModel, completion_prompt, output_grammar
from trinity.pool.openai_client import EndpointClient
from trinity.records import ChatMessage, ChatResponse, SamplingParams

BINARY_ENV = "TRINITY_LLAMA_SERVER"
"""A llama-server binary to use instead of this CPU's build in the cache."""
SOURCE_RECORD_SUFFIX = ".source"
"""Beside a binary build_llama_server.sh built (`llama-server.source`): the sources it came from,
`llama-cpp-python==<version>` (the sdist whose vendored llama.cpp was compiled)."""
SOURCE_RECORD_PREFIX = "llama-cpp-python=="
LLAMA_SAMPLERS: dict[str, float] = {"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.0}
"""llama-cpp-python's sampler defaults, sent with every request so that the server samples as the in-process path."""
CACHE_REUSE_TOKENS = 256
"""`--cache-reuse`: the smallest chunk of a slot's cached prompt reused by shifting it (KV shifting)."""
CONNECTION_RETRIES = 3
"""More attempts for a call whose connection failed (the server closed it, e.g. a kept-alive one past its 5 s idle
limit as the call reused it: "Cannot write to closing transport"); a call that timed out is not asked again."""
CALL_TIMEOUT_S = 1800.0
"""One call's deadline: a local server is slow only because the CPU is busy (a 320-token reply in a full batch on
2 cores takes minutes); a server that died is seen at once as a refused connection."""
START_TIMEOUT_S = 300.0
SPINCOUNT_ENV = "TRINITY_LLAMA_SERVER_SPINCOUNT"
"""The servers' `GOMP_SPINCOUNT` instead of 0 (e.g. on a machine with a core per server thread to spare)."""
SERVER_OMP_ENV = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": os.environ.get(SPINCOUNT_ENV, "0")}
"""The OpenMP settings every server runs with. llama.cpp's CPU build has a server's threads meet at an OpenMP barrier
after every operation; with these a thread that waits there sleeps at once instead of spinning (this process keeps
`GOMP_SPINCOUNT=1000000` for the torch encoder, which servers would otherwise inherit). Servers share the cores, and
a spinning waiter holds the core its sibling needs: measured on 2 cores with 4 servers busy, 2 threads each decode
40.2 tok/s sleeping against 13.8 spinning (1 thread each: 37.7), docs/benchmarks.md "Local engine"."""
MIN_SERVER_THREADS = 2
"""A server's threads when the pool's share of the cores would give it fewer (`with_thread_budget`): with waiting
threads asleep, sharing costs little while every server is busy, and a server left working alone (the evaluation's
tail) uses two cores, not one."""
STOP_GRACE_S = 15.0


def cpu_key() -> str:
    """The Makefile's CPU_KEY: md5 of the first `flags` line of /proc/cpuinfo (with its newline, as grep prints it),
    12 hex digits: the build of one CPU is never run on another."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        line = ""
    return hashlib.md5(line.encode()).hexdigest()[:12]


def server_binary() -> Path:
    """This CPU's llama-server (or env TRINITY_LLAMA_SERVER's)."""
    env = os.environ.get(BINARY_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "trinity" / "llama-server" / f"cpu-{cpu_key()}" / "llama-server"


_BUILDS: dict[tuple, str] = {}


def server_build(binary: Path) -> str:
    """Which llama.cpp `binary` is, as a response's store key names it (`"llama_cpp"` in `request_identity`).

    A binary build_llama_server.sh built: the version of the llama-cpp-python sdist whose vendored llama.cpp it was
    compiled from, read from the record beside it (e.g. "0.3.36", the name llama-cpp-python's own version gives the
    binding's replies and the server's before it was recorded: stored responses keep their keys). One's own binary
    with no record (TRINITY_LLAMA_SERVER): its content, "llama-server@sha256:<16 hex>" (llama.cpp built from a
    tarball reports "build 0, commit unknown" to `--version`). Read once per file version."""
    record = binary.with_name(binary.name + SOURCE_RECORD_SUFFIX)
    stat = binary.stat()
    record_stat = record.stat() if record.exists() else None
    cache_key = (str(binary), stat.st_mtime_ns, stat.st_size,
                 record_stat and (record_stat.st_mtime_ns, record_stat.st_size))
    if cache_key not in _BUILDS:
        if record_stat is not None:
            text = record.read_text().strip()
            if not text.startswith(SOURCE_RECORD_PREFIX) or not text[len(SOURCE_RECORD_PREFIX):]:
                raise PoolConfigError(f"{record}: expected one line `{SOURCE_RECORD_PREFIX}<version>` (what "
                                      f"scripts/build_llama_server.sh writes), found {text[:80]!r}: rebuild the "
                                      f"server (delete {binary}, then `make setup`) or remove the record")
            _BUILDS[cache_key] = text[len(SOURCE_RECORD_PREFIX):]
        else:
            digest = hashlib.sha256()
            with open(binary, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            _BUILDS[cache_key] = f"llama-server@sha256:{digest.hexdigest()[:16]}"
    return _BUILDS[cache_key]


def binary_problem() -> str | None:
    """Why the llama-server engine cannot run here (None: it can)."""
    binary = server_binary()
    if os.access(binary, os.X_OK):
        return None
    where = f"${BINARY_ENV}={binary}" if os.environ.get(BINARY_ENV) else str(binary)
    return (f"llama-server is not built for this CPU ({where} is missing): run `make setup` (or "
            f"`bash scripts/build_llama_server.sh`, ~5 min once), or set pool.local_engine: in-process")


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, e.g. a container's cpuset)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def with_thread_budget(pool: PoolSettings) -> PoolSettings:
    """`pool` with the threads of every llama-server member that sets none (`n_threads`) filled in: the usable cores
    split evenly between the models the pool serves, but at least `MIN_SERVER_THREADS` each (never more than the
    cores). A generation keeps calls to every member in flight, so the servers decode at the same time, and an
    evaluation ends with one model's work left: on 2 cores and 4 models each server gets both cores, its waiting
    threads asleep (`SERVER_OMP_ENV`), so that the last busy server is not held to one core while the other idles
    (measured: docs/benchmarks.md, "Local engine"). Runtime only: the settings' own `n_threads` stays unset (no
    machine's core count in a run's identity)."""
    served = {m.model for m in pool.members if m.backend == "local" and m.engine == "llama-server"}
    if not served:
        return pool
    cores = usable_cores()
    threads = min(cores, max(MIN_SERVER_THREADS, cores // len(served)))
    return pool.model_copy(update={"members": [
        m.model_copy(update={"n_threads": threads})
        if m.backend == "local" and m.engine == "llama-server" and m.n_threads is None else m
        for m in pool.members]})


@dataclass(frozen=True)
class ServerSpec:
    """What one llama-server process serves and how: a process per distinct spec."""

    binary: str
    gguf: str
    ctx_per_slot: int
    slots: int
    threads: int
    cache_reuse: int = CACHE_REUSE_TOKENS

    def command(self, port: int) -> list[str]:
        return [self.binary, "-m", self.gguf, "-c", str(self.ctx_per_slot * self.slots), "-np", str(self.slots),
                "-t", str(self.threads), "-tb", str(self.threads), "--cache-reuse", str(self.cache_reuse),
                "--host", "127.0.0.1", "--port", str(port)]


class ServerStartError(RuntimeError):
    """A llama-server did not come up (its log's tail is in the message)."""


_PRCTL = None
if sys.platform == "linux":
    try:
        _PRCTL = ctypes.CDLL(None, use_errno=True).prctl  # resolved now: nothing to look up in the forked child
    except (OSError, AttributeError):
        _PRCTL = None
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the thread that started it ends (the launcher thread, which ends
    only with the process)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, 9)


_LAUNCHER = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama-server-launcher")
"""The one thread every server is started from: PR_SET_PDEATHSIG fires when the *thread* that forked the child
ends, and this one lives as long as the process (a call's own thread may be a short-lived worker thread)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One running llama-server: started and health-checked by `start`, stopped by `stop`."""

    def __init__(self, spec: ServerSpec, log_dir: Path):
        self.spec = spec
        self.log_path = log_dir / f"llama-server-{Path(spec.gguf).stem}-{os.getpid()}-{time.monotonic_ns()}.log"
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.start_s = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> "ServerProcess":
        t0 = time.monotonic()
        for attempt in range(3):  # another process may take the free port before the server binds it
            self.port = _free_port()
            cmd = self.spec.command(self.port)
            with open(self.log_path, "ab") as log:
                self.proc = _LAUNCHER.submit(
                    subprocess.Popen, cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, **SERVER_OMP_ENV},
                    preexec_fn=_die_with_parent if _PRCTL is not None else None).result()
            try:
                self._wait_healthy()
                self.start_s = time.monotonic() - t0
                return self
            except ServerStartError:
                self.stop()
                if attempt == 2 or "bind" not in self.log_tail(5).lower():
                    raise
        raise AssertionError("unreachable")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerStartError(f"llama-server for {Path(self.spec.gguf).name} exited with code "
                                       f"{self.proc.returncode} while starting (log {self.log_path}):\n"
                                       + self.log_tail())
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass  # not listening yet, or 503 while the model loads
            time.sleep(0.2)
        raise ServerStartError(f"llama-server for {Path(self.spec.gguf).name} not healthy after "
                               f"{START_TIMEOUT_S:.0f}s (log {self.log_path}):\n" + self.log_tail())

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class LlamaServers:
    """The llama-server processes of this process: one per `ServerSpec`, started on first use (again if found
    dead), stopped at exit. Like `trinity.pool.local.LLAMA_MODELS`, process-level state by nature (processes)."""

    def __init__(self) -> None:
        self._servers: dict[ServerSpec, ServerProcess] = {}
        self._lock = threading.Lock()
        self._log_dir: Path | None = None
        self.starts: list[str] = []
        """Every server start of this process, in order (GGUF file name)."""

    def get(self, spec: ServerSpec) -> ServerProcess:
        """The running server of `spec` (started now, blocking, if there is none or it died)."""
        with self._lock:
            server = self._servers.get(spec)
            if server is not None and server.alive():
                return server
            if server is not None:
                print(f"[pool] llama-server for {Path(spec.gguf).name} died (code {server.proc.returncode}); "
                      f"starting it again. Its log: {server.log_path}", file=sys.stderr, flush=True)
            if self._log_dir is None:
                self._log_dir = Path(tempfile.mkdtemp(prefix="trinity-llama-server-"))
            server = ServerProcess(spec, self._log_dir).start()
            self._servers[spec] = server
            self.starts.append(Path(spec.gguf).name)
            return server

    def running(self) -> list[ServerProcess]:
        with self._lock:
            return [s for s in self._servers.values() if s.alive()]

    def stop_all(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for s in servers:
            s.stop()


LLAMA_SERVERS = LlamaServers()
"""This process's llama-server processes (see LlamaServers)."""
atexit.register(LLAMA_SERVERS.stop_all)


class LlamaServerChatModel:
    """A local member (bundled id or .gguf path) served by llama-server: the GGUF's identity, prompts and grammar
    (`GGUFModel`, as in process), asked over HTTP by an `EndpointClient` of its running server (see the module doc).
    `global_limit` and `member_limit` are the pool's slots (`ConcurrencyLimits`); the member's own limit is its
    server's slot count."""

    def __init__(self, member: PoolMember, global_limit: LoopLocalSemaphore | None = None, *,
                 member_limit: LoopLocalSemaphore | None = None):
        self.member = member
        self.name = member.name
        self.gguf = GGUFModel(member)
        self.model_id = self.gguf.model_id
        self._identity = self._engine_identity()
        self.spec = ServerSpec(binary=str(server_binary()), gguf=str(self.gguf.path), ctx_per_slot=member.n_ctx,
                               slots=member.max_concurrency, threads=member.n_threads or usable_cores())
        self._member_limit = member_limit if member_limit is not None else LoopLocalSemaphore(self.spec.slots)
        self._global_limit = global_limit
        self._client: EndpointClient | None = None
        """The client of the running server (a new one when a server started again listens on another port)."""

    def _engine_identity(self) -> dict:
        """The server's build (`server_build`, not the binding's version: the binding need not be installed) and
        the sampler settings sent with every request. Slots and threads are left out: which calls share a batch
        shapes a reply too, and no setting fixes it."""
        problem = binary_problem()
        if problem is not None:
            raise PoolConfigError(f"pool member {self.name!r}: {problem}")
        return {**self.gguf.prompt_identity(), "n_ctx": self.member.n_ctx, "engine": "llama-server",
                "llama_cpp": server_build(server_binary()), "samplers": dict(LLAMA_SAMPLERS)}

    def request_identity(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> dict:
        """What, besides model_id, messages and sampling, shapes this member's reply (`GGUFModel.request_identity`)."""
        return self.gguf.request_identity(self._identity, messages, sampling)

    def _client_of(self, server: ServerProcess) -> EndpointClient:
        """The client of `server`: a failed connection is asked again (`CONNECTION_RETRIES`); a timeout is final (a
        local server is slow only because its CPU is busy, and asking again would only add to its queue)."""
        if self._client is None or self._client.base_url != server.base_url:
            self._client = EndpointClient(
                name=self.name, model_id=self.model_id, base_url=server.base_url, api_key=None,
                timeout_s=CALL_TIMEOUT_S, max_retries=CONNECTION_RETRIES, member_limit=self._member_limit,
                global_limit=self._global_limit, retry_timeouts=False)
        return self._client

    async def chat(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        """One call; the server is started on first use (and again if it died: then the call is asked once more).
        Its `latency_s` is the server's time on it (the client's: waits for a free slot left out), not the start."""
        t0 = time.monotonic()
        route, body = server_request(self.name, self.gguf, messages, sampling)
        resp: ChatResponse | None = None
        served_s = 0.0
        for _ in range(2):
            try:
                server = await asyncio.to_thread(LLAMA_SERVERS.get, self.spec)
            except ServerStartError as e:
                return ChatResponse(text="", ok=False, error=str(e), failure="transient", model=self.model_id,
                                    latency_s=time.monotonic() - t0)
            resp = await self._client_of(server).call(route, body)
            served_s += resp.latency_s
            if resp.ok or resp.failure == "deterministic" or server.alive():
                break
        assert resp is not None
        return dataclasses.replace(resp, latency_s=served_s)

    def generate(self, messages: Sequence[ChatMessage], sampling: SamplingParams) -> ChatResponse:
        """The blocking call, for a caller without an event loop."""
        return asyncio.run(self.chat(messages, sampling))


def server_request(member_name: str, gguf: GGUFModel, messages: Sequence[ChatMessage],
                   sampling: SamplingParams) -> tuple[str, dict[str, Any]]:
    """The route and body that ask llama-server what `trinity.pool.local.LocalChatModel.generate` asks
    llama-cpp-python of `gguf` (the request's `model` is the member's name: a server serves one model)."""
    body: dict[str, Any] = {"model": member_name, "temperature": sampling.temperature, "top_p": sampling.top_p,
                            "max_tokens": sampling.max_tokens, "seed": sampling.seed, **LLAMA_SAMPLERS}
    grammar = output_grammar(sampling)
    if grammar is not None:
        body["grammar"] = grammar
    if gguf.completion_style:
        return "/completions", {**body, "prompt": completion_prompt(messages), "stop": list(COMPLETION_STOP)}
    return "/chat/completions", {**body, "messages": [{"role": m.role, "content": m.content} for m in messages]}
