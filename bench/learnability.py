"""Learnability: does the training machinery learn a routing whose answer is known?

The known-answer problem (src/trinity/evolve/known_answer.py): arithmetic, multiple-choice and code tasks, and a
scripted pool of four members — one expert per family (right on its family, plausibly wrong elsewhere) and one
that answers nothing; as Verifiers they accept a right answer with probability 0.9 and a wrong one with 0.2.
The oracle router (each task to its family's expert) scores 1.0; any single member alone 1/3.

Real: the coordinator LM (the project's encoder, params.yaml coordinator.*), the head, the episode loop, the
reward shaping (params.yaml reward.*), the optimisers at the paper's shape (pycma's default popsize, σ0 = 0.03;
`--popsize`, `--sigma0` to change) and params.yaml's REINFORCE lr, the math/choice graders and the code sandbox. Scripted: only the pool's replies (instant; no LLM is called).

Each method (sep-CMA-ES, REINFORCE, random search) trains at the same budget — generations x popsize x tasks per
generation episodes, the same tasks and episode seeds — and after every generation the vector it would save
(argmax policy, as the product evaluates it) is scored on held-out tasks of the same families (other draws).
Reported: held-out accuracy as a fraction of the oracle's (goal >= 0.9 for the paper's method), generations to
reach 90 %, the best single member and random routing (the zero head, sampled: uniform picks), same run.

Usage: .venv/bin/python -m bench.learnability [--generations 20] [--tasks-per-generation 16] [--train 20]
       [--heldout 20] [--methods sep_cma,reinforce,random_search]   (defaults: the full run, ~10 min on 2 cores)
       [--validation 10 --warm-starts none,best_member]   (select the saved vector on validation; both starts)
Last line: one JSON object (DESIGN.md's bench format).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trinity.evolve.known_answer import PAPER_SIGMA0, measure_learnability as run

ROOT = Path(__file__).resolve().parents[1]


def markdown(res: dict, command: str) -> str:
    """The comparison as a report (reports/evidence/learnability.md): what was measured, by which command, and the curves."""
    d = res["detail"]
    b, st = d["budget"], d["settings"]
    lines = [
        "# Known-answer learnability: does training learn a routing whose answer is known?", "",
        f"Measured by `{command}` at commit {d['commit']} on {d['cpu']}; {d['wall_s']:.0f} s. Scripted pool (no LLM): "
        "one expert per task family (arithmetic, multiple choice, code), one member that answers nothing; verifiers "
        "accept a right answer with p = 0.9, a wrong one with p = 0.2. Real encoder, head, episode loop, reward "
        "shaping, optimisers, graders and code sandbox (src/trinity/evolve/known_answer.py).", "",
        f"Budget, the same for every method: {b['generations']} generations x popsize {b['popsize']} x "
        f"{b['tasks_per_generation']} tasks = {b['episodes_per_method']} episodes; {d['tasks']['train']} training and "
        f"{d['tasks']['heldout']} held-out tasks (other draws of the same families). σ0 = {st['sigma0']}, REINFORCE "
        f"lr = {st['reinforce_lr']}, max_turns = {st['max_turns']}, feature_norm = {st['feature_norm']}, reward "
        f"{st['reward']}.", "",
        "| router | held-out accuracy | / oracle | generations to 90 % of oracle | turns per task |",
        "|---|---|---|---|---|",
        f"| oracle (each task to its family's expert) | {d['oracle_accuracy']:.3f} | 1.000 | — | 1 |",
    ]
    for m, v in d["methods"].items():
        lines.append(f"| {m} (trained, argmax) | {v['heldout_accuracy']:.3f} | {v['fraction_of_oracle']:.3f} | "
                     f"{v['generations_to_90pct'] if v['generations_to_90pct'] is not None else 'not reached'} | "
                     f"{v['heldout_turns']:.2f} |")
    best = max(d["single_member_accuracy"].items(), key=lambda kv: kv[1])
    lines += [f"| best single member ({best[0]}) | {best[1]:.3f} | {d['best_single_fraction_of_oracle']:.3f} | — | 1 |",
              f"| random routing (zero head, sampled) | {d['random_routing_accuracy']:.3f} | "
              f"{d['random_routing_fraction_of_oracle']:.3f} | — | — |", "",
              "Held-out accuracy of the saved vector after each generation:", "",
              "| generation | " + " | ".join(d["methods"]) + " |", "|---|" + "---|" * len(d["methods"])]
    for g in range(b["generations"]):
        lines.append(f"| {g + 1} | " + " | ".join(f"{v['curve'][g]['heldout_accuracy']:.3f}"
                                                   for v in d["methods"].values()) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--generations", type=int, default=20)
    ap.add_argument("--tasks-per-generation", type=int, default=16)
    ap.add_argument("--train", type=int, default=20, help="training tasks per family")
    ap.add_argument("--heldout", type=int, default=20, help="held-out tasks per family")
    ap.add_argument("--popsize", type=int, default=None, help="default: pycma's, 4 + floor(3 ln n) (the paper's)")
    ap.add_argument("--sigma0", type=float, default=None, help=f"default: the paper's {PAPER_SIGMA0}")
    ap.add_argument("--methods", default="sep_cma,reinforce,random_search")
    ap.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--markdown", type=Path, default=None, help="also write the comparison as a markdown report")
    ap.add_argument("--max-turns", type=int, default=None, help="default: params.yaml coordinator.max_turns")
    ap.add_argument("--feature-norm", choices=["none", "standardize"], default=None,
                    help="default: params.yaml coordinator.feature_norm")
    ap.add_argument("--validation", type=int, default=0,
                    help="validation tasks per family: the saved vector is selected on them (default 0: the last mean)")
    ap.add_argument("--warm-starts", default="none",
                    help="comma-separated evolve.warm_start values to train each method from (best_member needs "
                         "--validation), e.g. none,best_member")
    a = ap.parse_args(argv)
    res = run(a.generations, a.tasks_per_generation, a.train, a.heldout, a.methods.split(","), popsize=a.popsize,
              params=a.params, seed=a.seed, feature_norm=a.feature_norm, max_turns=a.max_turns, sigma0=a.sigma0,
              n_validation=a.validation, warm_starts=a.warm_starts.split(","))
    if a.markdown:
        a.markdown.write_text(markdown(res, "python -m bench.learnability " + " ".join(argv if argv is not None
                                                                                     else sys.argv[1:])))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
