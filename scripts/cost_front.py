"""The accuracy / seconds-per-task front of cost-aware routing: the coordinator retrained at each `reward.cost_weight`
(`reward.cost_unit: seconds`: the reward loses cost_weight x the episode's recorded call seconds) and evaluated on the
run's evaluation items, beside each member alone, the learned router and random routing, whose answers do not depend
on the weight (their points are the run's own, data/eval/results.json).

Run after `make run` (or `make run-full`): it reads the run's prepared items, params and results, and shares its
response store (DuckDB: one writer, so not while a `dvc repro` runs). For each weight the evolve stage's training
(`trinity.stages.evolve.train_and_save`, the same loop, items and budget) writes data/cost_front/w<weight>/ and the
coordinator alone is played on the evaluation items (argmax, as in the evaluation). Resumable: a weight already
trained and evaluated with this code and these params is read back; an interrupted one resumes; a rerun pays no call
it already paid. Items graded by the judge (MT-Bench, open questions) are left out: the front is of right-or-wrong
accuracy against seconds.

The goal it checks (issue 27): a weight at which the coordinator is within 0.02 of its unweighted average at no more
seconds per task than the best member alone (the `alone:` row with the best average on that split).

    python scripts/cost_front.py [--weights 0.002,0.005,0.01,0.02] [--params params.yaml] [--out-dir reports]

Writes cost_front.md, cost_front.json and cost_front.png under reports/ (or --out-dir).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

GOAL_MARGIN = 0.02
"""How far below its unweighted average the coordinator may be at the cheaper weight (issue 27)."""


def weight_name(w: float) -> str:
    return f"w{w:g}"


def point(results, method: str, split: str) -> dict:
    """A method's place on the front for a split of an `EvalResults`: the mean over the split's right-or-wrong
    benchmarks of its score (None unless it has one on each), and its recorded call seconds per task over their items
    (each item weighs the same)."""
    benches = [b for b in results.in_split(split) if not b.judged]
    cells = [results.cell(method, b.name) for b in benches]
    scores = [c.score / b.scale for b, c in zip(benches, cells) if c is not None and c.score is not None]
    secs = [(c.wall_s_per_task, b.n) for b, c in zip(benches, cells) if c is not None and c.wall_s_per_task is not None]
    return {"score": float(np.mean(scores)) if benches and len(scores) == len(benches) else None,
            "s_per_task": float(np.average([s for s, _ in secs], weights=[n for _, n in secs])) if secs else None,
            "benchmarks": [b.name for b in benches]}


def front_points(results, splits: list[str]) -> dict[str, dict[str, dict]]:
    """{method: {split: point}} of every method of a run's results but the oracle."""
    return {m.id: {split: point(results, m.id, split) for split in splits} for m in results.methods if not m.is_oracle}


def goal_check(base: dict, coordinator: dict[float, dict], split: str) -> dict:
    """Whether some weight keeps the coordinator within GOAL_MARGIN of its unweighted average at no more seconds per
    task than the best member alone on `split` (base: the run's `front_points`; coordinator: weight → its point)."""
    singles = {m: p[split] for m, p in base.items() if m.startswith("alone:") and p[split]["score"] is not None}
    unweighted = base["trinity"][split]
    if not singles or unweighted["score"] is None:
        return {"split": split, "met": None, "why": "no scores on this split"}
    best, point = max(singles.items(), key=lambda kv: kv[1]["score"])
    check = {"split": split, "best_member": best, "best_member_score": point["score"],
             "best_member_s_per_task": point["s_per_task"], "unweighted_score": unweighted["score"],
             "unweighted_s_per_task": unweighted["s_per_task"]}
    if unweighted["score"] <= GOAL_MARGIN:  # a coordinator that answers nothing (a Verifier first: 0 s) would meet it
        return {**check, "met": None,
                "why": f"the unweighted coordinator scores {unweighted['score']:.3f}, within {GOAL_MARGIN} of 0: "
                       "a coordinator that answers nothing would meet the goal"}
    ok = [w for w, p in sorted(coordinator.items()) if p[split]["score"] is not None
          and p[split]["score"] >= unweighted["score"] - GOAL_MARGIN
          and p[split]["s_per_task"] is not None and p[split]["s_per_task"] <= point["s_per_task"]]
    return {**check, "met": bool(ok), "weights_meeting": ok}


