"""A fault-injecting fake of the OpenAI chat-completions endpoint, over real HTTP on 127.0.0.1.

Stdlib only (`http.server` in a background thread, one thread per connection), so tests and benches
exercise the real client stack (openai SDK → httpx → sockets). It exists for fault injection: anything
about model quality is tested against real models elsewhere.

Each request gets one *mode*, chosen in this order:
  1. header `X-Fake-Mode: <mode>`;
  2. a model name of the form `fake:<mode>` (e.g. `fake:503`);
  3. the next entry of the scripted sequence for the request's model (`scripts={model: [...]}`),
     else of the shared sequence (`script=[...]`), consumed in arrival order;
  4. `default_mode` (normally "ok").

Modes (an optional argument after a colon):
  ok                 a well-formed completion; usage derived from the text (see `usage_for`)
  429[:s]            429 with `Retry-After: s` seconds (default 1)
  429date[:s]        429 with Retry-After as an HTTP date s seconds ahead (second resolution)
  429quota           429 with error code "insufficient_quota" (a hard limit, not a transient one)
  400                400 "context_length_exceeded": the request itself is refused (deterministic)
  500, 503           server error with a JSON error body
  401echo            401 whose error message echoes the bearer token it received (a leaky proxy)
  hang[:s]           sleeps s seconds (default `hang_s`) before answering: longer than client timeouts
  truncated          200 with a body that is cut-off JSON (Content-Length matches the cut body)
  empty_choices      200 with `"choices": []`
  null_content       200 whose message content is null (finish_reason "length")
  drop               sends headers announcing a body, writes part of it, then closes the socket
  latency:s          `ok` after an extra s seconds (on top of the server-wide `latency_s`)

Every request is counted and recorded (`records`), in-flight requests are tracked (`max_in_flight`),
and the tokens billed by `ok` replies are summed, so tests can compare client totals to the server's.
"""
from __future__ import annotations

import email.utils
import json
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class RequestRecord:
    t_start: float
    t_end: float = 0.0
    mode: str = ""
    model: str = ""
    authorization: str = ""
    answered: bool = False
    retry_after_until: float | None = None
    """For 429 modes: the earliest time (time.time()) a well-behaved client may send its next request."""
    response_format: Any = None
    """The request's `response_format` (structured outputs), as sent; None when absent."""
    max_tokens: int | None = None
    """The request's completion cap (`max_tokens`, else `max_completion_tokens`), as sent; None when absent."""


def usage_for(messages: list[dict[str, Any]], reply: str) -> tuple[int, int]:
    """Deterministic token counts: about four characters per token, at least one."""
    prompt_chars = sum(len(str(m.get("content") or "")) for m in messages)
    return prompt_chars // 4 + 1, len(reply) // 4 + 1


def reply_for(messages: list[dict[str, Any]]) -> str:
    last = str(messages[-1].get("content") or "") if messages else ""
    return f"echo: {last}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many concurrent connects must not hit the listen backlog
    allow_reuse_address = True


