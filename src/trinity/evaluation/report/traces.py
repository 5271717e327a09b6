"""traces.md: a few evaluation episodes of the coordinator per benchmark, from data/eval/episodes.jsonl, each turn
with its model, role, verdict, tokens and (clipped) text. (The traces of served conversations, kept in the
response store for `trinity trace`, are `trinity.serving.traces`.)"""
from __future__ import annotations

import re

from trinity.evaluation.report.format import ordered_benchmarks, score_text, split_label
from trinity.evaluation.results import Benchmark, EvalResults

TRACES_PER_BENCHMARK = 2
TRACE_TEXT_CHARS = 600
"""What a trace shows of each turn's text; the rest is clipped (the full text is in episodes.jsonl)."""


def _is_failing(row: dict, scale: float) -> bool:
    """Unscored, or scored below half the benchmark's scale (accuracy 0; an MT-Bench rating under 5)."""
    return row.get("score") is None or row["score"] < scale / 2


def pick_traces(rows: list[dict], scale: float, count: int) -> list[dict]:
    """The first `count` rows in file order, one of them failing when any row fails."""
    failing = next((r for r in rows if _is_failing(r, scale)), None)
    chosen = rows[:count]
    if failing is not None and failing not in chosen and chosen:
        chosen = chosen[:-1] + [failing]
    return chosen


def _fenced(text: str) -> list[str]:
    """`text` in a code fence longer than any backtick run inside it, so no reply can break the page."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", text, fence]


def _clip(text: str) -> str:
    if len(text) <= TRACE_TEXT_CHARS:
        return text
    return f"{text[:TRACE_TEXT_CHARS]} … [clipped: {len(text)} characters in all]"


def _turn_lines(number: int, turn: dict, multi_turn: bool) -> list[str]:
    facts = [f"**turn {number}**"]
    if multi_turn:
        facts.append(f"conversation turn {turn.get('conversation_turn', '?')}")
    facts.append(f"`{turn['model']}` as {turn['role']}")
    if turn.get("verdict"):
        facts.append(f"verdict **{turn['verdict']}**")
    tokens = (turn.get("prompt_tokens") or 0) + (turn.get("completion_tokens") or 0)
    facts.append(f"{tokens} tokens")
    if turn.get("latency_s") is not None:
        facts.append(f"{turn['latency_s']:.1f} s")
    if turn.get("ok") is False:
        facts.append("**the call failed**")
    return [" · ".join(facts), ""] + _fenced(_clip(turn.get("text") or "")) + [""]


def _trace_lines(row: dict, benchmark: Benchmark) -> list[str]:
    scale = benchmark.scale
    verdict = " · **failing**" if _is_failing(row, scale) else ""
    lines = [f"### {benchmark.name} · `{row['task_id']}` · score {score_text(row.get('score'), None, scale)}"
             f"{verdict}", ""]
    if row.get("error"):
        lines += [f"Error: {row['error']}", ""]
    multi_turn = bool(row.get("judge"))
    for number, turn in enumerate(row.get("turns") or [], start=1):
        lines += _turn_lines(number, turn, multi_turn)
    if row.get("judge"):
        ratings = [f"conversation turn {j['turn']}: "
                   + (f"{j['score']:g}" if j.get("score") is not None else f"unscored ({j.get('error')})")
                   for j in row["judge"]]
        lines += ["Judge: " + "; ".join(ratings) + ".", ""]
    return lines


def traces_markdown(results: EvalResults, episodes: list[dict], per_benchmark: int = TRACES_PER_BENCHMARK) -> str:
    lines = ["# Trinity — episode traces", "",
             f"A few episodes of the evolved coordinator (`trinity`, argmax policy) per benchmark: the first "
             f"{per_benchmark} items in file order, one of them failing (unscored, or scored below half the scale) "
             f"when any fails. Each turn: the model, its role, the Verifier's verdict, the tokens of the call and "
             f"what it said (clipped to {TRACE_TEXT_CHARS} characters; the full text is in "
             f"data/eval/episodes.jsonl).", ""]
    for benchmark in ordered_benchmarks(results):
        lines += [f"## {benchmark.name} ({split_label(benchmark)})", ""]
        rows = [r for r in episodes if r["method"] == "trinity" and r["benchmark"] == benchmark.name]
        if not rows:
            lines += ["No coordinator episode recorded.", ""]
        for row in pick_traces(rows, benchmark.scale, per_benchmark):
            lines += _trace_lines(row, benchmark)
    return "\n".join(lines).rstrip("\n") + "\n"
