"""`trinity serve` end to end: a real server process on 127.0.0.1 (started by the test through the CLI), the real
bundled encoder (SmolLM2-135M), a checkpoint written by the real `save_checkpoint`, pool members served over real
HTTP by tests/fixtures/fake_openai_server.py (fast, failing on demand, and cutting replies at the request's max_tokens),
and the clients users run: the official `openai` client (sync, async, streaming), LangChain's `ChatOpenAI` and
LiteLLM (plain and streaming, with and without sampling fields); raw HTTP for the error cases.

The checkpoint's head reads only the bias feature of a standardising feature map (mean 0, scale 1), so its picks
are known: member `alpha` every turn, role Thinker unless forced. The fake Thinker always suggests a Worker, so an
episode is Thinker → Worker → Thinker (max_turns 3): three calls, the answer from the Worker. The params return the
latest answer (`coordinator.answer_rule: latest`), so an episode runs on past its answer: a trace with a turn after
the answer (under the default, "first", it would end there).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from fixtures.fake_openai_server import FakeOpenAIServer

from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.coordinator.policy import save_checkpoint

pytestmark = pytest.mark.timeout(300)

HIDDEN = 576
"""SmolLM2-135M's hidden size: the head reads [h (576), bias]."""
MEMBERS = ("alpha", "beta", "broken")
THINKER_REPLY = "<suggestion>Add the numbers carefully.</suggestion><suggested_role>worker</suggested_role>"
API_KEY = "trinity-test-key-" + secrets.token_hex(12)
MAX_BODY = 4096


def worker_reply(question: str) -> str:
    return f"Answer: 42 (to: {question})"


class PoolReplies:
    """The fake members' replies by role prompt; records the messages every call carried."""

    def __init__(self):
        self.seen: list[list[dict]] = []
        self._lock = threading.Lock()

    def __call__(self, messages: list[dict]) -> str:
        with self._lock:
            self.seen.append(messages)
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
        if "strategic thinker" in system:
            return THINKER_REPLY
        if "strict verifier" in system:
            return "The answer is right.\nVerdict: ACCEPT"
        return worker_reply(str(messages[-1]["content"]).split("\n\n")[0])


def write_params(path: Path, base_url: str, max_turns: int = 3) -> Path:
    members = "\n".join(
        f"    - {{name: {name}, backend: openai, model: '{model}', base_url: '{base_url}', max_retries: 0, "
        f"timeout_s: 20, max_concurrency: 4}}"
        for name, model in zip(MEMBERS, ("fake-a", "fake-b", "fake:503")))
    path.write_text(f"pool:\n  max_concurrency: 8\n  members:\n{members}\n"
                    f"coordinator:\n  max_turns: {max_turns}\n  max_encode_tokens: 384\n  answer_rule: latest\n"
                    f"  thinker_max_tokens: 32\n  verifier_max_tokens: 16\n  feature_norm: standardize\n")
    return path


def write_checkpoint(stem: Path, members=MEMBERS, model: int = 0, role: int = 0, encoder: str | None = None) -> Path:
    """A checkpoint whose head always picks member `model` and role `role` (0 Thinker, 1 Worker, 2 Verifier).
    `encoder`: the encoder id it names (None: it names none, and is played with the encoder the params configure;
    its id depends on the installed transformers, so a test that has the encoder loaded passes its id)."""
    n = len(members)
    W = np.zeros((n + 3, HIDDEN + 1))
    W[model, -1] = 1.0
    W[n + role, -1] = 1.0
    save_checkpoint(stem, W.ravel(), CheckpointMeta.model_validate({
        "pool": [{"name": m} for m in members], **({"encoder": encoder} if encoder is not None else {}),
        "features": {"norm": "standardize", "mean": [0.0] * HIDDEN, "scale": [1.0] * HIDDEN, "bias": 1.0}}))
    return stem


