"""Traces of answered conversations: kept in the response store, rendered for people.

Every episode `trinity ask` or `trinity serve` plays (`conversation.Coordinator.answer`) is saved as one row of the
store's `traces` table, keyed by its episode id: the conversation, each turn (member, role, text, verdict, tokens,
latency, whether the reply came from the store, the error of a failed call), the answer and who gave it. The row
is JSON, passed through `tracking_redact.redact` first (the server's API key, the pool's keys and anything shaped
like a credential never reach the file). A read-only store (another process writes it) keeps new traces in
memory only, like its responses.

Retention (`retention_days`; the processes that answer and `trinity trace` read TRINITY_TRACE_RETENTION_DAYS,
`trinity serve --trace-retention-days` sets it): traces older than that many days are deleted when a writer opens
the log (a server's start) and on each save, and a reader never returns them (a read-only store cannot delete:
`trinity trace` hides what its writer has not pruned yet). Unset or 0: kept forever (the default). Only the
`traces` table is pruned: the response store keeps every paid call (its prompts hold the conversation's text too)
for replay, as in training.

`render_trace` is the one renderer: a compact table (`trinity ask`, `trinity serve` logs nothing more), or the
full conversation with every turn's text (`trinity trace EPISODE_ID`).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

from trinity.config import ConfigError
from trinity.redact import redact

RETENTION_ENV = "TRINITY_TRACE_RETENTION_DAYS"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS traces (
    episode_id VARCHAR PRIMARY KEY,
    checkpoint VARCHAR NOT NULL,
    outcome VARCHAR NOT NULL,
    trace VARCHAR NOT NULL,
    created_at TIMESTAMP DEFAULT current_timestamp
);
"""


_KEPT = "created_at >= CAST(current_timestamp AS TIMESTAMP) - to_microseconds(CAST(? * 86400e6 AS BIGINT))"
"""A row younger than the retention (`?`: days); created_at is written by the same cast of current_timestamp."""


def check_retention_days(days: float | None, where: str) -> float | None:
    """`days` as a retention (None for keep forever: None or 0); a ConfigError naming `where` unless a finite
    number >= 0."""
    if days is None:
        return None
    if isinstance(days, bool) or not isinstance(days, (int, float)) or not math.isfinite(days) or days < 0:
        raise ConfigError(f"{where}: expected a number of days >= 0 (0: keep traces forever), got {days!r}")
    return float(days) or None


def retention_days_from_env() -> float | None:
    """TRINITY_TRACE_RETENTION_DAYS as a retention (None when unset, empty or 0); a ConfigError naming the variable
    when it is not a number >= 0."""
    raw = os.environ.get(RETENTION_ENV, "").strip()
    if not raw:
        return None
    try:
        days = float(raw)
    except ValueError:
        raise ConfigError(f"{RETENTION_ENV}={raw!r}: expected a number of days >= 0 (0: keep traces forever)") from None
    return check_retention_days(days, f"{RETENTION_ENV}={raw!r}")


