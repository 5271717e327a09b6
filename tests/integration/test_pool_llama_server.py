"""Local members served by llama.cpp's own server (the default engine): real llama-server processes on 127.0.0.1,
the bundled GGUFs, the pool's one OpenAI-compatible call path."""
from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trinity.config import PoolSettings
from trinity.coordinator.role_sampling import RoleSampling
from trinity.pool.runtime import ConcurrencyLimits
from trinity.pool.errors import PoolConfigError
from trinity.pool.members import check_pool_config
from trinity.pool.llama_server import LLAMA_SERVERS, LlamaServerChatModel, binary_problem
from trinity.pool.runtime import build_pool
from trinity.pool.worker import expand_request
from trinity.records import ChatMessage
from trinity.store import Store

SRC = str(Path(__file__).resolve().parents[2] / "src")
SMOL = {"name": "smol", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 48, "temperature": 0.0}
GEMMA = {"name": "gemma", "backend": "local", "model": "gemma-3-270m", "max_tokens": 24, "temperature": 0.0}
QUESTION = [ChatMessage("user", "What is 7 times 6? Answer briefly.")]

pytestmark = pytest.mark.skipif(binary_problem() is not None, reason=str(binary_problem()))
# (`make setup` builds the server, so under `make test` this never skips; a bare pytest without it says why)


def pool_of(*members: dict, store: Store | None = None, **pool: object):
    settings = PoolSettings.model_validate({"members": list(members), "max_concurrency": 4, **pool})
    return build_pool(settings, store)


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_settings_route_local_members_to_the_server_with_the_pools_slots():
    settings = PoolSettings.model_validate({"members": [SMOL, {**GEMMA, "engine": "in-process"}],
                                            "max_concurrency": 6})
    smol, gemma = settings.members
    assert (smol.engine, smol.max_concurrency) == ("llama-server", 6)  # slots = calls the pool keeps in flight
    assert (gemma.engine, gemma.max_concurrency) == ("in-process", 1)  # its own engine wins
    every = PoolSettings.model_validate({"members": [SMOL], "local_engine": "in-process"})
    assert every.members[0].engine == "in-process"
    limits = ConcurrencyLimits(6, settings.members)
    assert limits.per_member[0] is not None and limits.per_member[0].value == 6  # the server's slots
    assert limits.per_member[1] is None  # in process: one call at a time per model, by its lock


def test_the_engine_is_part_of_the_store_key():
    server = pool_of(SMOL)
    in_process = pool_of(SMOL, local_engine="in-process")
    assert server.members[0].model_id == in_process.members[0].model_id  # same weights
    assert server.key(0, QUESTION) != in_process.key(0, QUESTION)  # never one engine's reply for the other's


def test_chat_base_model_and_verdict_requests_through_the_server():
    """The same requests as in process: a chat member's messages under the GGUF's template (same prompt tokens as
    llama-cpp-python renders), a base model's few-shot prompt cut at its stop string, a Verifier's reply under the
    verdict grammar; all on one server per model, started on first use."""
    starts = len(LLAMA_SERVERS.starts)
    pool = pool_of(SMOL, GEMMA)

    async def calls():
        return await asyncio.gather(
            pool.complete(0, QUESTION), pool.complete(1, QUESTION),
            pool.complete(0, QUESTION + [ChatMessage("assistant", "42"), ChatMessage("user", "Is that right?")],
                          RoleSampling.capped({"verifier": 48}).ask("verifier")))

    chat, base, verdict = asyncio.run(calls())
    for r in (chat, base, verdict):
        assert r.ok, r.error
        assert r.completion_tokens > 0
    assert chat.model == pool.members[0].model_id and base.model == pool.members[1].model_id
    assert "\n\nQuestion:" not in base.text  # the stop string cuts a base model's next invented question
    assert verdict.text.rstrip().splitlines()[-1] in ("Verdict: ACCEPT", "Verdict: REJECT")
    assert LLAMA_SERVERS.starts[starts:] == ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
    for server in LLAMA_SERVERS.running():  # waiting threads sleep: not this process's spinning encoder setting
        environ = dict(kv.split("=", 1) for kv in
                       Path(f"/proc/{server.proc.pid}/environ").read_text().split("\0") if "=" in kv)
        assert environ["GOMP_SPINCOUNT"] == "0" and environ["OMP_WAIT_POLICY"] == "PASSIVE"

    in_process = pool_of(SMOL, local_engine="in-process")
    same = asyncio.run(in_process.complete(0, QUESTION))
    assert same.prompt_tokens == chat.prompt_tokens  # one chat template, rendered alike

    # a second event loop (training runs one per generation) reuses the running server and makes a new client
    again = asyncio.run(pool.complete(0, [ChatMessage("user", "Name a prime number.")]))
    assert again.ok, again.error
    assert len(LLAMA_SERVERS.starts) == starts + 2