class ServerProcess:
    """`trinity serve --port 0` in a child process; its log (stdout + stderr) collected line by line."""

    def __init__(self, args: list[str], env: dict, startup_s: float = 240):
        self.proc = subprocess.Popen([sys.executable, "-m", "trinity.cli", "serve", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.base_url = ""
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(startup_s) or not self.base_url:
            self.stop()
            pytest.fail(f"trinity serve did not start:\n{self.log}")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            m = re.search(r"listening on (http://\S+)", line)
            if m:
                self.base_url = m.group(1)
                self._ready.set()
        self._ready.set()  # the process ended

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.2)  # the reader thread drains the last lines
        return self.proc.returncode


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    replies = PoolReplies()
    fake = FakeOpenAIServer(reply=replies, honour_max_tokens=True).start()
    d = tmp_path_factory.mktemp("serve")
    params = write_params(d / "params.yaml", fake.base_url)
    write_checkpoint(d / "checkpoints" / "coordinator")
    env = {**os.environ, "TRINITY_API_KEY": API_KEY}
    env.setdefault("TRINITY_TORCH_THREADS", "1")  # one encoder thread: fast whatever else loads the machine
    server = ServerProcess(["--params", str(params), "--checkpoint", str(d / "checkpoints"),
                            "--store", str(d / "store" / "trinity.duckdb"), "--max-body-bytes", str(MAX_BODY)], env)
    yield {"fake": fake, "replies": replies, "server": server, "dir": d, "params": params}
    server.stop()
    fake.stop()


@pytest.fixture
def client(setup):
    with openai.OpenAI(base_url=setup["server"].base_url, api_key=API_KEY, max_retries=0, timeout=120) as c:
        yield c


def _http(setup) -> httpx.Client:
    return httpx.Client(base_url=setup["server"].base_url, timeout=120,
                        headers={"Authorization": f"Bearer {API_KEY}"})


def _fail_next(fake: FakeOpenAIServer, model: str, modes: list[str]) -> None:
    with fake._lock:
        fake.scripts[model] = list(modes)


def test_models_lists_trinity_and_every_member(client):
    assert [m.id for m in client.models.list().data] == ["trinity", *MEMBERS]
    assert client.models.retrieve("alpha").id == "alpha"


def test_completion_is_the_worker_answer_with_usage_and_trace_and_a_repeat_is_served_from_the_store(setup, client):
    fake = setup["fake"]
    q = "What is 40 plus 2?"
    calls0, billed0 = fake.request_count, fake.stats()
    r = client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q}])
    assert r.object == "chat.completion" and r.model == "trinity"
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == worker_reply(q)
    tr = r.model_extra["trinity"]
    assert [(t["model"], t["role"]) for t in tr["turns"]] == [("alpha", "thinker"), ("alpha", "worker"),
                                                             ("alpha", "thinker")]
    assert tr["answered_by"] == "alpha" and tr["outcome"] == "answered" and tr["episode_id"].startswith("ep-")
    assert all(t["ok"] and not t["stored"] and t["latency_s"] > 0 and t["verdict"] is None for t in tr["turns"])
    assert tr["fresh_replies"] == 3 == fake.request_count - calls0
    # usage: summed over every pool call, equal to what the endpoint billed
    billed = fake.stats()
    assert r.usage.prompt_tokens == billed["billed_prompt_tokens"] - billed0["billed_prompt_tokens"] \
        == sum(t["prompt_tokens"] for t in tr["turns"])
    assert r.usage.completion_tokens == billed["billed_completion_tokens"] - billed0["billed_completion_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    again = client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q}])
    assert fake.request_count == calls0 + 3  # no new pool call
    tr2 = again.model_extra["trinity"]
    assert again.choices[0].message.content == r.choices[0].message.content and again.id == r.id
    assert tr2["fresh_replies"] == 0 and all(t["stored"] for t in tr2["turns"])
    assert again.usage == r.usage  # a stored reply keeps its recorded figures


def test_streaming_sends_a_role_chunk_turns_content_deltas_usage_and_done(setup, client):
    q = "What is 50 minus 8?"
    chunks = list(client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q}],
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    turns = [c.model_extra["trinity"]["turn"] for c in chunks if "turn" in (c.model_extra.get("trinity") or {})]
    assert [(t["index"], t["model"], t["role"]) for t in turns] == [(0, "alpha", "thinker"), (1, "alpha", "worker"),
                                                                    (2, "alpha", "thinker")]
    content = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(content) == worker_reply(q) and len(content) > 1  # deltas, not one blob
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason == "stop"]
    assert len(final) == 1 and final[0].model_extra["trinity"]["answered_by"] == "alpha"
    assert len({c.id for c in chunks}) == 1
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage.total_tokens == sum(
        t["prompt_tokens"] + t["completion_tokens"] for t in turns)
    with _http(setup) as http:  # the wire format itself: SSE data lines ending with [DONE]
        body = http.post("/chat/completions", json={"model": "trinity", "stream": True,
                                                    "messages": [{"role": "user", "content": q}]})
    assert body.status_code == 200 and body.headers["content-type"].startswith("text/event-stream")
    events = [e for e in body.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


def test_concurrent_async_requests_share_one_pool(setup):
    fake = setup["fake"]
    same = "What is 6 times 7?"
    others = ["What is 84 divided by 2?", "What is 21 plus 21?"]
    calls0 = fake.request_count

    async def run():
        async with openai.AsyncOpenAI(base_url=setup["server"].base_url, api_key=API_KEY, max_retries=0,
                                      timeout=180) as c:
            return await asyncio.gather(*(c.chat.completions.create(
                model="trinity", messages=[{"role": "user", "content": q}]) for q in [same] * 4 + others))

    rs = asyncio.run(run())
    assert [r.choices[0].message.content for r in rs] == [worker_reply(q) for q in [same] * 4 + others]
    assert len({r.model_extra["trinity"]["episode_id"] for r in rs[:4]}) == 1
    assert fake.request_count - calls0 == 3 * 3  # identical concurrent episodes share their calls


def test_the_whole_conversation_drives_the_episode(setup, client):
    replies = setup["replies"]
    n0 = len(replies.seen)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "I have 40 apples."},
                {"role": "assistant", "content": "Noted: 40 apples."},
                {"role": "user", "content": [{"type": "text", "text": "I buy 2 more. How many now?"}]}]
    r = client.chat.completions.create(model="trinity", messages=messages)
    assert r.choices[0].message.content == worker_reply("I buy 2 more. How many now?")
    worker = next(m for m in replies.seen[n0:] if m[0]["content"].startswith("You are a careful expert"))
    assert [(m["role"], m["content"]) for m in worker[1:3]] == [("user", "Be brief.\n\nI have 40 apples."),
                                                                ("assistant", "Noted: 40 apples.")]
    thinker = next(m for m in replies.seen[n0:] if "strategic thinker" in m[0]["content"])
    assert "Conversation so far" in thinker[-1]["content"] and "I have 40 apples." in thinker[-1]["content"]
    alone = client.chat.completions.create(model="trinity", messages=[messages[-1]])
    assert alone.model_extra["trinity"]["episode_id"] != r.model_extra["trinity"]["episode_id"]