def evaluate_weight(settings, paths, tasks, w: float) -> dict:
    """Train the coordinator at cost weight `w` (seconds) and play it on `tasks`: {split: {"score", "s_per_task",
    "items"}} plus the training's metrics. Read back when done with this code and these params."""
    from trinity.code_version import code_version
    from trinity.coordinator import policy
    from trinity.evaluation.results import EvalResults
    from trinity.evaluation.run import evaluate
    from trinity.evaluation.summary import summarise
    from trinity.grading import grade
    from trinity.pool.runtime import build_pool
    from trinity.stages.evolve import train_and_save
    from trinity.store import Store

    reward = settings.reward.model_copy(update={"cost_weight": float(w), "cost_unit": "seconds"})
    s = settings.model_copy(update={"reward": reward})
    out_dir = paths.data / "cost_front" / weight_name(w)
    done = out_dir / "front.json"
    identity = {"params_hash": s.params_hash(), "code_version": code_version(),
                "items": sorted(t.id for ts in tasks.values() for t in ts)}
    if done.exists():
        kept = json.loads(done.read_text())
        if kept.get("identity") == identity:
            print(f"[cost-front] {weight_name(w)}: read back from {done}", file=sys.stderr, flush=True)
            return kept
    print(f"[cost-front] {weight_name(w)}: training (reward.cost_weight {w:g}, seconds)", file=sys.stderr, flush=True)
    training = train_and_save(s, paths, None, name=f"cost_front_{weight_name(w)}", checkpoint=out_dir / "coordinator",
                              out_dir=out_dir)
    trained = policy.Policy.load(out_dir / "coordinator")
    encoder = policy.make_encoder(s)
    with Store(paths.store) as store:
        pool = build_pool(s.pool, store)  # evaluate asks each role's caps of s (RoleSampling.of)
        run = evaluate(s, trained.params, tasks, pool, trained.states(encoder, store), grade, methods=["trinity"])
    results = EvalResults.from_dict(summarise(run, resamples=200, seed=0))
    out = {"weight": w, "identity": identity, "training": training,
           "points": {split: point(results, "trinity", split) for split in tasks}}
    done.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    return out


def render(base: dict, swept: dict[float, dict], goals: list[dict], splits: list[str], unweighted_w: float) -> str:
    from trinity.evaluation.report.format import SPLITS

    labels = {k: label for k, label, _ in SPLITS}
    lines = ["# Trinity — cost-aware routing: accuracy against seconds per task", "",
             "The coordinator retrained at each `reward.cost_weight` (`cost_unit: seconds`; the reward loses the "
             "weight x the episode's recorded call seconds) and played on the run's evaluation items; the other rows "
             f"are the run's own results (data/eval/results.json; the coordinator's weight there: {unweighted_w:g}). "
             "Average = the mean over the split's right-or-wrong benchmarks of the score (judged ones left out); "
             "seconds = the recorded call seconds per task over their items. `scripts/cost_front.py`.", ""]
    for split in splits:
        lines += [f"## {labels.get(split, split)}", "", "| method | cost weight | average | seconds per task |",
                  "|---|---|---|---|"]
        rows = [("trinity", f"{unweighted_w:g}", base["trinity"][split])]
        rows += [("trinity", f"{w:g}", p["points"][split]) for w, p in sorted(swept.items())]
        rows += [(m, "—", p[split]) for m, p in base.items() if m != "trinity"]
        for m, w, p in rows:
            score = "—" if p["score"] is None else f"{p['score']:.3f}"
            secs = "—" if p["s_per_task"] is None else f"{p['s_per_task']:.1f}"
            lines.append(f"| {m} | {w} | {score} | {secs} |")
        g = next(g for g in goals if g["split"] == split)
        if g["met"] is None:
            lines += ["", f"Goal: not checkable ({g['why']}).", ""]
        else:
            verdict = (f"**met** at weight {', '.join(f'{w:g}' for w in g['weights_meeting'])}" if g["met"] else
                       "**not met** at any weight swept")
            lines += ["", f"Goal (within {GOAL_MARGIN} of the unweighted {g['unweighted_score']:.3f} at no more than "
                          f"the best member's {g['best_member_s_per_task']:.1f} s per task, `{g['best_member']}` "
                          f"{g['best_member_score']:.3f}): {verdict}.", ""]
    return "\n".join(lines) + "\n"


