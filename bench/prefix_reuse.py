"""P-bench: KV-prefix reuse in the transcript encoder over a 5-turn episode.

A realistic episode (dispatcher prompt + a MATH-style question, then worker / verifier / thinker /
worker turns of ~150-300 tokens each) is encoded one turn at a time, as an episode runs. For each
turn k, "full" encodes transcript k from scratch (reuse=False) and "reuse" encodes it with the
encoder's prefix cache holding transcript k-1, so only the new turn's tokens (plus the re-tokenized
boundary and the last two tokens) go through the model. Both sides run interleaved in the same
repetition (their order alternates between repetitions); the figure is
sum_k median(full_k) / sum_k median(reuse_k) over the episode. The features of both sides are compared
(max |Δ| is 0 in every dtype: reuse is whole position-aligned chunks, so it is an optimisation, not an
approximation; see coordinator.encode_chunk_tokens).

Usage: .venv/bin/python -m bench.prefix_reuse [--model smollm2-135m-instruct] [--reps 5] [--dtype float32]
       [--chunk-tokens 128]
Last line: one JSON object (see bench format in DESIGN.md).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import numpy as np

from trinity.coordinator.encoder import TranscriptEncoder

SYSTEM = (
    "system: You are the dispatcher of a team of language models. Read the conversation and decide which "
    "model acts next and in which role: worker (solves the task), thinker (suggests how to proceed) or "
    "verifier (accepts or rejects the current answer). Do not answer the task yourself.\n"
)

TURNS = [
    SYSTEM
    + "user: Let $f(x) = x^3 - 6x^2 + 11x - 6$. The polynomial $g(x) = f(x + a)$ has a root at $x = 0$ "
    "and the sum of the squares of its roots equals 14. Find all possible values of the real number $a$, "
    "and for each of them give the three roots of $g$. Put the final answer in \\boxed{} and explain "
    "every step of your reasoning, including why no other value of $a$ can work. Recall that the roots "
    "of a cubic can sometimes be found by testing small integers and then dividing out the linear factor.\n",
    "worker: First factor $f$. Since $f(1) = 0$, $(x - 1)$ divides $f$ and "
    "$f(x) = (x - 1)(x^2 - 5x + 6) = (x - 1)(x - 2)(x - 3)$, so the roots of $f$ are 1, 2 and 3. "
    "Since $g(x) = f(x + a)$, the roots of $g$ are the roots of $f$ shifted by $-a$: they are $1 - a$, "
    "$2 - a$ and $3 - a$. For $g$ to have a root at $x = 0$ we need $a \\in \\{1, 2, 3\\}$. Now the sum of "
    "squares: $(1-a)^2 + (2-a)^2 + (3-a)^2 = 3a^2 - 12a + 14$. Setting this equal to 14 gives $3a^2 - 12a = 0$, "
    "so $a = 0$ or $a = 4$. Neither 0 nor 4 is in $\\{1, 2, 3\\}$, so no real $a$ exists: "
    "\\boxed{\\text{no solution}}.\n",
    "verifier: REJECT. The factorisation $f(x) = (x-1)(x-2)(x-3)$ and the shifted roots $1-a, 2-a, 3-a$ are "
    "correct, and the sum-of-squares expression $3a^2 - 12a + 14$ is also correct. However the conclusion "
    "contradicts the problem statement, which asserts that such an $a$ exists; the worker should re-read "
    "the conditions. In particular, check whether the problem intends the sum of the squares of the roots "
    "of $g$ or of $f$, and whether a root at $x = 0$ could be meant for $f(x + a)$ evaluated differently. "
    "An answer of 'no solution' to a question that asks for all possible values needs a much stronger "
    "justification than the one given, so I cannot accept it in its current form.\n",
    "thinker: <suggestion>The algebra is right, so the tension is in the reading of the conditions. The "
    "sum of squares of the roots of $f$ itself is $1 + 4 + 9 = 14$, which is exactly the number in the "
    "problem, and it is invariant only under $a = 0$, which does not give a root at zero. Present both "
    "facts clearly: (1) the root condition forces $a \\in \\{1,2,3\\}$; (2) the sum-of-squares condition "
    "forces $a \\in \\{0, 4\\}$; (3) the intersection is empty. Then state the answer as the empty set, "
    "and add a one-line check of each candidate value so the verifier can confirm it quickly. Keep the "
    "final answer boxed and do not change the computation.</suggestion>"
    "<suggested_role>worker</suggested_role>\n",
    "worker: Using the suggestion, here is the full argument. (1) $f(x) = (x-1)(x-2)(x-3)$, so the roots of "
    "$g(x) = f(x+a)$ are $1-a$, $2-a$, $3-a$. A root at $x = 0$ requires $a \\in \\{1, 2, 3\\}$. (2) The sum of "
    "the squares of the roots of $g$ is $(1-a)^2 + (2-a)^2 + (3-a)^2 = 3a^2 - 12a + 14$, and this equals 14 "
    "exactly when $3a(a - 4) = 0$, i.e. $a \\in \\{0, 4\\}$. (3) The two sets $\\{1,2,3\\}$ and $\\{0,4\\}$ "
    "are disjoint. Check: $a = 2$ gives roots $-1, 0, 1$ (sum of squares 2); "
    "$a = 4$ gives $-3, -2, -1$ (sum 14, but no zero root). Therefore no real number $a$ satisfies both "
    "conditions, and the set of possible values is empty: \\boxed{\\varnothing}.\n",
]


def transcripts() -> list[str]:
    return ["".join(TURNS[: k + 1]) for k in range(len(TURNS))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunk-tokens", type=int, default=128, help="encode chunk size (params: coordinator.encode_chunk_tokens)")
    ap.add_argument("--dtype", default="float32", choices=["auto", "float32", "bfloat16"],
                    help="encoder compute dtype (reuse and re-encode are bit-identical in either)")
    args = ap.parse_args()

    enc = TranscriptEncoder(args.model, feature_cache_entries=0, dtype=args.dtype, chunk_tokens=args.chunk_tokens)
    texts = transcripts()
    n_tokens = [len(enc.tokenize(t)) for t in texts]
    turn_tokens = [n_tokens[0]] + [b - a for a, b in zip(n_tokens, n_tokens[1:])]
    print(f"encoder {enc.encoder_id}; transcript tokens per turn {n_tokens} (turn lengths {turn_tokens})",
          file=sys.stderr)
    enc.encode(texts[:1], reuse=False)  # warm-up

    full = [[] for _ in texts]
    reuse = [[] for _ in texts]
    computed = [0] * len(texts)
    max_diff = 0.0
    for rep in range(args.reps):
        enc.clear_cache()
        for k, text in enumerate(texts):
            sides = ("full", "reuse") if (rep + k) % 2 == 0 else ("reuse", "full")
            feats = {}
            for side in sides:
                before = enc.cache_stats()["tokens_computed"]
                t0 = time.perf_counter()
                feats[side] = enc.encode([text], reuse=(side == "reuse"))
                dt = time.perf_counter() - t0
                (full if side == "full" else reuse)[k].append(dt)
                if side == "reuse":
                    computed[k] = enc.cache_stats()["tokens_computed"] - before
            max_diff = max(max_diff, float(np.abs(feats["full"] - feats["reuse"]).max()))
        print(f"rep {rep + 1}: full {sum(x[-1] for x in full):.3f}s, reuse {sum(x[-1] for x in reuse):.3f}s",
              file=sys.stderr)

    med_full = [statistics.median(x) for x in full]
    med_reuse = [statistics.median(x) for x in reuse]
    per_turn = []
    print(f"{'turn':>4} {'tokens':>6} {'new':>5} {'computed':>8} {'full_ms':>8} {'reuse_ms':>8} {'speedup':>7}")
    for k in range(len(texts)):
        row = {"turn": k + 1, "transcript_tokens": n_tokens[k], "turn_tokens": turn_tokens[k],
               "computed_tokens": computed[k], "full_ms": round(med_full[k] * 1e3, 1),
               "reuse_ms": round(med_reuse[k] * 1e3, 1), "speedup": round(med_full[k] / med_reuse[k], 2)}
        per_turn.append(row)
        print(f"{k + 1:>4} {n_tokens[k]:>6} {turn_tokens[k]:>5} {computed[k]:>8} {row['full_ms']:>8} "
              f"{row['reuse_ms']:>8} {row['speedup']:>7}")
    total_full, total_reuse = sum(med_full), sum(med_reuse)
    figure = total_full / total_reuse
    print(json.dumps({
        "name": "encoder_prefix_reuse",
        "figure": round(figure, 3),
        "unit": "x (episode encode time without / with KV-prefix reuse)",
        "goal": ">= 2.0",
        "compared_to": "encoding every turn's transcript from scratch (same encoder, reuse=False)",
        "detail": {
            "encoder_id": enc.encoder_id, "reps": args.reps, "threads": __import__("torch").get_num_threads(),
            "episode_full_s": round(total_full, 3), "episode_reuse_s": round(total_reuse, 3),
            "tokens_encoded_full": sum(n_tokens), "tokens_computed_reuse": sum(computed),
            "max_abs_feature_diff": max_diff, "per_turn": per_turn,
            "raw_full_s": [[round(v, 4) for v in x] for x in full],
            "raw_reuse_s": [[round(v, 4) for v in x] for x in reuse],
        },
    }))


if __name__ == "__main__":
    main()