ERROR_CASES = [
    # (body or raw bytes, status, code, param)
    (b"{not json", 400, "invalid_json", None),
    (b"", 400, "invalid_json", None),
    ([1, 2], 400, "invalid_body", None),
    ({"model": "trinity"}, 400, "invalid_messages", "messages"),
    ({"model": "trinity", "messages": []}, 400, "invalid_messages", "messages"),
    ({"model": "trinity", "messages": "hi"}, 400, "invalid_messages", "messages"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "missing_model", "model"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, 404, "model_not_found", "model"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, 400,
     "unsupported_parameter", "tools"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"}, 400,
     "unsupported_parameter", "tool_choice"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}],
      "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": {}}}}, 400,
     "unsupported_parameter", "response_format"),
    ({"model": "alpha", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400,
     "unsupported_parameter", "logprobs"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400,
     "invalid_value", "max_tokens"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": "10"}, 400,
     "invalid_value", "max_completion_tokens"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, 400,
     "invalid_value", "stream"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "unsupported_parameter", "n"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}], "answer_format": "essay"}, 400,
     "invalid_value", "answer_format"),
    ({"model": "trinity", "messages": [{"role": "tool", "content": "x"}]}, 400, "invalid_messages",
     "messages[0].role"),
    ({"model": "trinity", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 400,
     "invalid_messages", "messages[0].content[0]"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
     400, "invalid_messages", "messages[1]"),
    ({"model": "trinity", "messages": [{"role": "user", "content": "x" * MAX_BODY}]}, 413, "request_too_large", None),
]


