"""Evaluation: the trained coordinator vs each pool member alone vs uniform random routing, on the same items,
benchmark by benchmark; the best single member per benchmark in hindsight is derived (an oracle row).

- `trinity`: the evolved head (argmax policy unless coordinator.policy_eval = sample), the training episode loop.
- `alone:<member>`: that member as Worker for one turn (the same prompt the coordinator's first Worker turn
  sends, so those answers are shared through the response store).
- `random-routing`: the same episode loop with a zero head (uniform model and role picks), seeded per item.
- `oracle:best-single`: per benchmark, the `alone:` row with the best score on it (no calls; hindsight).

A multi-turn task (MT-Bench) is played turn by turn: conversation turn k is asked with the method's own
earlier answers in its history (`Task.follow_up`); the judge then scores each turn (FastChat single-answer
grading). Its scoring unit is the (item, turn) judgement, as in FastChat's report: a cell per turn (over the
items whose judgement of that turn is valid) and an overall cell (the mean over every valid judgement); paired
comparisons pair the (item, turn) units both methods have valid. An item has a score of its own only when every
turn was rated (the mean of its turns); it never gets the mean of whichever turns were rated. Items whose call
failed with an outage, and judgements that failed or gave no rating, are unscored (recorded with the reason,
counted, never guessed); a deterministic failure (e.g. a prompt too long for the member) is that member's answer
and scores as wrong.

This module plays the methods; the records it fills (`ItemResult`, `EvalRun`) are in `trinity.evaluation.items`,
and `trinity.evaluation.summary.summarise` computes the results table from them.
"""
from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from trinity.config import Settings
from trinity.env import env_flag
from trinity.coordinator.episode import Episode, RolloutTrees, StateCache, episode_rng, play_episodes
from trinity.coordinator.rollout import is_outage
from trinity.coordinator.policy import param_split
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.router import ROUTER, router_settings
from trinity.coordinator.roles import Role, Turn, allowed_roles, latest_answer, role_messages, turn_of
from trinity.records import Task
from trinity.data.splits import HELDOUT_SOURCES
from trinity.evaluation.items import (COORDINATOR, OUTAGE_MARK, RANDOM_ROUTING, EvalRun, ItemResult,
                                      _conversation_turns)
from trinity.evaluation.results import HELDOUT, HELDOUT_OTHER, IN_DISTRIBUTION


def evaluation_splits(in_distribution: Sequence[Task], heldout: Sequence[Task]) -> dict[str, list[Task]]:
    """The evaluation's items by split (SPLIT_KEYS): the in-distribution items; the held-out items of the mission's
    held-out benchmarks (`HELDOUT_SOURCES`: out of reach for a small pool, and what the paper reports); those of every
    other benchmark never trained on. Each split gets its own average and pooled comparison."""
    mission = [t for t in heldout if t.source in HELDOUT_SOURCES]
    other = [t for t in heldout if t.source not in HELDOUT_SOURCES]
    return {split: list(ts) for split, ts in ((IN_DISTRIBUTION, in_distribution), (HELDOUT, mission),
                                             (HELDOUT_OTHER, other)) if ts}


@dataclass
class Transcript:
    """What one method did on one conversation turn of one item."""

    answer: str | None
    turns: tuple[Turn, ...]
    picks: list[list[str]]
    verifier_first: bool = False
    cost_usd: float = 0.0


def _no_grade(task: Task, answer: str) -> float:
    """Episodes are graded after the loop here (once per item, and MT-Bench by its judge)."""
    return 0.0


class _Progress:
    """One stderr line per (benchmark, method) run as it ends: items, new calls, store hits, time, and the ETA of the
    rest (the runs go at the same time, so the ETA is rough; the pool's own batch lines report in between)."""

    def __init__(self, total_runs: int, stats):
        self.total, self.done, self.stats, self.t0 = total_runs, 0, stats, time.monotonic()

    def report(self, bench: str, method: str, n_items: int, calls: int, hits: int, wall_s: float) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.t0
        eta = elapsed / self.done * (self.total - self.done)
        print(f"[eval] {bench}: {method} on {n_items} items, {calls} new calls, {hits} store hits, {wall_s:.0f}s "
              f"({self.done}/{self.total} runs, {self.stats.calls_made} calls paid so far, ETA {eta:.0f}s)",
              file=sys.stderr, flush=True)


ONE_AT_A_TIME_ENV = "TRINITY_EVAL_ONE_AT_A_TIME"
"""Set to 1: evaluate one (benchmark, method) run after another instead of all at once. The same requests and store
keys (replies may differ where batching differs, as between any two fresh runs); slower. For comparison and
debugging: bench/eval_concurrency.py measures the default against it."""


def one_at_a_time() -> bool:
    return env_flag(ONE_AT_A_TIME_ENV)


