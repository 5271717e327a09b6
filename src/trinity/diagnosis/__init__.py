"""`trinity diagnose`: why a finished pipeline run scored what it did, from its files alone (read-only; no LLM call,
no encoder load).

A run's files hold everything it walked: the checkpoint, the response store (every reply and hidden state, opened
read-only), the root states, the evaluation's episodes, the evolve history and the optimiser's pickled state.
`StoredRun` (stored_run.py) opens them and rebuilds every task's rollout tree from the stored replies: each edge is
the request the episode loop sends (`RolloutTrees.request`: the same role prompts and store keys), and what a node
may do and where a path ends is the loop's own rule (`trinity.coordinator.rollout.StepRule`). Expectations under a
head are exact: `rollout.enumerate_paths` walks every path of a stored tree with its probability, and mass that
reaches a never-asked edge or a missing state is reported as unexplored. Single episodes (the evaluation's paths,
the saved-fitness episodes) are replayed by the loop itself (`play_episodes`) on a pool that answers from the store
only. The diagnosis has no rule of its own: a change to the loop's rules changes its figures with them.

The questions, one module each:

  Q1  routing.py   per evaluation transcript state: model/role probabilities, argmax, margin; the Verifier's
                   ACCEPT rates per member; Thinker overrides; how training and evaluation episodes ended.
  Q2  geometry.py  hidden-state geometry (norms, common mean, cosines, massive dimensions) and the split of the
                   head's logits into W·mean(h) and W·(h − mean).
  Q3  fitness.py   how far from uniform the saved head's softmaxes are; exact expected accuracy/reward of the
                   sampled policy vs the argmax policy; the saved-fitness episodes replayed; how far the CMA mean
                   moved.
  Q4  fitness.py   fitness noise per generation from the training episodes, and the exact fitness spread of
                   candidates drawn around the CMA mean: signal vs noise; tasks per generation needed.
  Q5  checks.py    other checks (truncated answers, answer formats, judge ratings, duplicate runs, root states).

The trees are rebuilt with *this checkout's* role prompts and pool keys: run it at the commit that produced the run
(its code version is in data/checkpoints/coordinator.json); after a prompt change, stored replies no longer match
and show as unexplored.
"""
from __future__ import annotations

import time
from pathlib import Path


def diagnose(root: Path, n_heads: int = 200, grade_unlabelled: bool = True) -> None:
    """Print Q1..Q5 for the run whose files are under `root` (`n_heads`: candidates drawn around the CMA mean for
    Q4; `grade_unlabelled`: grade math/choice answers no run graded)."""
    from trinity.diagnosis import checks, fitness, geometry, routing
    from trinity.diagnosis.stored_run import StoredRun

    started = time.time()
    run = StoredRun(root, grade_unlabelled=grade_unlabelled)
    routing.q1(run)
    states, mean_state = geometry.q2(run)
    cma_mean, cma_sigma = fitness.q3(run, states, mean_state)
    fitness.q4(run, n_heads, cma_mean, cma_sigma)
    checks.q5(run)
    print(f"\n[done in {time.time() - started:.1f}s]")