def test_bad_requests_get_openai_shaped_errors_with_the_right_status(setup):
    with _http(setup) as http:
        for body, status, code, param in ERROR_CASES:
            if isinstance(body, bytes):
                r = http.post("/chat/completions", content=body, headers={"Content-Type": "application/json"})
            else:
                r = http.post("/chat/completions", json=body)
            assert r.status_code == status, (body, r.text)
            err = r.json()["error"]
            assert (err["code"], err["param"]) == (code, param), (body, err)
            assert err["message"] and err["type"] == "invalid_request_error"
            assert r.headers["x-should-retry"] == "false"  # the OpenAI SDKs would otherwise retry a 5xx
            if code in ("invalid_value", "unsupported_parameter", "missing_model"):
                assert f"'{param}'" in err["message"], err  # the message names the field
        chunked = http.post("/chat/completions", content=iter([b"x" * 3000, b"x" * 3000]))  # no Content-Length
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "request_too_large"
        assert http.get("/nowhere").json()["error"]["code"] == "not_found"
        assert http.get("/models").status_code == 200  # still healthy


def test_a_missing_or_wrong_key_gets_401(setup):
    url = setup["server"].base_url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(f"{url}/chat/completions", headers=headers,
                       json={"model": "trinity", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["type"] == "authentication_error" and r.json()["error"]["code"] == "invalid_api_key"
        assert httpx.get(f"{url}/models", headers=headers).status_code == 401
    with openai.OpenAI(base_url=url, api_key="not-the-key", max_retries=0) as c:
        with pytest.raises(openai.AuthenticationError):
            c.models.list()


def test_a_pool_failure_is_a_502_naming_the_member_and_the_reason(setup, client):
    fake = setup["fake"]
    with _http(setup) as http:
        r = http.post("/chat/completions", json={"model": "broken", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 502
        err = r.json()["error"]
        assert err["members"] == [{"member": "broken", "reason": "http 503: upstream failure 503"}]
        assert "'broken'" in err["message"] and "503" in err["message"] and err["code"] == "pool_failure"
        assert r.headers["x-should-retry"] == "true"  # an outage: asking again may succeed

        _fail_next(fake, "fake-a", ["400"])  # a deterministic failure: asking again gives the same
        r = http.post("/chat/completions", json={"model": "alpha", "messages": [{"role": "user", "content": "long"}]})
        assert r.status_code == 502 and r.headers["x-should-retry"] == "false", r.text

        q = "What is 43 minus 1?"
        _fail_next(fake, "fake-a", ["503"] * 3)
        r = http.post("/chat/completions", json={"model": "trinity", "messages": [{"role": "user", "content": q}]})
        assert r.status_code == 502, r.text
        err = r.json()["error"]
        assert {m["member"] for m in err["members"]} == {"alpha"} and "upstream failure 503" in err["message"]
        assert [(t["ok"], t["failure"]) for t in err["trinity"]["turns"]] == [(False, "transient")] * 3
        assert r.headers["x-should-retry"] == "true"
    # an outage is not stored: asked again, the same conversation is answered
    assert client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q}]) \
        .choices[0].message.content == worker_reply(q)

    _fail_next(fake, "fake-a", ["503"] * 3)  # after the stream started, the failure is an error event
    stream = client.chat.completions.create(model="trinity", stream=True,
                                            messages=[{"role": "user", "content": "What is 44 minus 2?"}])
    with pytest.raises(openai.APIError, match="alpha"):
        list(stream)


def test_health_needs_no_key_and_names_what_is_served(setup):
    r = httpx.get(setup["server"].base_url.removesuffix("/v1") + "/health", timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "ok" and body["models"] == ["trinity", *MEMBERS] and body["checkpoint"]
    assert API_KEY not in r.text


def test_sampling_fields_are_ignored_and_named_and_max_tokens_caps_the_answer(setup, client):
    fake = setup["fake"]
    q = "What is 39 plus 3?"
    raw = client.chat.completions.with_raw_response.create(
        model="trinity", messages=[{"role": "user", "content": q}], temperature=0.1, top_p=0.5, seed=7, stop=["\n"],
        user="someone", presence_penalty=0.5, extra_body={"top_k": 5})
    assert raw.headers["x-trinity-ignored-fields"] == "presence_penalty,seed,stop,temperature,top_k,top_p,user"
    sampled = raw.parse()
    plain = client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q}])
    assert "x-trinity-ignored-fields" not in client.chat.completions.with_raw_response.create(
        model="trinity", messages=[{"role": "user", "content": q}]).headers
    assert sampled.choices[0].message.content == worker_reply(q) and sampled.id == plain.id  # they changed nothing
    assert plain.choices[0].finish_reason == "stop" and "max_tokens" not in plain.model_extra["trinity"]

    q2 = "What is 45 minus 3?"
    n0 = len(fake.records)
    capped = client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q2}], max_tokens=3)
    # the Worker's answer is capped; the Thinker turns keep their own cap (32)
    assert [(r.model, r.max_tokens) for r in fake.records[n0:]] == [("fake-a", 32), ("fake-a", 3), ("fake-a", 32)]
    assert capped.choices[0].message.content == worker_reply(q2)[:12] and capped.choices[0].finish_reason == "length"
    tr = capped.model_extra["trinity"]
    assert tr["max_tokens"] == 3 and tr["finish_reason"] == "length"
    assert [t["finish_reason"] for t in tr["turns"]] == ["stop", "length", "stop"]
    # the smaller of max_tokens and max_completion_tokens; a cap above the member's answer changes nothing
    both = client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q2}], max_tokens=50,
                                          max_completion_tokens=3)
    assert both.id == capped.id and len(fake.records) == n0 + 3  # the same episode, from the store
    roomy = client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q2}],
                                           max_completion_tokens=400)
    assert roomy.choices[0].message.content == worker_reply(q2) and roomy.choices[0].finish_reason == "stop"

    chunks = list(client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q2}],
                                                 max_tokens=3, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]

    d = client.chat.completions.create(model="beta", messages=[{"role": "user", "content": "hello capped beta"}],
                                       max_completion_tokens=2)
    assert fake.records[-1].max_tokens == 2 and d.choices[0].finish_reason == "length"
    assert d.choices[0].message.content == worker_reply("hello capped beta")[:8]