def evaluate(settings: Settings, params: np.ndarray, tasks: dict[str, Sequence[Task]], pool, states: StateCache,
             grade: Callable[[Task, str], float], judge=None, methods: Sequence[str] | None = None,
             router: tuple[np.ndarray, StateCache] | None = None) -> EvalRun:
    """Every method on every item of `tasks` ({split: tasks}). `judge`: a `grading.judge.MTBenchJudge`, needed
    when a task is graded by a judge. `router`: the learned router's parameters and the states it reads (its
    checkpoint's `Policy.states`), for the method "router". methods: a subset of ["trinity", "router",
    "alone:<name>"..., "random-routing"]."""
    delta, W = param_split(settings, params, len(pool), states)
    adapters = None if delta is None else [delta]
    ev, co = settings.evaluate, settings.coordinator
    all_methods = [COORDINATOR, *([ROUTER] if router is not None else []), *(f"alone:{n}" for n in pool.names),
                   RANDOM_ROUTING]
    chosen = [m for m in all_methods if methods is None or m in methods]
    trees, role_sampling = RolloutTrees(), RoleSampling.of(settings)
    if any(t.grader == "judge" for ts in tasks.values() for t in ts) and judge is None:
        raise ValueError("MT-Bench tasks need a judge (evaluate.judge)")

    async def episodes(ts: Sequence[Task], head: np.ndarray, rng_of, who: Settings = settings, reads=states,
                       adapted=adapters) -> list[Transcript]:
        eps = [Episode(task=t, candidate=0, rng=rng_of(t)) for t in ts]
        await play_episodes(eps, [head], pool, reads, who.coordinator.max_turns, settings.reward, _no_grade,
                            adapters=adapted, trees=trees, roles=allowed_roles(who.coordinator),
                            answer_rule=who.coordinator.answer_rule, role_sampling=role_sampling,
                            stop_on_outage=True)  # an outage leaves the item unscored: no more calls
        return [Transcript(e.answer, e.turns, e.path, e.verifier_first, e.cost_usd) for e in eps]

    async def alone(idx: int, ts: Sequence[Task]) -> list[Transcript]:
        replies = await asyncio.gather(*(role_sampling.complete(pool, idx, role_messages(Role.WORKER, t, ()),
                                                                Role.WORKER) for t in ts))
        out = []
        for r in replies:
            turn = turn_of(pool.names[idx], Role.WORKER, r)
            out.append(Transcript(latest_answer((turn,)), (turn,), [[str(idx), Role.WORKER.value]], cost_usd=r.cost_usd))
        return out

    def player(method: str):
        if method == COORDINATOR:
            sample = co.policy_eval == "sample"
            return lambda ts: episodes(ts, W, lambda t: episode_rng(ev.seed, "eval", t.id) if sample else None)
        if method == RANDOM_ROUTING:
            return lambda ts: episodes(ts, np.zeros_like(W), lambda t: episode_rng(ev.random_routing_seed, "random", t.id))
        if method == ROUTER:  # one Worker turn by the member its head picks (argmax or sampled, as the coordinator)
            as_router, sample = router_settings(settings), co.policy_eval == "sample"
            _, W_router = param_split(as_router, router[0], len(pool), router[1])
            return lambda ts: episodes(ts, W_router, lambda t: episode_rng(ev.seed, "router", t.id) if sample else None,
                                       as_router, router[1], None)
        idx = pool.names.index(method.removeprefix("alone:"))
        return lambda ts: alone(idx, ts)

    # Grading runs off the event loop, on one thread of its own (code grading runs a program in the sandbox for up
    # to minutes: on the loop it would hold every other method's next turn), one item at a time as before (a loaded
    # machine must not push a program past its time limit), each distinct (item, answer) once (a member's answer
    # alone and the coordinator's first Worker turn are often the same reply).
    grading = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trinity-grade")
    grades: dict[tuple[Task, str], asyncio.Future] = {}

    async def grade_off_loop(task: Task, answer: str) -> float:
        fut = grades.get((task, answer))
        if fut is None:
            fut = grades[(task, answer)] = asyncio.get_running_loop().run_in_executor(grading, grade, task, answer)
        return float(await fut)

    calls: dict[tuple[str, str], dict] = {}
    groups = [(split, bench, [t for t in ts if t.source == bench])
              for split, ts in tasks.items() for bench in dict.fromkeys(t.source for t in ts)]
    runs = [(split, bench, ts, method) for split, bench, ts in groups for method in chosen]
    progress = _Progress(len(runs), pool.stats)

    async def run(split: str, bench: str, ts: Sequence[Task], method: str) -> list[ItemResult]:
        t0 = time.monotonic()
        with pool.tally() as paid:  # this run's own calls, while the others run too
            done = await _run_method(method, player(method), ts, split, grade_off_loop, judge)
        calls[(method, bench)] = {"calls_new": paid.calls_made, "failed_calls": paid.failures}
        progress.report(bench, method, len(ts), paid.calls_made, paid.store_hits, time.monotonic() - t0)
        return done

    async def run_all() -> list[list[ItemResult]]:
        # Every (benchmark, method) run at once: the pool's concurrency limit keeps `max_concurrency` calls in flight
        # across all of them, so a member's server batches the calls of every method (one method after another left
        # a lone member decoding one sequence on its share of the cores). A call two runs need (a member's answer
        # alone and the coordinator's first Worker turn asking it the same) is made once, shared in flight. The calls
        # run on the pool's HTTP loop, the encodes on this one and the grades on a thread: none stalls another's
        # connection. TRINITY_EVAL_ONE_AT_A_TIME=1: one run after another (bench/eval_concurrency.py's baseline).
        if one_at_a_time():
            return [await run(*r) for r in runs]
        return await asyncio.gather(*(run(*r) for r in runs))

    t_all = time.monotonic()
    try:
        items = [item for done in asyncio.run(run_all()) for item in done]
    finally:
        grading.shutdown(wait=True)
    return EvalRun(items, calls, time.monotonic() - t_all)


