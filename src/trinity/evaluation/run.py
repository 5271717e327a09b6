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
"""
from __future__ import annotations

import asyncio
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from trinity.config import Settings
from trinity.env import env_flag
from trinity.coordinator.episode import Episode, RolloutTrees, StateCache, episode_rng, is_outage, play_episodes
from trinity.coordinator.policy import param_split
from trinity.coordinator.router import ROUTER, router_settings
from trinity.coordinator.roles import Role, Turn, allowed_roles, latest_answer, role_messages, turn_of
from trinity.records import Task
from trinity.data.splits import HELDOUT_SOURCES
from trinity.evaluation.results import HELDOUT, HELDOUT_OTHER, IN_DISTRIBUTION, SPLIT_KEYS
from trinity.evaluation.stats import bootstrap_mean, compare, paired_bootstrap

COORDINATOR = "trinity"
RANDOM_ROUTING = "random-routing"
ORACLE = "oracle:best-single"


def evaluation_splits(in_distribution: Sequence[Task], heldout: Sequence[Task]) -> dict[str, list[Task]]:
    """The evaluation's items by split (SPLIT_KEYS): the in-distribution items; the held-out items of the mission's
    held-out benchmarks (`HELDOUT_SOURCES`: out of reach for a small pool, and what the paper reports); those of every
    other benchmark never trained on. Each split gets its own average and pooled comparison."""
    mission = [t for t in heldout if t.source in HELDOUT_SOURCES]
    other = [t for t in heldout if t.source not in HELDOUT_SOURCES]
    return {split: list(ts) for split, ts in ((IN_DISTRIBUTION, in_distribution), (HELDOUT, mission),
                                             (HELDOUT_OTHER, other)) if ts}


def metric_of(task: Task) -> tuple[str, float]:
    """(metric name, scale of a perfect score) of a task's benchmark."""
    return ("judge score (1-10)", 10.0) if task.grader == "judge" else ("accuracy", 1.0)


OUTAGE_MARK = "outage: "
"""How an item's `error` starts when an outage left it unscored (`ItemResult.unscored_by_outage`)."""


@dataclass
class Transcript:
    """What one method did on one conversation turn of one item."""

    answer: str | None
    turns: tuple[Turn, ...]
    picks: list[list[str]]
    verifier_first: bool = False
    cost_usd: float = 0.0


@dataclass
class ItemResult:
    """One method on one item: its score (None = unscored, see `error`) and everything it did."""

    method: str
    task: Task
    split: str
    score: float | None
    answer: str | None
    turns: list[tuple[int, Turn]]
    """(conversation turn, pool turn) in order."""
    path: list[list[str]]
    verifier_first: bool = False
    judge: list[dict] = field(default_factory=list)
    error: str | None = None
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(t.prompt_tokens + t.completion_tokens for _, t in self.turns)

    @property
    def latency_s(self) -> float:
        return sum(t.latency_s for _, t in self.turns)

    @property
    def unscored_by_outage(self) -> bool:
        """Whether a call of this item failed transiently (an outage), leaving it unscored: a rerun asks it again."""
        return (self.error or "").startswith(OUTAGE_MARK)

    @property
    def judged(self) -> bool:
        return self.task.grader == "judge"

    def unit_scores(self) -> dict[int, float | None]:
        """The item's scoring units, {conversation turn: score, None = unscored}. A judged conversation (MT-Bench)
        has one per turn, its judgement (None: the judge failed or gave no rating, or the item hit an outage);
        any other item is one unit, {1: its score}."""
        if not self.judged:
            return {1: self.score}
        rated = {j["turn"]: j["score"] for j in self.judge}
        return {k: rated.get(k) for k in range(1, _conversation_turns(self.task) + 1)}

    def row(self) -> dict:
        """The item's line in data/eval/episodes.jsonl (docs/eval_results_schema.md)."""
        return {
            "method": self.method, "benchmark": self.task.source, "split": self.split, "task_id": self.task.id,
            "score": self.score, "answer": self.answer, "verifier_first": self.verifier_first,
            "turns": [{"conversation_turn": k, "model": t.model, "role": t.role.value, "text": t.text, "ok": t.ok,
                       "verdict": t.verdict, "prompt_tokens": t.prompt_tokens,
                       "completion_tokens": t.completion_tokens, "latency_s": round(t.latency_s, 3)}
                      for k, t in self.turns],
            "judge": self.judge, "tokens": self.tokens, "latency_s": round(self.latency_s, 3),
            "cost_usd": self.cost_usd, "path": self.path, "error": self.error,
        }