def test_langchain_chat_openai_plain_streaming_and_what_it_cannot_bind(setup):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    url = setup["server"].base_url
    q = "What is 30 plus 12?"
    for kwargs in ({}, {"temperature": 0.2, "max_tokens": 256, "top_p": 0.9}):
        llm = ChatOpenAI(model="trinity", base_url=url, api_key=API_KEY, max_retries=0, timeout=120, **kwargs)
        msg = llm.invoke(q)
        assert msg.content == worker_reply(q) and msg.response_metadata["finish_reason"] == "stop", kwargs
        assert msg.usage_metadata["total_tokens"] > 0
        streamed = list(llm.stream(q))
        assert "".join(c.content for c in streamed) == worker_reply(q), kwargs
        print(f"langchain ChatOpenAI({kwargs}).invoke({q!r}) -> {msg.content!r} {msg.response_metadata}",
              file=sys.stderr)
    member = ChatOpenAI(model="beta", base_url=url, api_key=API_KEY, max_retries=0, timeout=120, max_tokens=2)
    cut = member.invoke("hello langchain")
    assert cut.content == worker_reply("hello langchain")[:8] and cut.response_metadata["finish_reason"] == "length"

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    class Answer(BaseModel):
        value: int

    llm = ChatOpenAI(model="trinity", base_url=url, api_key=API_KEY, max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError, match="'tools' is not supported"):
        llm.bind_tools([add]).invoke(q)
    with pytest.raises(openai.BadRequestError, match="'response_format' is not supported"):
        llm.with_structured_output(Answer).invoke(q)
    with pytest.raises(openai.BadRequestError, match="'tools' is not supported"):
        llm.with_structured_output(Answer, method="function_calling").invoke(q)


def test_litellm_plain_and_streaming_with_and_without_sampling_fields(setup, monkeypatch):
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list from the internet
    import litellm

    url = setup["server"].base_url
    q = "What is 31 plus 11?"
    for kwargs in ({}, {"temperature": 0.2, "max_tokens": 256, "seed": 3}):
        r = litellm.completion(model="openai/trinity", api_base=url, api_key=API_KEY, num_retries=0, timeout=120,
                               messages=[{"role": "user", "content": q}], **kwargs)
        assert r.choices[0].message.content == worker_reply(q) and r.choices[0].finish_reason == "stop", kwargs
        assert r.usage.total_tokens > 0
        stream = litellm.completion(model="openai/trinity", api_base=url, api_key=API_KEY, num_retries=0,
                                    timeout=120, messages=[{"role": "user", "content": q}], stream=True, **kwargs)
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == worker_reply(q), kwargs
        print(f"litellm.completion(openai/trinity, {kwargs}) -> {r.choices[0].message.content!r} "
              f"finish={r.choices[0].finish_reason} usage={r.usage.total_tokens}", file=sys.stderr)
    cut = litellm.completion(model="openai/beta", api_base=url, api_key=API_KEY, num_retries=0, timeout=120,
                             messages=[{"role": "user", "content": "hello litellm"}], max_tokens=2)
    assert cut.choices[0].finish_reason == "length"
    with pytest.raises(litellm.BadRequestError, match="tools"):
        litellm.completion(model="openai/trinity", api_base=url, api_key=API_KEY, num_retries=0, timeout=120,
                           messages=[{"role": "user", "content": q}],
                           tools=[{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}])