class FakeOpenAIServer:
    """Start with `with FakeOpenAIServer(...) as srv:`; point clients at `srv.base_url`."""

    def __init__(
        self,
        script: list[str] | None = None,
        *,
        scripts: dict[str, list[str]] | None = None,
        default_mode: str = "ok",
        latency_s: float = 0.0,
        hang_s: float = 30.0,
        reply: Any = None,
        honour_max_tokens: bool = False,
    ) -> None:
        self.reply = reply or reply_for
        """messages → reply text for `ok` answers (default: echo the last message)."""
        self.honour_max_tokens = honour_max_tokens
        """`ok` replies longer than the request's max_tokens are cut there (4 characters a token), with
        finish_reason "length", as a real server does (off: the reply is whole, whatever the cap)."""
        self.script = list(script or [])
        self.scripts = {k: list(v) for k, v in (scripts or {}).items()}
        self.default_mode = default_mode
        self.latency_s = latency_s
        self.hang_s = hang_s
        self.records: list[RequestRecord] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.billed_prompt_tokens = 0
        self.billed_completion_tokens = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "FakeOpenAIServer":
        handler = type("Handler", (_Handler,), {"fake": self})
        self._httpd = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # wakes hanging / sleeping handlers
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "server not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.records)

    def reset_counters(self) -> None:
        with self._lock:
            self.records.clear()
            self.max_in_flight = self.in_flight
            self.billed_prompt_tokens = 0
            self.billed_completion_tokens = 0

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"requests": len(self.records), "in_flight": self.in_flight,
                    "max_in_flight": self.max_in_flight, "billed_prompt_tokens": self.billed_prompt_tokens,
                    "billed_completion_tokens": self.billed_completion_tokens,
                    "modes": _count(r.mode for r in self.records)}

    # -- used by the handler ----------------------------------------------------------------------
    def _begin(self, header_mode: str | None, model: str, authorization: str) -> tuple[RequestRecord, str]:
        with self._lock:
            if header_mode:
                mode = header_mode
            elif model.startswith("fake:"):
                mode = model[len("fake:"):]
            elif self.scripts.get(model):
                mode = self.scripts[model].pop(0)
            elif self.script:
                mode = self.script.pop(0)
            else:
                mode = self.default_mode
            rec = RequestRecord(t_start=time.time(), mode=mode, model=model, authorization=authorization)
            self.records.append(rec)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        return rec, mode

    def _end(self, rec: RequestRecord) -> None:
        """Called just before the answer's bytes go out (so a client that reacts to the answer by sending
        its next request can never be counted as overlapping this one), or when the handler exits."""
        with self._lock:
            if rec.answered:
                return
            rec.answered = True
            self.in_flight -= 1
            rec.t_end = time.time()

    def _bill(self, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            self.billed_prompt_tokens += prompt_tokens
            self.billed_completion_tokens += completion_tokens

    def _sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeOpenAIServer
    protocol_version = "HTTP/1.1"  # keep-alive, like real endpoints
    disable_nagle_algorithm = True  # headers and body go out as separate writes: no 40 ms Nagle stall
    _rec: RequestRecord | None = None  # the request being answered on this connection

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # quiet: tests capture logs and must see only the client's

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        """`GET /_fake/stats`: counters as JSON (not counted as a request), for out-of-process use."""
        if self.path.rstrip("/") == "/_fake/stats":
            self._json(200, self.fake.stats())
        else:
            self._json(404, _err(f"no route {self.path}", "invalid_request_error"))

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        if self.path.rstrip("/") == "/_fake/reset":
            self.fake.reset_counters()
            self._json(200, self.fake.stats())
            return
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            body = {}
        model = str(body.get("model") or "")
        rec, mode = self.fake._begin(self.headers.get("X-Fake-Mode"), model,
                                     self.headers.get("Authorization") or "")
        self._rec = rec
        rec.response_format = body.get("response_format")
        rec.max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        try:
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
                return
            self.fake._sleep(self.fake.latency_s)
            self._serve(mode, body, rec)
        except OSError:
            pass  # the client gave up (timeout) or the server is stopping: nobody to answer
        finally:
            self.fake._end(rec)
            self._rec = None

    # -- modes ------------------------------------------------------------------------------------
    def _serve(self, mode: str, body: dict[str, Any], rec: RequestRecord) -> None:
        name, _, arg = mode.partition(":")
        messages = body.get("messages") or []
        if name == "ok":
            self._ok(body, messages)
        elif name == "latency":
            self.fake._sleep(float(arg or 0))
            self._ok(body, messages)
        elif name == "429":
            secs = float(arg or 1)
            rec.retry_after_until = time.time() + secs
            self._json(429, _err("Rate limit reached, retry later", "rate_limit_exceeded"),
                       {"Retry-After": _fmt_secs(secs)})
        elif name == "429date":
            secs = float(arg or 2)
            when = time.time() + secs
            stamp = email.utils.formatdate(when, usegmt=True)  # truncates to whole seconds
            rec.retry_after_until = float(int(when))
            self._json(429, _err("Rate limit reached, retry later", "rate_limit_exceeded"), {"Retry-After": stamp})
        elif name == "429quota":
            self._json(429, _err("You exceeded your current quota", "insufficient_quota"))
        elif name == "400":
            self._json(400, _err("This model's maximum context length is 8192 tokens; your messages are longer",
                                 "context_length_exceeded"))
        elif name in ("500", "503"):
            self._json(int(name), _err(f"upstream failure {name}", "server_error"))
        elif name == "401echo":
            token = self.headers.get("Authorization") or ""
            self._json(401, _err(f"Incorrect API key provided: {token}", "invalid_api_key"))
        elif name == "hang":
            self.fake._sleep(float(arg) if arg else self.fake.hang_s)
            self._ok(body, messages)
        elif name == "truncated":
            text = self.fake.reply(messages)
            full = json.dumps(_completion(body, messages, *usage_for(messages, text), text))
            self._raw(200, full[: len(full) // 2].encode())
        elif name == "empty_choices":
            payload = _completion(body, messages, 3, 0, "")
            payload["choices"] = []
            self.fake._bill(3, 0)
            self._json(200, payload)
        elif name == "null_content":
            payload = _completion(body, messages, 5, 256, "")
            payload["choices"][0]["message"]["content"] = None
            payload["choices"][0]["finish_reason"] = "length"
            self.fake._bill(5, 256)
            self._json(200, payload)
        elif name == "drop":
            data = json.dumps(_completion(body, messages, 1, 1, self.fake.reply(messages))).encode()
            self.fake._end(rec)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 3])
            self.wfile.flush()
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        else:
            self._json(400, _err(f"fake server: unknown mode {mode!r}", "invalid_request_error"))

    def _ok(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        text = self.fake.reply(messages)
        pt, ct = usage_for(messages, text)
        cap = body.get("max_tokens") or body.get("max_completion_tokens")
        cut = self.fake.honour_max_tokens and isinstance(cap, int) and ct > cap
        if cut:
            text, ct = text[: cap * 4], cap
        self.fake._bill(pt, ct)
        payload = _completion(body, messages, pt, ct, text)
        if cut:
            payload["choices"][0]["finish_reason"] = "length"
        self._json(200, payload)

    def _json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        self._raw(status, json.dumps(payload).encode(), headers)

    def _raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        if self._rec is not None:
            self.fake._end(self._rec)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in items:
        out[x] = out.get(x, 0) + 1
    return out


def _fmt_secs(secs: float) -> str:
    return str(int(secs)) if float(secs).is_integer() else str(secs)


def _err(message: str, code: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": code, "param": None, "code": code}}


def _completion(body: dict[str, Any], messages: list[dict[str, Any]], pt: int, ct: int, text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct},
    }


def main(argv: list[str] | None = None) -> None:
    """Run standalone (another process, so its threads do not share the client's GIL):
    prints `PORT <n>` once listening, serves until stdin closes or SIGTERM."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(description="fault-injecting fake OpenAI endpoint on 127.0.0.1")
    ap.add_argument("--latency", type=float, default=0.0, help="seconds added to every request")
    ap.add_argument("--default-mode", default="ok")
    ap.add_argument("--script", default="", help="comma-separated modes consumed in arrival order")
    args = ap.parse_args(argv)
    script = [m for m in args.script.split(",") if m]
    with FakeOpenAIServer(script, default_mode=args.default_mode, latency_s=args.latency) as srv:
        print(f"PORT {srv.port}", flush=True)
        try:
            sys.stdin.read()  # parent closes our stdin (or dies) → we exit
        except KeyboardInterrupt:
            pass


__all__ = ["FakeOpenAIServer", "RequestRecord", "main", "usage_for", "reply_for"]

if __name__ == "__main__":
    main()