def test_a_prompt_beyond_the_context_is_a_deterministic_failure():
    pool = pool_of({**SMOL, "name": "tiny-ctx", "n_ctx": 128})
    r = asyncio.run(pool.complete(0, [ChatMessage("user", "count: " + " ".join(str(i) for i in range(400)))]))
    assert not r.ok and r.failure == "deterministic", r  # stored as the answer: asking again fails the same way
    assert "context" in (r.error or "") or "400" in (r.error or "")


def test_a_dead_server_is_started_again_on_the_next_call():
    pool = pool_of({**SMOL, "name": "restart", "n_ctx": 1024})  # a server of its own (other context)
    first = asyncio.run(pool.complete(0, QUESTION))
    assert first.ok, first.error
    server = LLAMA_SERVERS.get(pool.members[0].spec)
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    starts = len(LLAMA_SERVERS.starts)
    second = asyncio.run(pool.complete(0, [ChatMessage("user", "Name a prime number.")]))
    assert second.ok, second.error
    assert len(LLAMA_SERVERS.starts) == starts + 1


def test_a_task_runner_worker_calls_the_server_too():
    from trinity.pool.local import LLAMA_MODELS

    settings = PoolSettings.model_validate({"members": [SMOL], "max_concurrency": 2}).members[0]
    loaded = list(LLAMA_MODELS.loads)
    resp, info = expand_request(settings.model_dump(), [["user", QUESTION[0].content]],
                                {"temperature": 0.0, "top_p": 0.95, "max_tokens": 16, "seed": 0})
    assert resp["ok"], resp["error"]
    assert info["models_loaded"] == loaded  # nothing loaded in process
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in info["servers_started"]


def test_a_stored_reply_is_served_without_starting_a_server(tmp_path):
    """A replay from the store starts no llama-server (fresh processes, so nothing is running already)."""
    script = textwrap.dedent(f"""
        import asyncio, json, sys
        sys.path.insert(0, {SRC!r})
        from trinity.config import PoolSettings
        from trinity.pool.llama_server import LLAMA_SERVERS
        from trinity.pool.runtime import build_pool
        from trinity.records import ChatMessage
        from trinity.store import Store
        store = Store({str(tmp_path / 'store.duckdb')!r})
        pool = build_pool(PoolSettings.model_validate({{"members": [{SMOL!r}]}}), store)
        r = asyncio.run(pool.complete(0, [ChatMessage("user", "What is 7 times 6?")]))
        store.close()
        print(json.dumps({{"text": r.text, "calls": pool.stats.calls_made, "starts": LLAMA_SERVERS.starts}}))
    """)
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                                      timeout=300).stdout.strip().splitlines()[-1]) for _ in range(2)]
    assert runs[0]["calls"] == 1 and runs[0]["starts"] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert runs[1] == {"text": runs[0]["text"], "calls": 0, "starts": []}