def test_direct_member_calls_bypass_the_coordinator_and_are_stored(setup, client):
    fake = setup["fake"]
    n0 = fake.request_count
    r = client.chat.completions.create(model="beta", messages=[{"role": "user", "content": "hello beta"}])
    assert r.model == "beta" and r.choices[0].message.content == worker_reply("hello beta")
    assert r.model_extra["trinity"]["turns"][0]["stored"] is False and fake.request_count == n0 + 1
    assert fake.records[-1].model == "fake-b"
    s = list(client.chat.completions.create(model="beta", stream=True,
                                            messages=[{"role": "user", "content": "hello beta"}]))
    assert "".join(c.choices[0].delta.content or "" for c in s if c.choices) == worker_reply("hello beta")
    assert fake.request_count == n0 + 1  # the repeat came from the store


def test_a_client_leaving_mid_stream_cancels_its_remaining_turns_and_leaves_the_server_healthy(setup, client):
    fake = setup["fake"]
    q = "What is 14 times 3?"
    other = client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": "What is 2 + 40?"}])
    assert other.choices[0].message.content == worker_reply("What is 2 + 40?")  # (and the encoder is warm)
    n0 = fake.request_count
    _fail_next(fake, "fake-a", ["latency:1.5"])
    with _http(setup) as http:
        with http.stream("POST", "/chat/completions",
                         json={"model": "trinity", "stream": True, "messages": [{"role": "user", "content": q}]}) as r:
            lines = r.iter_lines()  # (kept: a line iterator dropped closes the stream)
            assert next(lines).startswith("data: ")
            deadline = time.time() + 120
            while fake.request_count == n0 and time.time() < deadline:  # the first call is on the wire (1.5 s)
                time.sleep(0.05)
            assert fake.request_count == n0 + 1
        # the connection is closed here, during the episode's first call
        assert http.get("/models").status_code == 200
    health = setup["server"].base_url.removesuffix("/v1") + "/health"
    deadline = time.time() + 60
    while httpx.get(health, timeout=30).json()["in_flight"] and time.time() < deadline:  # the first call returns
        time.sleep(0.2)
    assert httpx.get(health, timeout=30).json()["in_flight"] == 0
    assert fake.request_count == n0 + 1  # the call in flight finished; no further turn started
    again = client.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q}])
    assert again.choices[0].message.content == worker_reply(q)
    assert [t["stored"] for t in again.model_extra["trinity"]["turns"]] == [True, False, False]
    assert fake.request_count == n0 + 3  # the abandoned episode's call was kept: asking again paid the rest only


def test_zz_shutdown_the_key_is_nowhere_and_the_trace_renders(setup, capsys, monkeypatch):
    """Last in this module: stops the server, then reads its log and its store."""
    monkeypatch.setenv("COLUMNS", "200")
    from trinity import cli
    from trinity.store import Store
    from trinity.serving.traces import TraceLog

    server = setup["server"]
    q = "What is 40 plus 2?"  # (answered earlier in this module, unless this test runs alone)
    with openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=120) as c:
        c.chat.completions.create(model="trinity", messages=[{"role": "user", "content": q}])
    assert server.stop() == 0, server.log
    log = server.log
    assert "ep-" in log and "answered" in log and "POST /v1/chat/completions" in log  # it did log
    assert API_KEY not in log
    store_dir = setup["dir"] / "store"
    for f in store_dir.rglob("*"):
        if f.is_file():
            assert API_KEY.encode() not in f.read_bytes(), f
    with Store(store_dir / "trinity.duckdb", read_only=True) as st:
        traces = TraceLog(st)
        recent = traces.recent(100)
        stored = [traces.get(eid) for eid, _, _ in recent]
        traces.close()
    assert "answered" in {t["outcome"] for t in stored}
    mine = next(t for t in stored if t["conversation"]["query"] == q)
    assert mine["answer"] == worker_reply(q) and mine["turns"][0]["text"] == THINKER_REPLY
    assert mine["fresh_replies"] == 3  # the first trace, not its replay from the store

    code = cli.main(["trace", mine["episode_id"], "--store", str(store_dir / "trinity.duckdb")])
    out = capsys.readouterr().out
    assert code == 0
    print(out, file=sys.stderr)
    for piece in (q, "Add the numbers carefully.", worker_reply(q), "thinker", "worker", "alpha",
                  "answered by alpha"):
        assert piece in out, piece
    assert cli.main(["trace", "ep-nope", "--store", str(store_dir / "trinity.duckdb")]) == cli.EXIT_NOT_FOUND