@dataclass
class EvalRun:
    items: list[ItemResult]
    calls: dict[tuple[str, str], dict]
    """(method, benchmark) → new calls and failed calls while that method ran on that benchmark."""
    wall_s: float


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
    trees = RolloutTrees()
    if any(t.grader == "judge" for ts in tasks.values() for t in ts) and judge is None:
        raise ValueError("MT-Bench tasks need a judge (evaluate.judge)")

    async def episodes(ts: Sequence[Task], head: np.ndarray, rng_of, who: Settings = settings, reads=states,
                       adapted=adapters) -> list[Transcript]:
        eps = [Episode(task=t, candidate=0, rng=rng_of(t)) for t in ts]
        await play_episodes(eps, [head], pool, reads, who.coordinator.max_turns, settings.reward, _no_grade,
                            adapters=adapted, trees=trees, roles=allowed_roles(who.coordinator),
                            answer_rule=who.coordinator.answer_rule,
                            stop_on_outage=True)  # an outage leaves the item unscored: no more calls
        return [Transcript(e.answer, e.turns, e.path, e.verifier_first, e.cost_usd) for e in eps]

    async def alone(idx: int, ts: Sequence[Task]) -> list[Transcript]:
        replies = await asyncio.gather(*(pool.complete(idx, role_messages(Role.WORKER, t, ()), Role.WORKER.value)
                                         for t in ts))
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


def _conversation_turns(task: Task) -> int:
    """How many user turns a method answers: every prompt of a judged conversation (MT-Bench), else one."""
    return len(task.prompt) if task.grader == "judge" else 1


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


# ------------------------------------------------------------------------------------------ the table
POOLED_BEST_LABEL = "best single member on the split, in hindsight"


