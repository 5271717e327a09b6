"""How `trinity serve` protects itself: the admission limit (429 + Retry-After), the per-request deadline (504),
a client's disconnect cancelling its episode's remaining turns, the refusal to serve beyond loopback without an API
key, and the retention of stored conversations.

The server is the real app (`create_app`) under uvicorn on 127.0.0.1, asked by real clients (the openai SDK,
httpx); the coordinator is the real `Coordinator` over a real response store, with a scripted encoder and head
(every turn: member `a` as Worker, three turns) and a pool member whose calls wait at a gate the test opens: what
is under test is which calls start, not what they answer.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn

from fixtures.scripted_pool import TurnCountEncoder, role_of, scripted_head

from trinity.config import ConfigError, Settings
from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.coordinator.policy import Policy, save_checkpoint
from trinity.coordinator.roles import Role
from trinity.pool.runtime import Pool
from trinity.records import ChatResponse
from trinity.serving.conversation import Coordinator
from trinity.serving.security import ExposureError, check_exposure, is_loopback
from trinity.serving.server import create_app, run_server
from trinity.serving.traces import RETENTION_ENV, TraceLog
from trinity.store import Store

pytestmark = pytest.mark.timeout(120)

MEMBERS = ("a", "b")
MAX_TURNS = 3
WAIT_S = 30.0
"""How long a test waits for something the server must do (a bound on a hang, not a performance figure)."""


def wait_until(what, timeout_s: float = WAIT_S) -> None:
    end = time.monotonic() + timeout_s
    while not what():
        if time.monotonic() > end:
            pytest.fail(f"timed out waiting for {getattr(what, '__name__', what)}")
        time.sleep(0.02)


class GatedMember:
    """A pool member whose calls wait until the test lets them through (`release(n)`: n calls, `open()`: all).
    `started` records the role of every call as it starts."""

    def __init__(self, name: str):
        self.name, self.model_id = name, f"gated:{name}"
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._allowed = 0
        self._open = False

    def release(self, n: int = 1) -> None:
        with self._lock:
            self._allowed += n

    def open(self) -> None:
        with self._lock:
            self._open = True

    def _pass(self) -> bool:
        with self._lock:
            if self._open:
                return True
            if self._allowed > 0:
                self._allowed -= 1
                return True
            return False

    async def chat(self, messages, sampling):
        self.started.append(role_of(messages))
        while not self._pass():
            await asyncio.sleep(0.01)
        return ChatResponse(text=f"Answer: 42 (call {len(self.started)})", model=self.model_id, prompt_tokens=10,
                            completion_tokens=5)


class AppServer:
    """`create_app(coordinator, **options)` served by uvicorn on 127.0.0.1 (any free port), in a thread."""

    def __init__(self, coordinator: Coordinator, **options):
        self.app = create_app(coordinator, **options)
        self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=0, log_config=None,
                                                    lifespan="on", timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive())
        assert self.server.started, "uvicorn did not start"
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"

    @property
    def running(self) -> dict:
        return self.app.state.running

    def in_flight(self) -> int:
        return httpx.get(self.base_url.removesuffix("/v1") + "/health", timeout=10).json()["in_flight"]

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url, api_key="unused", max_retries=0, **{"timeout": WAIT_S, **kw})

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(WAIT_S)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """serve(**create_app options) → (AppServer, its coordinator, its gated member `a`); everything is stopped
    after the test (gates opened first, so the server's shutdown waits for nothing)."""
    monkeypatch.delenv(RETENTION_ENV, raising=False)
    settings = Settings.model_validate({
        "pool": {"members": [{"name": m, "backend": "local", "model": "x"} for m in MEMBERS]},
        "coordinator": {"max_turns": MAX_TURNS, "answer_rule": "latest"}})
    stem = tmp_path / "checkpoints" / "coordinator"
    head = scripted_head([(0, Role.WORKER)] * MAX_TURNS, n_models=len(MEMBERS))
    save_checkpoint(stem, head.ravel(), CheckpointMeta.model_validate({"pool": [{"name": m} for m in MEMBERS]}))
    store = Store(tmp_path / "store" / "trinity.duckdb")
    members = [GatedMember(m) for m in MEMBERS]
    pool = Pool(members, settings.pool.members, store)
    coordinators: list[Coordinator] = []
    servers: list[AppServer] = []

    def serve(coordinator: Coordinator | None = None, **options):
        if coordinator is None:
            coordinator = Coordinator(settings, Policy.load(stem), store, encoder=TurnCountEncoder(), pool=pool)
            coordinators.append(coordinator)
        servers.append(AppServer(coordinator, **options))
        return servers[-1], coordinator, members[0]

    serve.store = store
    yield serve
    for m in members:
        m.open()
    for s in servers:
        s.stop()
    for c in coordinators:
        c.close()
    store.close()


def ask(q: str) -> list[dict]:
    return [{"role": "user", "content": q}]


def stopped_all(server: AppServer):
    def every_episode_in_flight_is_stopped() -> bool:
        stops = [s for s in list(server.running.values()) if s is not None]
        return bool(stops) and all(s.stopped for s in stops)
    return every_episode_in_flight_is_stopped


# ------------------------------------------------------------------------------------------ admission
def test_requests_beyond_the_in_flight_limit_get_429_at_once_with_retry_after(served):
    server, _, member = served(max_in_flight=2)
    with ThreadPoolExecutor(2) as pool, server.client() as client:
        held = [pool.submit(client.chat.completions.create, model="trinity", messages=ask(q))
                for q in ("What is 1 + 1?", "What is 2 + 2?")]
        wait_until(lambda: len(member.started) == 2)  # both episodes are at their first call, which waits
        with pytest.raises(openai.RateLimitError) as refused:  # answered now, while the two still wait
            client.chat.completions.create(model="trinity", messages=ask("What is 3 + 3?"))
        with pytest.raises(openai.RateLimitError):  # a direct member call counts too
            client.chat.completions.create(model="b", messages=ask("hello b"))
        response = refused.value.response
        assert response.status_code == 429
        assert response.headers["x-should-retry"] == "true" and int(response.headers["Retry-After"]) >= 1
        error = response.json()["error"]
        assert error["code"] == "too_many_requests_in_flight" and error["type"] == "rate_limit_error"
        assert "--max-in-flight 2" in error["message"]
        assert len(member.started) == 2  # the refused requests started nothing
        member.open()
        assert [len(f.result().model_extra["trinity"]["turns"]) for f in held] == [MAX_TURNS, MAX_TURNS]
        wait_until(lambda: server.in_flight() == 0)
        later = client.chat.completions.create(model="trinity", messages=ask("What is 3 + 3?"))
    assert later.choices[0].message.content.startswith("Answer: 42")


# ------------------------------------------------------------------------------------------ deadline
def test_a_request_past_its_deadline_gets_504_and_the_paid_call_stays_in_the_store(served):
    server, coordinator, member = served(deadline_s=1.0)
    q = "What is 4 + 4?"
    with server.client() as client, pytest.raises(openai.APIStatusError) as late:
        client.chat.completions.create(model="trinity", messages=ask(q))  # its first call waits at the gate
    response = late.value.response
    assert response.status_code == 504 and response.headers["x-should-retry"] == "true"
    error = response.json()["error"]
    assert error["code"] == "deadline_exceeded" and "deadline of 1 s" in error["message"]
    episode_id = error["trinity"]["episode_id"]
    assert episode_id.startswith("ep-") and error["trinity"]["turns"] == []
    assert len(member.started) == 1
    member.open()  # the call in flight returns (and is stored); the episode starts no further turn
    wait_until(lambda: server.in_flight() == 0)
    assert len(member.started) == 1
    trace = coordinator.traces.get(episode_id)
    assert trace["outcome"] == "cancelled" and "deadline of 1 s passed" in trace["reason"]
    assert len(trace["turns"]) == 1 and trace["turns"][0]["ok"]

    patient, _, _ = served(coordinator)  # the same coordinator and store, the default deadline
    with patient.client() as client:
        again = client.chat.completions.create(model="trinity", messages=ask(q))
    turns = again.model_extra["trinity"]["turns"]
    assert [t["stored"] for t in turns] == [True, False, False]  # the paid call was replayed, the rest paid now
    assert len(member.started) == MAX_TURNS
    assert coordinator.traces.get(episode_id)["outcome"] == "answered"


def test_a_stream_past_its_deadline_ends_with_a_504_error_event(served):
    server, coordinator, member = served(deadline_s=1.0)
    member.release(1)  # the first turn is answered; the second waits
    events = []
    with server.client() as client, pytest.raises(openai.APIError) as late:
        for chunk in client.chat.completions.create(model="trinity", messages=ask("What is 5 + 5?"), stream=True):
            events.append(chunk)
    assert late.value.body["code"] == "deadline_exceeded"
    assert len(late.value.body["trinity"]["turns"]) == 1  # the turn streamed before the deadline
    assert events[0].choices[0].delta.role == "assistant"
    assert [c.model_extra["trinity"]["turn"]["index"] for c in events[1:]] == [0]
    member.open()
    wait_until(lambda: server.in_flight() == 0)
    assert len(member.started) == 2  # the turn in flight finished; no third turn started


# ------------------------------------------------------------------------------------------ disconnect
def test_a_client_that_disconnects_cancels_the_episodes_remaining_turns(served):
    server, coordinator, member = served()
    q = "What is 6 + 6?"
    with httpx.Client(base_url=server.base_url, timeout=0.5) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post("/chat/completions", json={"model": "trinity", "messages": ask(q)})
    # the client gave up after 0.5 s and closed its connection
    wait_until(stopped_all(server))
    member.open()
    wait_until(lambda: server.in_flight() == 0)
    assert member.started == ["worker"]  # the call in flight finished; no further turn started
    (episode_id, outcome, _), = coordinator.traces.recent()
    assert outcome == "cancelled"
    assert "the client disconnected" in coordinator.traces.get(episode_id)["reason"]


def test_a_client_that_drops_a_stream_cancels_the_episodes_remaining_turns(served):
    server, coordinator, member = served()
    member.release(1)  # one turn is streamed, the second waits
    with httpx.Client(base_url=server.base_url, timeout=WAIT_S) as http:
        with http.stream("POST", "/chat/completions", json={"model": "trinity", "stream": True,
                                                            "messages": ask("What is 7 + 7?")}) as r:
            lines = r.iter_lines()
            events = []
            while len(events) < 2:  # the role chunk, then the first turn
                line = next(lines)
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
            wait_until(lambda: len(member.started) == 2)  # the second turn's call waits at the gate
        # the stream is closed here, mid-episode
    assert events[1]["trinity"]["turn"]["index"] == 0
    wait_until(stopped_all(server))
    member.open()
    wait_until(lambda: server.in_flight() == 0)
    assert len(member.started) == 2  # the first turn, and the one in flight when the client left
    (episode_id, outcome, _), = coordinator.traces.recent()
    assert outcome == "cancelled" and len(coordinator.traces.get(episode_id)["turns"]) == 2


def test_a_client_leaving_does_not_fail_another_waiting_for_the_same_call(served):
    server, coordinator, member = served()
    q = "What is 8 + 8?"
    with ThreadPoolExecutor(1) as pool, server.client() as client:
        staying = pool.submit(client.chat.completions.create, model="trinity", messages=ask(q))
        wait_until(lambda: len(member.started) == 1)
        with httpx.Client(base_url=server.base_url, timeout=0.5) as impatient, pytest.raises(httpx.ReadTimeout):
            impatient.post("/chat/completions", json={"model": "trinity", "messages": ask(q)})
        wait_until(lambda: any(s is not None and s.stopped for s in list(server.running.values())))
        member.open()
        answer = staying.result()
    turns = answer.model_extra["trinity"]["turns"]
    assert len(turns) == MAX_TURNS and all(t["ok"] for t in turns)
    assert len(member.started) == MAX_TURNS  # the two episodes shared the first call


# ------------------------------------------------------------------------------------------ exposure
def test_serving_beyond_loopback_without_an_api_key_is_refused_unless_allowed(tmp_path, monkeypatch, capsys):
    from trinity import cli

    monkeypatch.delenv("TRINITY_API_KEY", raising=False)
    args = ["serve", "--root", str(tmp_path), "--params", "missing.yaml", "--port", "0"]
    assert cli.main([*args, "--host", "0.0.0.0"]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "refusing to serve on 0.0.0.0" in err
    assert "TRINITY_API_KEY" in err and "--allow-unauthenticated" in err
    # allowed, or with a key, or on loopback: it goes on to load the params (missing here)
    for extra, key in ((["--host", "0.0.0.0", "--allow-unauthenticated"], None), (["--host", "::"], "k" * 20),
                       (["--host", "127.0.0.1"], None), (["--host", "localhost"], None)):
        if key:
            monkeypatch.setenv("TRINITY_API_KEY", key)
        else:
            monkeypatch.delenv("TRINITY_API_KEY", raising=False)
        assert cli.main([*args, *extra]) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert "missing.yaml" in err and "refusing" not in err, extra
    assert [is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost", "0.0.0.0", "::",
                                     "10.0.0.5", "example.org")] == [True] * 5 + [False] * 4
    check_exposure("0.0.0.0", "a-key")
    with pytest.raises(ExposureError, match="refusing to serve on 192.168.1.10"):
        check_exposure("192.168.1.10", None)


def test_run_server_refuses_to_bind_beyond_loopback_without_a_key(served, monkeypatch):
    _, coordinator, _ = served()
    monkeypatch.delenv("TRINITY_API_KEY", raising=False)
    with pytest.raises(ExposureError, match="TRINITY_API_KEY"):
        run_server(coordinator, "0.0.0.0", 0)


# ------------------------------------------------------------------------------------------ retention
def _trace(episode_id: str, outcome: str = "answered") -> dict:
    return {"episode_id": episode_id, "checkpoint": "c", "outcome": outcome, "turns": []}


def _age(store: Store, episode_id: str, days: float) -> None:
    store.con.execute("UPDATE traces SET created_at = created_at - to_microseconds(CAST(? * 86400e6 AS BIGINT)) "
                      "WHERE episode_id = ?", [days, episode_id])


def _stored_ids(store: Store) -> set[str]:
    return {r[0] for r in store.con.execute("SELECT episode_id FROM traces").fetchall()}


def test_trace_retention_deletes_older_conversations_at_open_and_on_each_save(tmp_path):
    path = tmp_path / "trinity.duckdb"
    with Store(path) as store:
        forever = TraceLog(store)
        for eid, age in (("ep-old", 10), ("ep-week", 3), ("ep-new", 0)):
            forever.save(_trace(eid))
            _age(store, eid, age)
        assert _stored_ids(store) == {"ep-old", "ep-week", "ep-new"}  # no retention: kept forever
        TraceLog(store, retention_days=7)  # a writer opening the log (a server's start) prunes
        assert _stored_ids(store) == {"ep-week", "ep-new"}
        two_days = TraceLog(store, retention_days=2)
        assert _stored_ids(store) == {"ep-new"}
        two_days.save(_trace("ep-later"))
        _age(store, "ep-later", 2.5)
        two_days.save(_trace("ep-latest"))  # each save prunes too
        assert _stored_ids(store) == {"ep-new", "ep-latest"}
        for bad in (-1, float("nan"), "7"):
            with pytest.raises(ConfigError, match="retention"):
                TraceLog(store, retention_days=bad)
    with Store(path) as store:
        _age(store, "ep-new", 1.5)
    with Store(path, read_only=True) as reader:  # a reader cannot delete: it hides what is past the retention
        assert {e for e, _, _ in TraceLog(reader, retention_days=1).recent()} == {"ep-latest"}
        assert TraceLog(reader, retention_days=1).get("ep-new") is None
        assert TraceLog(reader).get("ep-new") is not None


def test_the_server_and_trinity_trace_keep_conversations_for_the_retention(served, monkeypatch, capsys):
    from trinity import cli

    monkeypatch.setenv(RETENTION_ENV, "7")
    server, coordinator, member = served()
    member.open()
    with server.client() as client:
        first = client.chat.completions.create(model="trinity", messages=ask("What is 9 + 9?"))
        old_id = first.model_extra["trinity"]["episode_id"]
        _age(served.store, old_id, 8)
        second = client.chat.completions.create(model="trinity", messages=ask("What is 10 + 10?"))
    new_id = second.model_extra["trinity"]["episode_id"]
    assert _stored_ids(served.store) == {new_id}  # the server's save pruned the expired conversation
    _age(served.store, new_id, 3)

    server.stop()
    coordinator.close()
    served.store.close()
    store_path = str(Path(served.store.path))
    monkeypatch.setenv(RETENTION_ENV, "2")
    assert cli.main(["trace", "--store", store_path]) == cli.EXIT_OK
    out = capsys.readouterr()
    assert new_id not in out.out and "no stored episodes" in out.err
    assert cli.main(["trace", new_id, "--store", store_path]) == cli.EXIT_NOT_FOUND
    assert f"older than 2 days are not kept ({RETENTION_ENV})" in capsys.readouterr().err
    monkeypatch.setenv(RETENTION_ENV, "30")
    assert cli.main(["trace", "--store", store_path]) == cli.EXIT_OK
    assert new_id in capsys.readouterr().out
    monkeypatch.setenv(RETENTION_ENV, "a week")
    assert cli.main(["trace", "--store", store_path]) == cli.EXIT_USAGE
    assert f"{RETENTION_ENV}='a week'" in capsys.readouterr().err
