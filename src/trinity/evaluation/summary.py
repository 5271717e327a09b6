"""The results table of an evaluation run (`summarise`, docs/eval_results_schema.md): per method and benchmark the
score with its 95% bootstrap interval and the compute per task, the averages per split, the hindsight oracle, and
the paired comparisons of the coordinator per benchmark and pooled per split. The items it scores are those
`trinity.evaluation.run` played (`trinity.evaluation.items`)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from trinity.coordinator.router import ROUTER
from trinity.evaluation.items import COORDINATOR, ORACLE, RANDOM_ROUTING, EvalRun, ItemResult, _conversation_turns
from trinity.evaluation.results import SPLIT_KEYS
from trinity.evaluation.stats import bootstrap_mean, compare, paired_bootstrap
from trinity.records import Task


def metric_of(task: Task) -> tuple[str, float]:
    """(metric name, scale of a perfect score) of a task's benchmark."""
    return ("judge score (1-10)", 10.0) if task.grader == "judge" else ("accuracy", 1.0)


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
