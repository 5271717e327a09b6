"""reports/evidence/ablation.md from the optimiser ablation's DVC experiments (`make ablation`, docs/operations.md "DVC: remote,
push/pull, experiments"): one experiment per `evolve.method`, the same pipeline and budget otherwise.

Reads `dvc exp show --json` (run here, or a file given with --json) and tabulates, for every experiment whose
name starts with --prefix: the training result (reports/metrics/evolve.json) and the coordinator's evaluation
(the `trinity` row of reports/metrics/evaluate.json). Fails, naming the experiments, when they do not share one
budget (every evolve.* key but the method equal) or when an experiment has no metrics (it failed or was not run).

    python scripts/ablation_report.py [--prefix ablation-] [--json exp_show.json] [--out reports/evidence/ablation.md]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EVOLVE_METRICS = "reports/metrics/evolve.json"
EVAL_METRICS = "reports/metrics/evaluate.json"
PARAMS = "params.yaml"
BUDGET_KEYS = ("generations", "popsize", "episodes_per_candidate", "seed", "sigma0", "reinforce_lr",
               "saved_fitness_tasks", "saved_fitness_samples")


def experiments(shown: list[dict]) -> list[dict]:
    """Every experiment of `dvc exp show --json` as {name, rev, params, metrics}: params as
    {file: {...}}, metrics as {file: {...}} (a file DVC could not read is left out)."""
    out = []
    for baseline in shown:
        base_rev = baseline.get("rev")
        for exp in baseline.get("experiments") or []:
            for rev in exp.get("revs") or []:
                data = rev.get("data") or {}
                out.append({
                    "name": rev.get("name") or data.get("meta", {}).get("name") or rev.get("rev"),
                    "rev": data.get("rev") or rev.get("rev"),
                    "baseline": base_rev,
                    "params": {f: (v or {}).get("data", {}) for f, v in (data.get("params") or {}).items()},
                    "metrics": {f: v["data"] for f, v in (data.get("metrics") or {}).items() if v and "data" in v},
                })
    return out


def ablation_rows(exps: list[dict], prefix: str) -> list[dict]:
    rows = []
    for e in exps:
        if not str(e["name"]).startswith(prefix):
            continue
        evolve = e["params"].get(PARAMS, {}).get("evolve", {})
        missing = [f for f in (EVOLVE_METRICS, EVAL_METRICS) if f not in e["metrics"]]
        if missing:
            raise SystemExit(f"experiment {e['name']} ({e['rev']}): no {', '.join(missing)} in `dvc exp show` "
                             "(did it fail? its `dvc exp run` output says why; `dvc exp remove <name>` and run it again)")
        items = e["params"].get(PARAMS, {}).get("data", {})
        rows.append({"name": e["name"], "rev": e["rev"], "baseline": e.get("baseline"), "method": evolve.get("method"),
                     "items": {split: items.get(split) for split in ("train", "in_distribution", "heldout")},
                     "budget": {k: evolve.get(k) for k in BUDGET_KEYS},
                     "evolve": e["metrics"][EVOLVE_METRICS], "trinity": e["metrics"][EVAL_METRICS].get("trinity", {})})
    if not rows:
        raise SystemExit(f"no experiment named {prefix}* in `dvc exp show` (run them: `make ablation`)")
    budgets = {json.dumps(r["budget"], sort_keys=True) for r in rows}
    if len(budgets) > 1:
        raise SystemExit("the ablation's experiments do not share one budget (evolve.* other than method): "
                         + "; ".join(f"{r['name']}: {r['budget']}" for r in rows))
    return rows


def _num(v) -> str:
    return f"{v:.3f}" if isinstance(v, (int, float)) and not isinstance(v, bool) else "—"


def render(rows: list[dict]) -> str:
    from trinity.evaluation.report.tables import OPTIMISER_NAMES
    from trinity.evaluation.results import HELDOUT, IN_DISTRIBUTION, metrics_average, metrics_benchmarks

    b = rows[0]["budget"]
    benches = sorted({k for r in rows for k in metrics_benchmarks(r["trinity"])})
    lines = [
        "# Trinity — optimiser ablation", "",
        "One DVC experiment per optimiser (`make ablation`: `dvc exp run --temp -S evolve.method=...`), the same "
        f"pipeline, tasks, pool and budget otherwise: {b['generations']} generations x popsize {b['popsize']} x "
        f"{b['episodes_per_candidate']} tasks per candidate, seed {b['seed']}. Training: reports/metrics/evolve.json "
        "(the saved vector's fitness on the training tasks); evaluation: the `trinity` row of reports/metrics/evaluate.json "
        "(argmax policy on the in-distribution and held-out items).", "",
        "| experiment | method | saved fitness | best candidate | avg in-distribution | avg held-out | "
        + " | ".join(benches) + " | new LLM calls (train) |",
        "|---|---|---|---|---|---|" + "---|" * len(benches) + "---|",
    ]
    for r in rows:
        t, ev = r["trinity"], r["evolve"]
        lines.append(f"| {r['name']} | {OPTIMISER_NAMES.get(r['method'], r['method'])} | {_num(ev.get('saved_fitness'))} "
                     f"| {_num(ev.get('best_candidate_fitness'))} | {_num(metrics_average(t, IN_DISTRIBUTION))} | "
                     f"{_num(metrics_average(t, HELDOUT))} | " + " | ".join(_num(t.get(k)) for k in benches)
                     + f" | {ev.get('calls_made', '—')} |")
    bases = sorted({str(r["baseline"])[:7] for r in rows if r.get("baseline")})
    items = rows[0]["items"]

    def _counts(split: str) -> str:
        c = items.get(split) or {}
        return ", ".join(f"{k} {'every item' if v == -1 else v}" for k, v in c.items()) or "—"

    lines += ["", f"Items: training {_counts('train')}; in-distribution evaluation {_counts('in_distribution')}; "
              f"held-out {_counts('heldout')} (per benchmark; a score on a handful of items moves in steps of "
              "1/n: read differences against the evaluation's paired intervals, reports/summary.md of each "
              "experiment). — : no scored item (e.g. the MT-Bench judge gave no rating), hence no average over "
              "that split.",
              "", "New LLM calls count only what the shared response store did not already hold when the experiment "
              "ran (experiments run one after the other, in `make ablation`'s order): they measure the order, "
              "not the method.",
              "", "Experiments: " + ", ".join(f"{r['name']} ({str(r['rev'])[:7]})" for r in rows)
              + (f", of commit {', '.join(bases)}" if bases else "")
              + ". Compare them with `dvc exp show`; MT-Bench scores are on its 1–10 scale.",
              "", "Paper (LiveCodeBench): REINFORCE .253 < random search .374 < sep-CMA-ES .615."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", default="ablation-", help="experiment names of the ablation start with this")
    ap.add_argument("--json", type=Path, help="`dvc exp show --json` output (default: run it here)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "ablation.md")
    args = ap.parse_args()
    if args.json:
        shown = json.loads(args.json.read_text())
    else:
        r = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], cwd=ROOT, capture_output=True,
                           text=True)
        if r.returncode != 0:
            raise SystemExit(f"`dvc exp show --json` failed in {ROOT}:\n{r.stderr}")
        shown = json.loads(r.stdout)
    rows = ablation_rows(experiments(shown), args.prefix)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(rows))
    print(f"wrote {args.out}: {', '.join(r['name'] + ' (' + str(r['method']) + ')' for r in rows)}")


if __name__ == "__main__":
    main()