def plot(base: dict, swept: dict[float, dict], splits: list[str], unweighted_w: float, path: Path) -> None:
    from matplotlib.figure import Figure

    from trinity.evaluation.report.format import SPLITS

    labels = {k: label for k, label, _ in SPLITS}
    figure = Figure(figsize=(5.2 * len(splits), 4.2), layout="constrained")
    axes = np.atleast_1d(figure.subplots(1, len(splits)))
    for ax, split in zip(axes, splits):
        front = [(unweighted_w, base["trinity"][split])] + [(w, p["points"][split]) for w, p in sorted(swept.items())]
        front = [(w, p) for w, p in front if p["score"] is not None and p["s_per_task"] is not None]
        ax.plot([p["s_per_task"] for _, p in front], [p["score"] for _, p in front], "-o", color="tab:blue",
                label="trinity (cost weight)")
        for w, p in front:
            ax.annotate(f"{w:g}", (p["s_per_task"], p["score"]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        for m, p in base.items():
            if m == "trinity" or p[split]["score"] is None or p[split]["s_per_task"] is None:
                continue
            marker = "s" if m == "router" else "^" if m == "random-routing" else "D"
            ax.scatter(p[split]["s_per_task"], p[split]["score"], marker=marker, s=50, label=m)
        ax.set_title(labels.get(split, split), fontsize=10)
        ax.set_xlabel("recorded call seconds per task")
        ax.set_ylabel("average score")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--weights", default="0.002,0.005,0.01,0.02",
                    help="cost weights per recorded call second (comma-separated, > 0)")
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out-dir", default=None,
                    help="where cost_front.{md,json,png} go (default: reports/; after "
                         "`make run-full`: reports/full_profile, beside that run's report)")
    a = ap.parse_args(argv)

    from trinity.config import load_settings
    from trinity.evaluation.results import EvalResults
    from trinity.evaluation.run import evaluation_splits
    from trinity.files import write_json
    from trinity.stages.common import load_tasks
    from trinity.stages.paths import Paths

    try:
        weights = sorted({float(w) for w in a.weights.split(",") if w.strip()})
    except ValueError:
        raise SystemExit(f"--weights {a.weights!r}: comma-separated numbers, e.g. 0.005,0.01") from None
    if not weights or min(weights) <= 0:
        raise SystemExit(f"--weights {a.weights!r}: give weights > 0 (0 is the run itself)")
    settings = load_settings(a.params)
    paths = Paths()
    results_path = paths.eval_dir / "results.json"
    if not results_path.exists():
        raise SystemExit(f"{results_path} is missing: run the pipeline first (`make run`)")
    base_results = EvalResults.read(results_path)
    splits_all = load_tasks(paths)
    tasks = {k: [t for t in ts if t.grader != "judge"]
             for k, ts in evaluation_splits(splits_all.in_distribution, splits_all.heldout).items()}
    tasks = {k: ts for k, ts in tasks.items() if ts}
    if not tasks:
        raise SystemExit("no right-or-wrong evaluation items in data/prepared: nothing to put on the front")
    splits = list(tasks)
    base = front_points(base_results, splits)
    if "trinity" not in base:
        raise SystemExit(f"{results_path} has no `trinity` row")
    swept = {w: evaluate_weight(settings, paths, tasks, w) for w in weights}
    goals = [goal_check(base, {w: p["points"] for w, p in swept.items()}, split) for split in splits]
    unweighted_w = settings.reward.cost_weight
    reports = Path(a.out_dir) if a.out_dir else paths.reports
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "cost_front.md").write_text(render(base, swept, goals, splits, unweighted_w))
    write_json(reports / "cost_front.json", {"weights": weights, "unit": "seconds", "base": base,
                                             "swept": {weight_name(w): p for w, p in swept.items()}, "goals": goals})
    plot(base, swept, splits, unweighted_w, reports / "cost_front.png")
    for g in goals:
        print(f"[cost-front] {g['split']}: goal {'met' if g['met'] else 'not met' if g['met'] is False else 'n/a'}"
              + (f" at {g['weights_meeting']}" if g.get("weights_meeting") else ""), flush=True)
    print(f"[cost-front] wrote {reports / 'cost_front.md'}, cost_front.json, cost_front.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