class TraceLog:
    """The `traces` table of a `store.Store` (its own DuckDB cursor on the store's database: the store's process
    stays the file's only writer). `retention_days`: traces older than this are deleted (module doc); None keeps
    them forever."""

    def __init__(self, store, retention_days: float | None = None):
        self.store = store
        self.retention_days = check_retention_days(retention_days, "trace retention_days")
        self._memory: dict[str, dict] = {}
        self._con = store.con.cursor() if store is not None else None
        if self._con is not None and not store.read_only:
            self._con.execute(_SCHEMA)
            self.prune()

    @property
    def _writable(self) -> bool:
        return self._con is not None and not self.store.read_only

    def prune(self) -> int:
        """Delete the traces older than the retention (a writer only); how many were deleted."""
        if self.retention_days is None or not self._writable:
            return 0
        row = self._con.execute(f"DELETE FROM traces WHERE NOT ({_KEPT})", [self.retention_days]).fetchone()
        return int(row[0]) if row else 0

    def _kept(self) -> tuple[str, list]:
        """The SQL condition (and its parameters) of the rows within the retention."""
        return (_KEPT, [self.retention_days]) if self.retention_days is not None else ("TRUE", [])

    def _has_table(self) -> bool:
        return self._con is not None and bool(self._con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'traces'").fetchone()[0])

    def save(self, trace: dict) -> None:
        """Keep `trace` (redacted). An answered episode's trace is kept as first recorded: asking the same again
        replays it from the store, and the replay says nothing new."""
        clean = redact(trace)
        if not self._writable:
            self._memory[clean["episode_id"]] = clean
            if self.store is not None:
                self.store.unsaved_writes += 1
            return
        self.prune()  # first: an expired trace is gone, so the new one is kept
        old = self._con.execute("SELECT outcome FROM traces WHERE episode_id = ?", [clean["episode_id"]]).fetchone()
        if old is not None and old[0] == "answered":
            return  # a replay of an answered episode is that episode: keep the first trace (fresh calls, timings)
        self._con.execute("INSERT OR REPLACE INTO traces (episode_id, checkpoint, outcome, trace) VALUES (?,?,?,?)",
                          [clean["episode_id"], clean["checkpoint"], clean["outcome"], json.dumps(clean)])

    def get(self, episode_id: str) -> dict | None:
        if episode_id in self._memory:
            return self._memory[episode_id]
        if not self._has_table():
            return None
        kept, args = self._kept()
        row = self._con.execute(f"SELECT trace FROM traces WHERE episode_id = ? AND {kept}",
                                [episode_id, *args]).fetchone()
        return json.loads(row[0]) if row else None

    def recent(self, limit: int = 20) -> list[tuple[str, str, str]]:
        """(episode id, outcome, when) of the latest traces within the retention, newest first."""
        if not self._has_table():
            return []
        kept, args = self._kept()
        return [(e, o, str(t)[:19]) for e, o, t in self._con.execute(
            f"SELECT episode_id, outcome, created_at FROM traces WHERE {kept} ORDER BY created_at DESC LIMIT ?",
            [*args, limit]).fetchall()]

    def close(self) -> None:
        if self._con is not None:
            self._con.close()


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def trace_table(trace: dict[str, Any]):
    """A rich Table of the turns: member, role, tokens in/out, recorded latency, verdict, where the reply came from."""
    from rich.table import Table

    t = Table(title=f"episode {trace['episode_id']}", title_justify="left", show_edge=False, pad_edge=False)
    for col, just in (("#", "right"), ("model", "left"), ("role", "left"), ("tokens in/out", "right"),
                      ("latency", "right"), ("verdict", "left"), ("reply", "left")):
        t.add_column(col, justify=just)
    for turn in trace["turns"]:
        source = "failed: " + _clip(turn.get("error") or "", 60) if not turn["ok"] else (
            "store" if turn["stored"] else "fresh")
        t.add_row(str(turn["index"] + 1), turn["model"], turn["role"],
                  f"{turn['prompt_tokens']}/{turn['completion_tokens']}", f"{turn['latency_s']:.2f}s",
                  turn.get("verdict") or "", source)
    return t


def outcome_line(trace: dict[str, Any]) -> str:
    u = trace["usage"]
    head = (f"answered by {trace['answered_by']}" if trace["outcome"] == "answered"
            else f"{trace['outcome'].replace('_', ' ')}: {trace.get('reason')}")
    return (f"{head}; {len(trace['turns'])} turn(s), {trace['fresh_replies']} fresh repl(ies), "
            f"{trace['stored_replies']} from the store; {u['prompt_tokens']}+{u['completion_tokens']} tokens; {trace['episode_s']:.2f}s")


def render_trace(trace: dict[str, Any], console, *, texts: bool = False) -> None:
    """Print a trace: the turn table and its outcome line; with texts, the conversation and each turn's text first."""
    from rich.markup import escape
    from rich.panel import Panel

    if texts:
        conv = trace.get("conversation") or {}
        for user, assistant in conv.get("history", []):
            console.print(Panel(escape(user), title="user", title_align="left"))
            console.print(Panel(escape(assistant), title="assistant", title_align="left"))
        console.print(Panel(escape(conv.get("query", "")), title="user (question)", title_align="left"))
        for turn in trace["turns"]:
            title = f"turn {turn['index'] + 1}: {turn['role']} ({turn['model']})"
            if turn.get("verdict"):
                title += f" → {turn['verdict']}"
            body = turn["text"] if turn["ok"] else f"[failed] {turn.get('error') or ''}"
            console.print(Panel(escape(body), title=escape(title), title_align="left"))
    console.print(trace_table(trace))
    console.print(escape(outcome_line(trace)))