def test_message_lists_map_onto_tasks():
    """(No server.) The OpenAI message list → Task mapping behind every request (messages.task_from_messages)."""
    from trinity.serving.messages import ConversationError, task_from_messages

    t = task_from_messages([{"role": "developer", "content": "Rule A."}, {"role": "user", "content": "Hi."},
                            {"role": "user", "content": "I have 3 cats."}, {"role": "assistant", "content": "Nice."},
                            {"role": "assistant", "content": [{"type": "text", "text": "Really."}]},
                            {"role": "system", "content": "Rule B."}, {"role": "user", "content": "And 2 dogs?"}],
                           "choice")
    assert t.history == (("Rule A.\n\nRule B.\n\nHi.\n\nI have 3 cats.", "Nice.\n\nReally."),)
    assert t.query == "And 2 dogs?" and t.grader == "choice" and t.source == "chat"
    assert task_from_messages([{"role": "user", "content": "x"}]).grader == "judge"  # free: no answer format
    same = task_from_messages([{"role": "user", "content": "x"}])
    assert same.id == task_from_messages([{"role": "user", "content": "x"}]).id != \
        task_from_messages([{"role": "user", "content": "x"}], "math").id
    for bad, param in ([{"role": "user", "content": "  "}], "messages[0].content"), \
                      ([{"role": "system", "content": "only rules"}], "messages"), \
                      ([{"role": "user", "content": None}], "messages[0].content"), \
                      ([{"role": "assistant", "content": "a", "tool_calls": [{}]}], "messages[0].tool_calls"), \
                      (["hi"], "messages[0]"):
        with pytest.raises(ConversationError) as e:
            task_from_messages(bad)
        assert e.value.param == param, bad


def test_failures_that_would_repeat_tell_clients_not_to_retry():
    """(No server.) `x-should-retry`: false for no answer and a member's deterministic failure, true for an
    outage; a finish_reason for the answer's turn."""
    from trinity.records import ChatResponse, Task
    from trinity.serving.conversation import EpisodeResult, TurnRecord
    from trinity.serving.protocol import episode_error

    task = Task(id="chat/1", source="chat", prompt=("hi",), grader="judge")

    def result(*turns, answer=None):
        return EpisodeResult(episode_id="ep-1", task=task, turns=list(turns), answer=answer,
                             verifier_first=not turns, episode_s=0.1, checkpoint="c", answer_format="free")

    outage = TurnRecord.of(0, "a", "worker", ChatResponse("", ok=False, error="http 503", failure="transient"),
                           False, 64)
    refused = TurnRecord.of(0, "a", "worker", ChatResponse("", ok=False, error="too long", failure="deterministic"),
                            False, 64)
    assert episode_error(result()).headers()["x-should-retry"] == "false"
    assert episode_error(result()).status == 500 and episode_error(result()).code == "no_answer"
    assert episode_error(result(outage)).headers()["x-should-retry"] == "true"
    assert episode_error(result(refused)).headers()["x-should-retry"] == "false"
    assert episode_error(result(refused, outage)).headers()["x-should-retry"] == "true"
    cut = TurnRecord.of(1, "a", "worker", ChatResponse("abc", completion_tokens=64), False, 64)
    whole = TurnRecord.of(1, "a", "worker", ChatResponse("abc", completion_tokens=63), False, 64)
    assert result(cut, answer="abc").finish_reason == "length" and result(whole, answer="abc").finish_reason == "stop"
    assert (outage.finish_reason, outage.failure) == (None, "transient")