def summarise(run: EvalRun, *, resamples: int, seed: int) -> dict:
    """The results table (docs/eval_results_schema.md): per method and benchmark the score with its 95% bootstrap
    interval and the compute per task (a judged benchmark: per conversation turn and over all its valid
    judgements); averages over the units every method scored; the oracle row; paired bootstraps of the coordinator
    against the best single member and against random routing on the units both scored, per benchmark (a judged
    one also per turn) and pooled per split (`pooled_paired`)."""
    by: dict[tuple[str, str], list[ItemResult]] = {}
    benches: dict[str, dict] = {}
    for it in run.items:
        by.setdefault((it.method, it.task.source), []).append(it)
        if it.task.source not in benches:
            metric, scale = metric_of(it.task)
            benches[it.task.source] = {"name": it.task.source, "split": it.split, "metric": metric, "scale": scale}
    methods = list(dict.fromkeys(it.method for it in run.items))
    for b in benches.values():
        tasks = {it.task.id: it.task for it in run.items if it.task.source == b["name"]}
        b["n"] = len(tasks)
        judged = any(t.grader == "judge" for t in tasks.values())
        b["unit"] = "judgement" if judged else "item"
        if judged:
            b["turns"] = max(map(_conversation_turns, tasks.values()))
        b["units"] = sum(map(_conversation_turns, tasks.values()))

    # the valid scoring units of each method on each benchmark, {(task id, turn): score}, in item order
    valid = {(m, b): {(r.task.id, k): s for r in by.get((m, b), []) for k, s in r.unit_scores().items()
                      if s is not None} for m in methods for b in benches}
    # per benchmark, the units every method with a score there scored: the averages and pooled scores use these
    common: dict[str, set] = {}
    for b in benches:
        sets = [set(valid[(m, b)]) for m in methods if valid[(m, b)]]
        common[b] = set.intersection(*sets) if sets else set()
        benches[b]["common_units"] = len(common[b])

    def cell(rows: list[ItemResult], method: str, bench: str) -> dict:
        units = valid.get((method, bench), {})
        iv = bootstrap_mean(list(units.values()), n_resamples=resamples, seed=seed, clusters=[u[0] for u in units])
        c = run.calls.get((method, bench), {})
        n = len(rows)
        out = {"score": iv.estimate if units else None, "ci95": [iv.low, iv.high] if units else None,
               "n": len(units), "unscored": sum(len(r.unit_scores()) for r in rows) - len(units),
               "small_sample": iv.small_sample,
               "tokens_per_task": float(np.mean([r.tokens for r in rows])) if n else 0.0,
               "wall_s_per_task": float(np.mean([r.latency_s for r in rows])) if n else 0.0,
               "cost_usd_per_task": float(np.mean([r.cost_usd for r in rows])) if n else 0.0,
               "mean_turns": float(np.mean([len(r.turns) for r in rows])) if n else 0.0,
               "calls_new": c.get("calls_new", 0), "failed_calls": c.get("failed_calls", 0)}
        if benches[bench]["unit"] == "judgement":
            out["items"] = len({u[0] for u in units})
            out["turns"] = {str(k): _turn_cell(rows, k, resamples, seed) for k in range(1, benches[bench]["turns"] + 1)}
        return out

    scores = {m: {b: cell(by.get((m, b), []), m, b) for b in benches} for m in methods}
    singles = [m for m in methods if m.startswith("alone:")]
    kinds = {COORDINATOR: "coordinator", ROUTER: "router", RANDOM_ROUTING: "baseline"}
    method_rows = [{"method": m, "kind": kinds.get(m, "single"),
                    **({"model": m.removeprefix("alone:")} if m.startswith("alone:") else {})} for m in methods]

    def common_mean(method: str, bench: str) -> float | None:
        """The method's mean of score / scale over the benchmark's common units (None if it lacks any)."""
        units, keys = valid.get((method, bench), {}), common[bench]
        if not keys or not keys <= units.keys():
            return None
        return float(np.mean([s for u, s in units.items() if u in keys])) / benches[bench]["scale"]

    terms = {m: {b: common_mean(m, b) for b in benches} for m in methods}
    paired: dict[str, list[dict]] = {}
    if singles:
        picks = {b: max(singles, key=lambda m: _rank(scores[m][b]["score"])) for b in benches}
        scores[ORACLE] = {b: dict(scores[picks[b]][b], calls_new=0, failed_calls=0) for b in benches}
        terms[ORACLE] = {b: terms[picks[b]][b] for b in benches}
        method_rows.append({"method": ORACLE, "kind": "oracle", "picks": picks})
        if COORDINATOR in methods:
            for b in benches:
                judged = benches[b]["unit"] == "judgement"
                others = [(picks[b], "best single member"), *baseline_comparisons(methods)]
                paired[b] = [_comparison(valid[(COORDINATOR, b)], valid[(other, b)], other, label, resamples, seed,
                                         per_turn=judged) for other, label in others]
    averages = {}
    for m, per in terms.items():
        averages[m] = {}
        for split in (k for k in SPLIT_KEYS if any(b["split"] == k for b in benches.values())):
            vals = [per[b] for b in benches if benches[b]["split"] == split]
            # an average over fewer benchmarks than the split has would not be comparable across rows
            averages[m][split] = float(np.mean(vals)) if vals and None not in vals else None
    order = {split: i for i, split in enumerate(SPLIT_KEYS)}
    bench_list = sorted(benches.values(), key=lambda b: order.get(b["split"], len(order)))
    pooled = {split: _pooled_split(split, bench_list, valid, common, methods, singles, resamples, seed)
              for split in SPLIT_KEYS if any(b["split"] == split for b in bench_list)}
    return {"n_items": len({it.task.id for it in run.items}), "benchmarks": bench_list, "methods": method_rows,
            "scores": scores, "averages": averages, "paired": paired, "pooled_paired": pooled,
            "bootstrap": {"resamples": resamples, "seed": seed, "level": 0.95, "small_sample_below": 30}}