async def _run_method(method: str, play, tasks: Sequence[Task], split: str, grade, judge) -> list[ItemResult]:
    """One method on one benchmark's items: every conversation turn in order, then the grade (`await grade(task,
    answer)`) or the judge."""
    answers: dict[str, tuple[str, ...]] = {t.id: () for t in tasks}
    record: dict[str, list[tuple[int, Transcript]]] = {t.id: [] for t in tasks}
    for k in range(1, max(map(_conversation_turns, tasks)) + 1):
        asked = [t for t in tasks if k <= _conversation_turns(t)]
        transcripts = await play([t.follow_up(k, answers[t.id]) if t.grader == "judge" else t for t in asked])
        for t, tr in zip(asked, transcripts):
            record[t.id].append((k, tr))
            answers[t.id] += (tr.answer or "",)
    out, grading = [], []
    for t in tasks:
        rec = record[t.id]
        turns = [(k, turn) for k, tr in rec for turn in tr.turns]
        last = rec[-1][1]
        item = ItemResult(method=method, task=t, split=split, score=None, answer=last.answer, turns=turns,
                          path=[p for _, tr in rec for p in tr.picks], verifier_first=any(tr.verifier_first for _, tr in rec),
                          cost_usd=sum(tr.cost_usd for _, tr in rec))
        outage = next((turn for _, turn in turns if is_outage(turn)), None)
        if outage is not None:
            item.error = f"{OUTAGE_MARK}{outage.model} as {outage.role.value} failed ({outage.text[:200] or 'no reply'})"
        elif t.grader != "judge":
            if item.answer is not None and not item.verifier_first:
                grading.append(item)
            else:
                item.score = 0.0
        out.append(item)
    for item, score in zip(grading, await asyncio.gather(*(grade(i.task, i.answer) for i in grading))):
        item.score = score
    judged = [i for i in out if i.task.grader == "judge" and i.error is None]
    if judged:
        await _judge_items(judged, answers, judge)
    return out


NO_ANSWER_SCORE = 1.0
"""A conversation turn the method gave no answer to (no Worker succeeded, or a Verifier spoke first) scores the
bottom of the judge's 1-10 scale without a judge call: leaving it out would score the item on its other turn
alone (measured: an answerless turn 2 left an item at its turn-1 9.0)."""


async def _judge_items(items: list[ItemResult], answers: dict[str, tuple[str, ...]], judge) -> None:
    """FastChat single-answer grading of every conversation turn, recorded per turn in `item.judge` (the units
    `summarise` scores). The item's own score is the mean of its turns when the judge rated every turn; a turn
    without a rating leaves the item's score None, with the reasons (its rated turns still count in their
    cells). A turn without an answer scores NO_ANSWER_SCORE (the judge is not asked)."""
    jobs, empty = [], []
    for item in items:
        for k in range(1, len(answers[item.task.id]) + 1):
            (jobs if answers[item.task.id][k - 1] else empty).append((item, k))
    verdicts = await judge.judge_turns([(item.task, answers[item.task.id], k) for item, k in jobs])
    for (item, k), v in zip(jobs, verdicts):
        item.judge.append({"turn": k, "score": v.score, "error": v.error, "prompt": v.prompt_name, "raw": v.raw})
    for item, k in empty:
        item.judge.append({"turn": k, "score": NO_ANSWER_SCORE, "error": None, "prompt": None,
                           "raw": "(no answer to this turn: scored the scale's minimum, judge not asked)"})
    for item in items:
        item.judge.sort(key=lambda j: j["turn"])
    for item in items:
        missing = [j for j in item.judge if j["score"] is None]
        if not missing:
            item.score = float(np.mean([j["score"] for j in item.judge]))
            continue
        why = "; ".join(f"turn {j['turn']}: {j['error']}" for j in missing)
        rated = [str(j["turn"]) for j in item.judge if j["score"] is not None]
        item.error = ("judge gave no rating: " + why if not rated else
                      f"judge gave no rating on {why} (turn {', '.join(rated)} rated: counted in its cell; the item "
                      f"has no score of its own)")