def test_no_server_outlives_a_sigkilled_run():
    """The run that started a server is SIGKILLed (no exit handler runs): its server goes with it. The server was
    started by a call on an asyncio worker thread whose loop has ended since, as in training."""
    script = textwrap.dedent(f"""
        import asyncio, sys, time
        sys.path.insert(0, {SRC!r})
        from trinity.config import PoolSettings
        from trinity.pool.llama_server import LLAMA_SERVERS
        from trinity.pool.runtime import build_pool
        from trinity.records import ChatMessage
        pool = build_pool(PoolSettings.model_validate({{"members": [{SMOL!r}]}}), None)
        r = asyncio.run(pool.complete(0, [ChatMessage("user", "Hi")]))
        assert r.ok, r.error
        print(LLAMA_SERVERS.running()[0].proc.pid, flush=True)
        time.sleep(600)
    """)
    run = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        server_pid = int(run.stdout.readline())
        time.sleep(1.0)
        assert pid_alive(server_pid)  # alive after the loop (and its worker threads) ended
        run.kill()
        run.wait()
        deadline = time.monotonic() + 15
        while pid_alive(server_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(server_pid), f"llama-server {server_pid} outlived the SIGKILLed run"
    finally:
        run.kill()


def test_a_missing_server_build_is_a_config_error_naming_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("TRINITY_LLAMA_SERVER", str(tmp_path / "no-such-llama-server"))
    settings = PoolSettings.model_validate({"members": [SMOL]})
    with pytest.raises(PoolConfigError) as e:
        check_pool_config(settings)
    assert "pool member 'smol'" in str(e.value) and "make setup" in str(e.value)
    assert "pool.local_engine: in-process" in str(e.value)
    with pytest.raises(PoolConfigError):
        LlamaServerChatModel(settings.members[0])
    check_pool_config(PoolSettings.model_validate({"members": [SMOL], "local_engine": "in-process"}))  # no server


def test_the_servers_build_not_the_binding_names_its_replies(monkeypatch, tmp_path):
    """The key names the llama.cpp the server was built from (the record build_llama_server.sh keeps beside it), so
    the default engine needs no binding: with llama-cpp-python not installed the key is the one it had when the
    binding's version named it (stored replies keep their keys). One's own binary without a record is named by its
    content; a malformed record is an error naming the file."""
    from trinity.pool import local, llama_server

    built = llama_server.server_binary()
    record = built.with_name(built.name + llama_server.SOURCE_RECORD_SUFFIX)
    assert record.read_text().strip() == "llama-cpp-python==0.3.36"
    with_binding = pool_of(SMOL)
    assert with_binding.members[0].request_identity(QUESTION, with_binding.sampling(0))["llama_cpp"] == "0.3.36"
    monkeypatch.setattr(local, "binding_version", lambda: None)  # as after `make setup` without setup-in-process
    check_pool_config(PoolSettings.model_validate({"members": [SMOL]}))
    without = pool_of(SMOL)
    assert without.key(0, QUESTION) == with_binding.key(0, QUESTION)
    with pytest.raises(PoolConfigError, match=r"pool member 'smol': engine in-process needs llama-cpp-python.*"
                                              r"make setup-in-process"):
        check_pool_config(PoolSettings.model_validate({"members": [SMOL], "local_engine": "in-process"}))
    with pytest.raises(PoolConfigError, match=r"pool member 'smol': engine in-process needs llama-cpp-python.*"
                                              r"make setup-in-process"):
        pool_of(SMOL, local_engine="in-process")

    own = tmp_path / "my-llama-server"
    own.write_bytes(built.read_bytes())
    own.chmod(0o755)
    monkeypatch.setenv("TRINITY_LLAMA_SERVER", str(own))
    name = pool_of(SMOL).members[0].request_identity(QUESTION, with_binding.sampling(0))["llama_cpp"]
    assert re.fullmatch(r"llama-server@sha256:[0-9a-f]{16}", name), name
    own.with_name(own.name + ".source").write_text("0.3.36\n")
    with pytest.raises(PoolConfigError, match=rf"{re.escape(str(own))}\.source: expected one line "
                                              r"`llama-cpp-python==<version>`"):
        pool_of(SMOL)


def test_the_cores_are_split_between_the_served_models(monkeypatch):
    """Every server decodes while the others do (a generation keeps calls to every member in flight): the usable
    cores are shared out, at least two threads each (a server left working alone uses two cores) and never more than
    the cores; a member's own n_threads and in-process members are left alone, and the settings themselves keep
    n_threads unset (no machine's core count in a run's identity)."""
    from trinity.pool import llama_server

    members = [SMOL, GEMMA, {**SMOL, "name": "smol-hot", "temperature": 0.9},  # same GGUF: one server's share
               {**SMOL, "name": "qwen", "model": "qwen2.5-coder-0.5b-instruct", "n_threads": 3},
               {**GEMMA, "name": "gemma-ip", "model": "qwen2.5-coder-1.5b-instruct", "engine": "in-process"}]
    settings = PoolSettings.model_validate({"members": members})
    for cores, share in ((1, 1), (2, 2), (4, 2), (8, 2), (16, 5)):
        monkeypatch.setattr(llama_server, "usable_cores", lambda c=cores: c)
        budget = llama_server.with_thread_budget(settings)
        assert [m.n_threads for m in budget.members] == [share, share, share, 3, None], cores
    assert all(m.n_threads is None for m in settings.members if m.name != "qwen")
    pool = build_pool(settings, None)
    cores = llama_server.usable_cores()
    assert pool.settings[0].n_threads == pool.members[0].spec.threads == min(cores, max(2, cores // 3))


def test_a_finished_event_loop_closes_its_clients(capfd):
    """One event loop per training generation: each loop's HTTP client is closed when the loop shuts down, so no
    'Event loop is closed' or 'Unclosed client session' noise when the next loop takes over."""
    import gc

    pool = pool_of(SMOL)
    for i in range(3):
        assert asyncio.run(pool.complete(0, [ChatMessage("user", f"Say {i}.")])).ok
    gc.collect()
    err = capfd.readouterr().err
    assert "Event loop is closed" not in err and "Unclosed" not in err, err


def _fake_server(monkeypatch, handle):
    """A llama-server stand-in on 127.0.0.1 that `handle(n, handler)` answers (n: the request's number, from 1), put
    where LLAMA_SERVERS would hand out the real one. Returns (member, requests seen, shutdown)."""
    import http.server
    import threading
    from types import SimpleNamespace

    from trinity.pool import llama_server

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen.append(self.path)
            handle(len(seen), self)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    fake = SimpleNamespace(base_url=f"http://127.0.0.1:{srv.server_port}/v1", alive=lambda: True)
    monkeypatch.setattr(llama_server.LLAMA_SERVERS, "get", lambda spec: fake)
    return LlamaServerChatModel(PoolSettings.model_validate({"members": [SMOL]}).members[0]), seen, srv.shutdown


def _reply(handler, text="42"):
    body = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 1}}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def test_a_call_whose_connection_the_server_closed_is_asked_again(monkeypatch):
    """A dropped connection (the server closing it under the call: a kept-alive one past its idle limit, "Cannot write
    to closing transport" in an all-methods evaluation) is retried, not an outage; a timeout is not asked again."""
    import socket

    from trinity.pool import llama_server
    from trinity.records import SamplingParams

    def drop_twice(n, handler):
        if n <= 2:
            handler.connection.shutdown(socket.SHUT_RDWR)  # no reply at all
            handler.close_connection = True
            return
        _reply(handler)

    model, seen, stop = _fake_server(monkeypatch, drop_twice)
    try:
        r = asyncio.run(model.chat(QUESTION, SamplingParams(max_tokens=8)))
    finally:
        stop()
    assert r.ok and r.text == "42" and len(seen) == 3, r

    def too_slow(n, handler):
        time.sleep(1.5)
        _reply(handler)

    monkeypatch.setattr(llama_server, "CALL_TIMEOUT_S", 0.5)
    model, seen, stop = _fake_server(monkeypatch, too_slow)
    try:
        r = asyncio.run(model.chat(QUESTION, SamplingParams(max_tokens=8)))
    finally:
        stop()
    assert not r.ok and "timeout" in r.error and len(seen) == 1, r


def test_what_the_server_is_asked_and_the_keys_of_its_replies_are_pinned(monkeypatch):
    """The request bodies a llama-server member sends (a chat member's Verifier request under the verdict grammar, a
    base model's few-shot completion cut at its stop string, llama-cpp-python's sampler defaults in both) and the
    store keys of its replies, pinned to what the code computed before the member held its HTTP client instead of
    being an OpenAI-compatible member (issue 40): a stored reply keeps its key, and the server is asked the same."""
    from trinity.records import SamplingParams
    from trinity.store import response_key
    from trinity.verdict import verdict_grammar

    bodies = []

    def record(n, handler):
        bodies.append(json.loads(handler.body))
        _reply(handler)

    verifier = SamplingParams(temperature=0.7, max_tokens=48, seed=0, output_format="verdict")
    worker = SamplingParams(temperature=0.7, top_p=0.95, max_tokens=320, seed=3)
    chat_msgs = [ChatMessage("user", "What is 7 times 6?")]
    base_msgs = [ChatMessage("system", "Answer briefly."), ChatMessage("user", "Name a prime."),
                 ChatMessage("assistant", "7"), ChatMessage("user", "Is that right?")]
    smol, seen, stop = _fake_server(monkeypatch, record)
    gemma = LlamaServerChatModel(PoolSettings.model_validate({"members": [GEMMA]}).members[0])
    try:
        assert asyncio.run(smol.chat(chat_msgs, verifier)).ok and asyncio.run(gemma.chat(base_msgs, worker)).ok
    finally:
        stop()
    samplers = {"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.0}
    assert seen == ["/v1/chat/completions", "/v1/completions"]
    assert bodies[0] == {"model": "smol", "temperature": 0.7, "top_p": 0.95, "max_tokens": 48, "seed": 0, **samplers,
                         "grammar": verdict_grammar(48), "messages": [{"role": "user", "content": "What is 7 times 6?"}]}
    prompt = ("Answer briefly.\n\nQuestion: What is 12 + 30? Put the final answer in \\boxed{}.\n\n"
              "Answer: 12 + 30 = 42, so the answer is \\boxed{42}.\n\nQuestion: Name a prime.\n\nAnswer: 7\n\n"
              "Question: Is that right?\n\nAnswer:")
    assert bodies[1] == {"model": "gemma", "temperature": 0.7, "top_p": 0.95, "max_tokens": 320, "seed": 3, **samplers,
                         "prompt": prompt, "stop": ["\n\nQuestion:"]}
    assert response_key(smol.model_id, chat_msgs, verifier, smol.request_identity(chat_msgs, verifier)) == \
        "7ebcdfc6e181372dfe3ad5c75522b4cce2d69e326c0909e17898cd3b87db4c0a"
    assert response_key(gemma.model_id, base_msgs, worker, gemma.request_identity(base_msgs, worker)) == \
        "cc253c709e877be7ef583d098635aa3ae6c1a6adcf9167ecf1f6f332ee98867d"