def _turn_cell(rows: list[ItemResult], turn: int, resamples: int, seed: int) -> dict:
    """One conversation turn of a judged benchmark: the mean over the items whose judgement of that turn is valid."""
    asked = [r.unit_scores()[turn] for r in rows if turn <= _conversation_turns(r.task)]
    scored = [s for s in asked if s is not None]
    iv = bootstrap_mean(scored, n_resamples=resamples, seed=seed)
    return {"score": iv.estimate if scored else None, "ci95": [iv.low, iv.high] if scored else None,
            "n": len(scored), "unscored": len(asked) - len(scored), "small_sample": iv.small_sample}


def _pooled_split(split: str, bench_list: list[dict], valid: dict, common: dict, methods: list[str],
                  singles: list[str], resamples: int, seed: int) -> dict:
    """Every unit of the split's benchmarks on one scale (score / scale: an MT-Bench judgement counts as its
    (item, turn) unit / 10): each method's pooled score over the units every method scored, the single member
    with the best pooled score (one member, chosen in hindsight), and the coordinator minus it and minus random
    routing over the units both scored, resampled by item."""
    split_benches = [b for b in bench_list if b["split"] == split]
    rank = {b["name"]: i for i, b in enumerate(split_benches)}

    def units(method: str) -> dict[tuple, float]:
        return {(b["name"], tid, k): s / b["scale"] for b in split_benches
                for (tid, k), s in valid.get((method, b["name"]), {}).items()}

    def key(u: tuple):
        return rank[u[0]], u[1], u[2]

    shared = sorted(((b["name"], tid, k) for b in split_benches for tid, k in common[b["name"]]), key=key)
    pooled_scores = {}
    for m in methods:
        mine = units(m)
        pooled_scores[m] = (float(np.mean([mine[u] for u in shared]))
                            if shared and all(u in mine for u in shared) else None)
    best = max((m for m in singles if pooled_scores[m] is not None), key=lambda m: pooled_scores[m], default=None)
    comparisons = []
    if COORDINATOR in methods:
        others = [*([(best, POOLED_BEST_LABEL)] if best is not None else []), *baseline_comparisons(methods)]
        comparisons = [_comparison(units(COORDINATOR), units(other), other, label, resamples, seed, key=key)
                       for other, label in others]
    return {"benchmarks": [b["name"] for b in split_benches], "items": sum(b["n"] for b in split_benches),
            "units": sum(b["units"] for b in split_benches), "common_units": len(shared),
            "scores": pooled_scores, "best_single": best, "comparisons": comparisons}


def baseline_comparisons(methods: Sequence[str]) -> list[tuple[str, str]]:
    """(method, label) of the baselines the coordinator is compared with, besides the best member: the learned
    router and random routing, those of them that ran."""
    return [(m, label) for m, label in ((ROUTER, "learned router"), (RANDOM_ROUTING, "random routing"))
            if m in methods]


def _rank(score: float | None) -> float:
    return -np.inf if score is None else score


def _comparison(mine: dict[tuple, float], theirs: dict[tuple, float], other: str, label: str, resamples: int,
                seed: int, *, key=None, per_turn: bool = False) -> dict:
    """trinity − `other` on the units both scored (a unit is a key whose last element is the conversation turn;
    the rest names the item, which the bootstrap resamples with all its units). per_turn: also each turn alone."""
    keys = sorted(mine.keys() & theirs.keys(), key=key)
    a, b = [mine[u] for u in keys], [theirs[u] for u in keys]
    iv = paired_bootstrap(a, b, n_resamples=resamples, seed=seed, clusters=[u[:-1] for u in keys])
    out = {"a": COORDINATOR, "b": other, "label": label, "diff": iv.estimate if keys else None,
           "ci95": [iv.low, iv.high] if keys else None, "n": len(keys), "items": len({u[:-1] for u in keys}),
           "small_sample": iv.small_sample, "outcome": compare(iv),
           "a_better": sum(x > y for x, y in zip(a, b)), "b_better": sum(x < y for x, y in zip(a, b))}
    if per_turn:
        turns = sorted({u[-1] for u in mine.keys() | theirs.keys()})
        out["turns"] = {str(t): _comparison({u: s for u, s in mine.items() if u[-1] == t},
                                            {u: s for u, s in theirs.items() if u[-1] == t}, other, label,
                                            resamples, seed, key=key) for t in turns}
    return out
