"""OpenAI-compatible pool backend against a fault-injecting endpoint over real HTTP on 127.0.0.1.

What must hold whatever the endpoint does: every call ends in a ChatResponse (ok, or ok=False with a
reason), nothing raises, the books (calls, attempts, retries, tokens, cost) balance exactly against the
server's own counts, Retry-After is honoured, concurrency limits hold, and the API key never shows up
anywhere we write.
"""
from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import logging
import secrets
import time

import pytest
from fixtures.fake_openai_server import FakeOpenAIServer, reply_for, usage_for

from trinity.config import PoolMember, PoolSettings
from trinity.pool.base import ChatModel
from trinity.pool.errors import MissingApiKeyError, PoolConfigError
from trinity.pool.members import check_pool_config
from trinity.pool.openai_compat import OpenAICompatibleChatModel
from trinity.pool.openai_wire import parse_retry_after
from trinity.records import ChatMessage, ChatResponse, SamplingParams
from trinity.redact import RedactingFilter, redact, redact_text, register_secret_env_names

KEY_ENV = "TRINITY_TEST_FAKE_KEY"
PRICE_IN, PRICE_OUT = 3.0, 15.0  # $ per 1M tokens

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["aiohttp", "httpx"])
def transport(request) -> str:
    """Both HTTP transports the backend can run on (the SDK's aiohttp client, and its httpx default)."""
    return request.param


@pytest.fixture
def api_key(monkeypatch) -> str:
    key = "sk-trinitytest-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    return key


@pytest.fixture
def server():
    with FakeOpenAIServer() as srv:
        yield srv


def member(srv: FakeOpenAIServer, name: str = "m", model: str = "test-model", **kw) -> PoolMember:
    fields = dict(name=name, backend="openai", model=model, base_url=srv.base_url, api_key_env=KEY_ENV,
                  price_input_per_mtok=PRICE_IN, price_output_per_mtok=PRICE_OUT, timeout_s=5.0,
                  max_retries=3, max_concurrency=4)
    fields.update(kw)
    return PoolMember(**fields)


def fast(m: PoolMember, global_limit: asyncio.Semaphore | None = None, **kw) -> OpenAICompatibleChatModel:
    """A model with short backoff, so retry tests take milliseconds (Retry-After still applies)."""
    kw.setdefault("transport", "httpx")
    kw.setdefault("backoff_base_s", 0.01)
    kw.setdefault("backoff_max_s", 0.05)
    return OpenAICompatibleChatModel(m, global_limit, **kw)


def ask(text: str) -> list[ChatMessage]:
    return [ChatMessage("system", "Answer briefly."), ChatMessage("user", text)]


def expected_usage(text: str) -> tuple[int, int]:
    msgs = [{"role": m.role, "content": m.content} for m in ask(text)]
    return usage_for(msgs, reply_for(msgs))


# -- configuration ---------------------------------------------------------------------------------
def test_missing_env_var_names_member_and_variable(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(MissingApiKeyError) as e:
        OpenAICompatibleChatModel(member(server, name="gpt-big"))
    assert "gpt-big" in str(e.value) and KEY_ENV in str(e.value) and "not set" in str(e.value)
    monkeypatch.setenv(KEY_ENV, "  ")
    with pytest.raises(MissingApiKeyError, match="set but empty"):
        OpenAICompatibleChatModel(member(server, name="gpt-big"))


def test_check_pool_config_lists_every_problem(server, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    good_local = PoolMember(name="tiny", backend="local", model="smollm2-135m-instruct")
    no_key = member(server, name="remote")
    weird = PoolMember.model_construct(**{**good_local.model_dump(), "name": "odd", "backend": "grpc"})
    pool = PoolSettings.model_construct(members=[good_local, no_key, weird], max_concurrency=8)
    with pytest.raises(PoolConfigError) as e:
        check_pool_config(pool)
    msg = str(e.value)
    assert "'remote'" in msg and KEY_ENV in msg
    assert "'odd'" in msg and "unknown backend 'grpc'" in msg
    assert "tiny" not in msg  # a valid member is not reported

    monkeypatch.setenv(KEY_ENV, "sk-" + "x" * 30)
    check_pool_config(PoolSettings(members=[good_local, no_key]))  # all fine now: no exception


def test_keyless_endpoint_and_protocol(server, transport):
    m = OpenAICompatibleChatModel(member(server, api_key_env=None), transport=transport)
    assert isinstance(m, ChatModel)
    assert m.model_id == f"openai-compatible:test-model@{server.base_url}"
    r = asyncio.run(_chat_once(m, "hello"))
    assert r.ok and r.text == "echo: hello"
    assert server.records[0].authorization == "Bearer no-key"


def _settled_request_count(server: FakeOpenAIServer, expected: int, within_s: float = 10.0) -> int:
    """The server's request count once it reaches `expected` or stops changing for `within_s`."""
    deadline = time.monotonic() + within_s
    while server.request_count < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.1)  # one more look: a count above `expected` must show too
    return server.request_count


async def _chat_once(m: OpenAICompatibleChatModel, text: str) -> ChatResponse:
    try:
        return await m.chat(ask(text), SamplingParams())
    finally:
        await m.aclose()


# -- one call, every kind of reply ------------------------------------------------------------------
def test_ok_reply_tokens_and_cost(server, api_key, transport):
    m = OpenAICompatibleChatModel(member(server), transport=transport)
    r = asyncio.run(_chat_once(m, "what is 2+2?"))
    pt, ct = expected_usage("what is 2+2?")
    assert r == ChatResponse(text="echo: what is 2+2?", ok=True, prompt_tokens=pt, completion_tokens=ct,
                             cost_usd=(pt * PRICE_IN + ct * PRICE_OUT) / 1e6, latency_s=r.latency_s,
                             model=m.model_id)
    assert 0 < r.latency_s < 5
    assert m.totals.calls == 1 and m.totals.attempts == 1 and m.totals.retries == 0


@pytest.mark.parametrize("mode, reason, billed", [
    ("500", "http 500: upstream failure 500", False),
    ("503", "http 503", False),
    ("429:0", "http 429", False),
    ("429quota", "exceeded your current quota", False),
    ("401echo", "http 401: Incorrect API key provided", False),
    ("hang", "timeout after 0.4s", False),
    ("truncated", "malformed reply: truncated JSON", False),
    ("empty_choices", "empty reply: no choices", True),
    ("null_content", "empty reply: null content (finish_reason='length')", True),
    ("drop", "connection error", False),
])
def test_each_failure_is_a_response_with_reason(server, api_key, transport, mode, reason, billed):
    m = fast(member(server, model=f"fake:{mode}", timeout_s=0.4, max_retries=0), transport=transport)
    r = asyncio.run(_chat_once(m, "q"))
    assert isinstance(r, ChatResponse) and not r.ok and r.text == ""
    assert reason in r.error
    assert (r.prompt_tokens > 0) == billed
    assert r.cost_usd == pytest.approx((r.prompt_tokens * PRICE_IN + r.completion_tokens * PRICE_OUT) / 1e6)
    # a timed-out request may be read by the server's thread after the client gave up (a loaded machine)
    assert _settled_request_count(server, 1) == 1
    assert m.totals.failed_calls == 1 and m.totals.retries == 0


@pytest.mark.parametrize("mode, attempts", [
    ("503", 3), ("500", 3), ("429:0", 3), ("hang", 3), ("truncated", 3), ("drop", 3),  # transient: retried
    ("401echo", 1), ("429quota", 1), ("empty_choices", 1), ("null_content", 1),  # retrying would not help
])
def test_what_is_retried(server, api_key, transport, mode, attempts):
    # a short timeout only where the server hangs: elsewhere a loaded CI machine must not turn a slow
    # reply into a (retried) timeout
    timeout_s = 0.3 if mode == "hang" else 10.0
    m = fast(member(server, model=f"fake:{mode}", timeout_s=timeout_s, max_retries=2), transport=transport)
    r = asyncio.run(_chat_once(m, "q"))
    assert not r.ok
    assert _settled_request_count(server, attempts) == attempts
    assert m.totals.attempts == attempts and m.totals.retries == attempts - 1
    if attempts > 1:
        assert r.error.startswith(f"gave up after {attempts} attempts; last: ")


# -- many calls, mixed faults, exact books ----------------------------------------------------------
def test_mixed_faults_every_call_accounted(server, api_key, transport):
    transient = ["500", "503", "429:0", "drop", "truncated", "hang:3", "503", "500"]
    server.scripts = {"flaky": list(transient)}
    server.hang_s = 3.0

    async def run():
        gl = asyncio.Semaphore(6)
        flaky = fast(member(server, name="flaky", model="flaky", timeout_s=0.5, max_retries=len(transient),
                            max_concurrency=4), gl, transport=transport)
        down = fast(member(server, name="down", model="fake:503", max_retries=2, max_concurrency=2), gl,
                    transport=transport)
        empty = fast(member(server, name="empty", model="fake:empty_choices", max_retries=2), gl,
                     transport=transport)
        calls = [(flaky, f"flaky {i}") for i in range(30)] + [(down, f"down {i}") for i in range(5)] + \
                [(empty, f"empty {i}") for i in range(5)]
        try:
            rs = await asyncio.gather(*(mdl.chat(ask(q), SamplingParams(seed=i)) for i, (mdl, q) in enumerate(calls)))
        finally:
            for mdl in (flaky, down, empty):
                await mdl.aclose()
        return flaky, down, empty, calls, rs

    flaky, down, empty, calls, rs = asyncio.run(run())
    assert len(rs) == len(calls) and all(isinstance(r, ChatResponse) for r in rs)
    flaky_rs, down_rs, empty_rs = rs[:30], rs[30:35], rs[35:]

    # flaky: every transient fault absorbed by a retry; every answer is the right one
    assert all(r.ok for r in flaky_rs)
    assert [r.text for r in flaky_rs] == [f"echo: flaky {i}" for i in range(30)]
    assert flaky.totals == dataclasses.replace(
        flaky.totals, calls=30, ok_calls=30, failed_calls=0, attempts=30 + len(transient), retries=len(transient))
    # down: each call tried 1 + max_retries times, then a recorded failure
    assert all(not r.ok and r.error.startswith("gave up after 3 attempts; last: http 503") for r in down_rs)
    assert (down.totals.calls, down.totals.failed_calls, down.totals.attempts, down.totals.retries) == (5, 5, 15, 10)
    # empty: billed, failed, not retried
    assert all(not r.ok and r.error == "empty reply: no choices" and r.prompt_tokens == 3 for r in empty_rs)
    assert (empty.totals.attempts, empty.totals.retries, empty.totals.prompt_tokens) == (5, 0, 15)

    # the server saw exactly the attempts we counted, and billed exactly the tokens we counted
    models = (flaky, down, empty)
    assert server.request_count == sum(m.totals.attempts for m in models) == 30 + len(transient) + 15 + 5
    client_pt = sum(m.totals.prompt_tokens for m in models)
    assert client_pt == server.billed_prompt_tokens == sum(r.prompt_tokens for r in rs)
    assert sum(m.totals.completion_tokens for m in models) == server.billed_completion_tokens
    want_pt = sum(expected_usage(f"flaky {i}")[0] for i in range(30)) + 15
    want_ct = sum(expected_usage(f"flaky {i}")[1] for i in range(30))
    assert server.billed_prompt_tokens == want_pt and server.billed_completion_tokens == want_ct
    assert sum(m.totals.cost_usd for m in models) == pytest.approx((want_pt * PRICE_IN + want_ct * PRICE_OUT) / 1e6,
                                                                   rel=1e-12)
    assert sum(m.totals.cost_usd for m in models) == pytest.approx(sum(r.cost_usd for r in rs), rel=1e-12)


# -- Retry-After -----------------------------------------------------------------------------------
def test_retry_after_seconds_is_honoured(server, api_key, transport):
    server.script = ["429:1", "ok"]
    m = fast(member(server, max_retries=1), transport=transport)
    r = asyncio.run(_chat_once(m, "q"))
    assert r.ok and m.totals.retries == 1
    first, second = server.records
    assert second.t_start - first.t_end >= 1.0, "retried before Retry-After elapsed"
    assert second.t_start >= first.retry_after_until
    assert r.latency_s >= 1.0


def test_retry_after_http_date_is_honoured(server, api_key, transport):
    server.script = ["429date:2", "ok"]
    m = fast(member(server, max_retries=1), transport=transport)
    r = asyncio.run(_chat_once(m, "q"))
    assert r.ok
    first, second = server.records
    assert first.retry_after_until is not None
    assert second.t_start >= first.retry_after_until - 0.005  # date has whole seconds; ~1-2 s wait
    assert second.t_start - first.t_end >= 0.9


def test_retry_after_beyond_cap_fails_fast(server, api_key):
    m = fast(member(server, model="fake:429:3600", max_retries=5), max_retry_after_s=60)
    t0 = time.monotonic()
    r = asyncio.run(_chat_once(m, "q"))
    assert time.monotonic() - t0 < 2
    assert not r.ok and "Retry-After 3600s exceeds" in r.error
    assert server.request_count == 1


def test_parse_retry_after_forms():
    now = 1_700_000_000.0
    assert parse_retry_after({"retry-after": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "0.5"}) == 0.5
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == pytest.approx(30.0)
    assert parse_retry_after({"retry-after": email.utils.formatdate(now - 30, usegmt=True)}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({}) is None


# -- concurrency -----------------------------------------------------------------------------------
def test_per_model_concurrency_limit(api_key, transport):
    with FakeOpenAIServer(latency_s=0.1) as srv:
        async def run():
            m = OpenAICompatibleChatModel(member(srv, max_concurrency=3), transport=transport)
            try:
                return await asyncio.gather(*(m.chat(ask(f"q{i}"), SamplingParams()) for i in range(15)))
            finally:
                await m.aclose()
        rs = asyncio.run(run())
        assert all(r.ok for r in rs)
        assert srv.max_in_flight == 3  # never more, and the limit was actually reached


def test_global_concurrency_limit(api_key, transport):
    with FakeOpenAIServer(latency_s=0.1) as srv:
        async def run():
            gl = asyncio.Semaphore(4)
            ms = [OpenAICompatibleChatModel(member(srv, name=f"m{k}", max_concurrency=3), gl, transport=transport)
                  for k in range(3)]
            try:
                return await asyncio.gather(*(ms[i % 3].chat(ask(f"q{i}"), SamplingParams()) for i in range(24)))
            finally:
                for m in ms:
                    await m.aclose()
        rs = asyncio.run(run())
        assert all(r.ok for r in rs)
        assert srv.max_in_flight == 4


def test_a_calls_seconds_leave_out_its_wait_for_a_free_slot(api_key, transport):
    """latency_s is what a call cost the endpoint, not how long it queued behind the pool's own limits: with one slot
    and three calls at once the third waits two calls' time, yet records about one (the evaluation's seconds per task
    and the cost-aware reward read this figure)."""
    with FakeOpenAIServer(latency_s=0.4) as srv:
        async def run():
            m = OpenAICompatibleChatModel(member(srv, max_concurrency=1), transport=transport)
            try:
                t0 = time.monotonic()
                rs = await asyncio.gather(*(m.chat(ask(f"q{i}"), SamplingParams()) for i in range(3)))
                return rs, time.monotonic() - t0
            finally:
                await m.aclose()
        rs, wall = asyncio.run(run())
        assert all(r.ok for r in rs) and srv.max_in_flight == 1
        assert wall >= 1.2
        assert all(0.4 <= r.latency_s < 0.75 for r in rs), [r.latency_s for r in rs]


# -- the secret test -------------------------------------------------------------------------------
def test_api_key_never_leaks(server, api_key, transport, caplog, capfd):
    """Plant a key, log everything at DEBUG (ours, openai, httpx2/httpcore2 and their legacy names), run
    calls that succeed and fail in every way (including a proxy that echoes the Authorization header
    back), and look for the key, and for either half of its random part, everywhere we produce text."""
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "openai._base_client", "httpx2", "httpcore2", "httpx", "httpcore", "aiohttp", "trinity"):
        caplog.set_level(logging.DEBUG, logger=name)
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")

    modes = ["ok", "500", "503", "429:0", "401echo", "hang", "truncated", "empty_choices", "null_content", "drop",
             "429quota", "bogus"]

    async def run():
        models = [fast(member(server, name=f"m-{mode}", model=f"fake:{mode}", timeout_s=0.3, max_retries=1),
                       transport=transport)
                  for mode in modes]
        try:
            rs = await asyncio.gather(*(m.chat(ask("secret test"), SamplingParams()) for m in models))
        finally:
            for m in models:
                await m.aclose()
        return models, rs

    models, rs = asyncio.run(run())
    assert server.records and all(rec.authorization == f"Bearer {api_key}" for rec in server.records), \
        "the key was not actually sent: the test would prove nothing"
    assert sum(r.ok for r in rs) == 1 and len(rs) == len(modes)
    assert any("Incorrect API key provided" in (r.error or "") for r in rs)

    texts: list[str] = []
    for rec in caplog.records:
        texts.append(formatter.format(rec))
        texts.append(repr(rec.__dict__))
    assert any(rec.name.startswith("openai") for rec in caplog.records), "openai debug logs were not captured"
    if transport == "httpx":
        assert any(rec.name.startswith(("httpx", "httpcore")) for rec in caplog.records), "http logs not captured"
    texts += [repr(r) for r in rs] + [str(dataclasses.asdict(r)) for r in rs]
    texts += [repr(m) for m in models] + [str(m) for m in models] + [repr(vars(m)) for m in models]
    texts += [repr(m.client) for m in models] + [repr(vars(m.client)) for m in models]  # the client holds the key
    texts += [repr(m.totals) for m in models]
    out, err = capfd.readouterr()
    texts += [out, err]

    # exceptions our code raises must not carry it either
    for bad in (dict(backend="local"), dict(max_concurrency=0)):
        try:
            OpenAICompatibleChatModel(member(server, **bad))
        except Exception as e:  # noqa: BLE001
            texts += [str(e), repr(e)]
    try:
        check_pool_config(PoolSettings.model_construct(
            members=[PoolMember.model_construct(**{**member(server).model_dump(), "backend": "grpc"})],
            max_concurrency=0))
    except PoolConfigError as e:
        texts += [str(e), repr(e)]

    random_part = api_key.split("-")[-1]
    needles = [api_key, random_part[:16], random_part[16:]]
    for text in texts:
        for needle in needles:
            assert needle not in text, f"key material leaked into: {text[:300]}"


# -- redaction -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Row:
    note: str
    tags: tuple[str, ...]


def test_redact_env_values_shapes_and_fields(monkeypatch):
    monkeypatch.setenv("MY_POOL_KEY", "plain-secret-value-123")
    register_secret_env_names(["MY_POOL_KEY"])
    openai_like = "sk-proj-" + "A1b2C3d4" * 4
    google_like = "AIza" + "x" * 35
    obj = {
        "msg": "calling with plain-secret-value-123 now",
        "nested": [{"deep": f"Authorization: Bearer {openai_like}"}, ("tuple plain-secret-value-123",)],
        "api_key": "anything at all",
        "Authorization": "whatever",
        "row": _Row(note=f"g={google_like}", tags=("ok", openai_like)),
        "n": 3,
        "none": None,
    }
    before = repr(obj)
    out = redact(obj)
    assert repr(obj) == before  # input untouched
    assert out["msg"] == "calling with [REDACTED:MY_POOL_KEY] now"
    assert "plain-secret-value-123" not in repr(out)
    assert openai_like not in repr(out) and google_like not in repr(out)
    assert out["api_key"] == "[REDACTED]" and out["Authorization"] == "[REDACTED]"
    assert isinstance(out["row"], _Row) and out["row"].tags[0] == "ok"
    assert out["n"] == 3 and out["none"] is None
    # ordinary text survives
    assert redact_text("the sky is blue; task-id 42") == "the sky is blue; task-id 42"
    # an extra secret passed explicitly is removed even if no env var holds it
    assert redact_text("x=abcdef123456", extra_secrets=["abcdef123456"]) == "x=[REDACTED]"


def test_redacting_filter_scrubs_log_records(monkeypatch, caplog):
    monkeypatch.setenv("MY_POOL_KEY", "plain-secret-value-123")
    register_secret_env_names(["MY_POOL_KEY"])
    logger = logging.getLogger("trinity.test.redact")
    flt = RedactingFilter()
    logger.addFilter(flt)
    try:
        with caplog.at_level(logging.INFO, logger="trinity.test.redact"):
            logger.info("key is %s", "plain-secret-value-123")
            try:
                raise RuntimeError("boom plain-secret-value-123")
            except RuntimeError:
                logger.exception("failed")
    finally:
        logger.removeFilter(flt)
    assert "plain-secret-value-123" not in caplog.text
    assert "[REDACTED:MY_POOL_KEY]" in caplog.text


def test_one_model_serves_several_event_loops(server, api_key):
    """Training runs one asyncio loop per generation: the same member must keep working across them."""
    from trinity.config import PoolSettings
    from trinity.pool.runtime import build_pool

    settings = PoolSettings(members=[member(server, model="loops", timeout_s=10.0, max_retries=0)], max_concurrency=2)
    pool = build_pool(settings, store=None)
    from trinity.records import ChatMessage
    for i in range(3):
        r = asyncio.run(pool.complete(0, [ChatMessage("user", f"q{i}")]))
        assert r.ok, r.error


def test_verifier_asks_for_structured_verdict_and_reads_it(api_key, transport):
    """A Verifier request carries response_format (OpenAI structured outputs: a strict JSON schema with "reason"
    and an ACCEPT/REJECT "verdict"), and the JSON reply is read as the verdict. Other roles send no
    response_format and keep the store key they had before output formats existed (no identity entry)."""
    from trinity.coordinator.roles import Role, Turn, role_messages, turn_of
    from trinity.coordinator.role_sampling import RoleSampling
    from trinity.verdict import VERDICT_RESPONSE_FORMAT
    from trinity.pool.runtime import Pool
    from trinity.records import Task
    from trinity.store import response_key

    def reply(messages):
        last = str(messages[-1].get("content") or "")
        return '{"reason": "2 + 3 is 5.", "verdict": "ACCEPT"}' if "Verdict: ACCEPT" in last else "\\boxed{5}"

    task = Task(id="t/1", source="gsm8k", prompt=("What is 2+3?",), grader="math", answer="5")
    worker_msgs = role_messages(Role.WORKER, task, ())
    verifier_msgs = role_messages(Role.VERIFIER, task, (Turn("m", Role.WORKER, "\\boxed{5}"),))
    with FakeOpenAIServer(reply=reply) as srv:
        m = member(srv)
        model = fast(m, transport=transport)
        pool, roles = Pool([model], [m], None), RoleSampling.capped({"verifier": 48})

        async def go():
            try:
                w = await roles.complete(pool, 0, worker_msgs, Role.WORKER)
                v = await roles.complete(pool, 0, verifier_msgs, Role.VERIFIER)
                return w, v
            finally:
                await model.aclose()
        w, v = asyncio.run(go())
        assert [r.response_format for r in srv.records] == [None, VERDICT_RESPONSE_FORMAT]
    assert VERDICT_RESPONSE_FORMAT["type"] == "json_schema" and VERDICT_RESPONSE_FORMAT["json_schema"]["strict"]
    schema = VERDICT_RESPONSE_FORMAT["json_schema"]["schema"]
    assert schema["properties"]["verdict"]["enum"] == ["ACCEPT", "REJECT"]
    assert schema["required"] == ["reason", "verdict"] and schema["additionalProperties"] is False
    assert w.ok and w.text == "\\boxed{5}"
    assert v.ok and turn_of("m", Role.VERIFIER, v).verdict == "ACCEPT"
    assert roles.key(pool, 0, worker_msgs, Role.WORKER) == response_key(model.model_id, worker_msgs,
                                                                         roles.sampling(pool, 0, Role.WORKER))
    verifier = roles.sampling(pool, 0, Role.VERIFIER)
    assert roles.key(pool, 0, verifier_msgs, Role.VERIFIER) == response_key(
        model.model_id, verifier_msgs, verifier, {"response_format": VERDICT_RESPONSE_FORMAT})


def test_structured_output_off_sends_no_response_format_and_reads_the_text_field(api_key, transport):
    """`structured_output: false` (a server that rejects response_format): the Verifier request carries none, its
    key differs from the constrained one, and the reply's last `Verdict:` line is read."""
    from trinity.coordinator.role_sampling import RoleSampling
    from trinity.coordinator.roles import Role, Turn, role_messages, turn_of
    from trinity.pool.runtime import Pool
    from trinity.records import Task

    roles = RoleSampling.capped({"verifier": 48})
    task = Task(id="t/1", source="gsm8k", prompt=("What is 2+3?",), grader="math", answer="5")
    verifier_msgs = role_messages(Role.VERIFIER, task, (Turn("m", Role.WORKER, "\\boxed{5}"),))
    with FakeOpenAIServer(reply=lambda messages: "2 + 3 is 5.\nVerdict: ACCEPT") as srv:
        on, off = member(srv), member(srv).model_copy(update={"structured_output": False})
        pools = []
        for m in (on, off):
            model = fast(m, transport=transport)
            pools.append((Pool([model], [m], None), model))

        async def go():
            try:
                return await roles.complete(pools[1][0], 0, verifier_msgs, Role.VERIFIER)
            finally:
                for _, model in pools:
                    await model.aclose()
        v = asyncio.run(go())
        assert [r.response_format for r in srv.records] == [None]
    assert v.ok and turn_of("m", Role.VERIFIER, v).verdict == "ACCEPT"
    assert roles.key(pools[0][0], 0, verifier_msgs, Role.VERIFIER) != roles.key(pools[1][0], 0, verifier_msgs,
                                                                               Role.VERIFIER)


def test_observers_see_every_reply_after_one_store_lookup_per_request():
    """`Pool.observe` reports each reply (request order, whether the store held it) from the one lookup
    `complete_many` makes; every call runs on the process's HTTP loop, whichever loop or thread asks."""
    import threading

    from trinity.pool.runtime import Pool

    class Store:
        def __init__(self):
            self.rows, self.lookups = {}, 0

        def get_response(self, key):
            self.lookups += 1
            return self.rows.get(key)

        def put_response(self, key, model_id, role, messages, sampling, resp):
            self.rows[key] = resp

    class Echo:
        name, model_id = "echo", "echo@1"

        def __init__(self):
            self.loops = []

        async def chat(self, messages, sampling):
            self.loops.append(asyncio.get_running_loop())
            return ChatResponse(text=messages[-1].content, ok=True)

    store, echo = Store(), Echo()
    pool = Pool([echo], [PoolMember(name="echo", backend="local", model="x")], store)
    reqs = [pool.request(0, ask(q), label="worker") for q in ("a", "b", "a")]
    seen = []
    with pool.observe(lambda r, resp, stored: seen.append((r.key, resp.text, stored))):
        asyncio.run(pool.complete_many(reqs))
        assert store.lookups == 3 and [s for *_, s in seen] == [False, False, False]
        asyncio.run(pool.complete_many(reqs[:2]))
    assert store.lookups == 5 and seen[3:] == [(reqs[0].key, "a", True), (reqs[1].key, "b", True)]
    from trinity.pool.http_loop import http_loop

    assert [t for _, t, _ in seen[:3]] == ["a", "b", "a"] and echo.loops == [http_loop()] * 2
    asyncio.run(pool.complete_many(reqs[:1]))
    assert len(seen) == 5  # outside the block: not observed

    out = []

    def episode():  # an "episode" asks from a thread and loop of its own: its call still runs on the HTTP loop
        with pool.observe(lambda r, resp, stored: out.append(stored)):
            asyncio.run(pool.complete(0, ask("c")))

    thread = threading.Thread(target=episode)
    thread.start()
    thread.join()
    assert echo.loops[-1] is http_loop() and out == [False]


def test_tally_counts_each_callers_own_calls_and_a_call_shared_in_flight_once():
    """`Pool.tally`: callers running at the same time each see the calls they paid and the lookups they were
    spared; a request two of them have in flight together is one call, paid by whoever asked first, a hit for
    the other; the tallies add up to the pool's own stats."""
    from trinity.pool.runtime import Pool

    class Slow:
        name, model_id = "slow", "slow@1"

        def __init__(self):
            self.calls = 0

        async def chat(self, messages, sampling):
            self.calls += 1
            await asyncio.sleep(0.05)
            return ChatResponse(text=messages[-1].content, ok=messages[-1].content != "bad", completion_tokens=3)

    slow = Slow()
    pool = Pool([slow], [PoolMember(name="slow", backend="local", model="x")], None)

    def req(q):
        return pool.request(0, ask(q), label="worker")

    async def caller(qs, delay):
        await asyncio.sleep(delay)
        with pool.tally() as mine:
            await pool.complete_many([req(q) for q in qs])
            with pool.tally() as inner:  # nested: counted in both
                await pool.complete(0, ask("inner-" + qs[-1]))
        return mine, inner

    async def main():
        return await asyncio.gather(caller(["shared", "a", "a", "bad"], 0.0), caller(["shared", "b"], 0.01))

    (first, first_inner), (second, second_inner) = asyncio.run(main())
    assert slow.calls == 6 == pool.stats.calls_made
    assert (first.calls_made, first.store_hits, first.failures) == (4, 1, 1)  # shared, a, bad, inner; "a" twice
    assert (second.calls_made, second.store_hits) == (2, 1)  # b, inner; "shared" was in flight: a hit
    assert first_inner.calls_made == second_inner.calls_made == 1 and first_inner.store_hits == 0
    assert first.calls_made + second.calls_made == pool.stats.calls_made
    assert first.store_hits + second.store_hits == pool.stats.store_hits
    assert first.completion_tokens + second.completion_tokens == pool.stats.completion_tokens == 18
    assert first.calls_by_model == {"slow": 4}


def test_capped_answers_cap_worker_and_direct_calls_only(api_key, tmp_path):
    """`RoleSampling.answers_capped` (serving's max_tokens): Worker and direct calls get the cap (the member's own
    lower cap still wins), Thinker and Verifier keep theirs; the capped requests have keys of their own, on the same
    pool (store and stats)."""
    from trinity.coordinator.role_sampling import RoleSampling
    from trinity.pool.runtime import build_pool
    from trinity.store import Store

    with FakeOpenAIServer(honour_max_tokens=True) as srv, Store(tmp_path / "s.duckdb") as store:
        settings = PoolSettings(members=[member(srv, max_tokens=100), member(srv, name="small", max_tokens=4)])
        pool, roles = build_pool(settings, store), RoleSampling.capped({"thinker": 32, "verifier": 16})
        capped = roles.answers_capped(10)
        assert [capped.sampling(pool, 0, r).max_tokens for r in (None, "worker", "thinker", "verifier")] == [10, 10, 32, 16]
        assert capped.sampling(pool, 1, "worker").max_tokens == 4 and roles.sampling(pool, 0, "worker").max_tokens == 100
        q = [ChatMessage("user", "x" * 200)]
        assert capped.key(pool, 0, q, "worker") != roles.key(pool, 0, q, "worker")
        assert capped.key(pool, 0, q, "thinker") == roles.key(pool, 0, q, "thinker")
        r = asyncio.run(capped.complete(pool, 0, q, "worker"))
        assert srv.records[-1].max_tokens == 10 and r.completion_tokens == 10
        assert pool.stats.calls_made == 1 and store.get_response(capped.key(pool, 0, q, "worker")) is not None
        assert asyncio.run(roles.complete(pool, 0, q, "worker")).completion_tokens > 10  # uncapped: the member's
        for bad in (0, -1, 2.5, True):
            with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
                roles.answers_capped(bad)
