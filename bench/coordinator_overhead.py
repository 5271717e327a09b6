"""Coordinator decision time as a share of turn wall time, embedded pool, no stores (goal <= 5%).

Each turn = decide (encode the transcript with KV-prefix reuse + head + sampling) then act (one pool call).
Real episodes on GSM8K items with the default params' pool and encoder (bf16 where the CPU has native bf16
kernels, see coordinator.encoder_dtype); the head is random (σ = 0.5) so every role and model shows up. Both
sides are timed in the same turns. Afterwards every decided transcript is re-encoded in fp32 from scratch and the
head's argmax decisions are compared (reported, not part of the timing).

Usage: .venv/bin/python -m bench.coordinator_overhead [--episodes 4] [--chunk-tokens N (default: params.yaml)]"""
import argparse
import asyncio
import json
import statistics
import sys
import time

import numpy as np

from trinity.config import load_settings
from trinity.coordinator.encoder import TranscriptEncoder
from trinity.coordinator.episode import StateCache
from trinity.coordinator.head import HeadShape, route_probs
from trinity.coordinator.policy import make_encoder
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.roles import ROLES, Role, coordinator_text, latest_answer, make_turn, role_messages
from trinity.data.loaders import load_gsm8k
from trinity.pool.runtime import build_pool


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=4)
    ap.add_argument("--chunk-tokens", type=int, default=None, help="override coordinator.encode_chunk_tokens")
    args = ap.parse_args()
    n_episodes = args.episodes
    settings = load_settings("params.yaml")
    if args.chunk_tokens is not None:
        c = settings.coordinator.model_copy(update={"encode_chunk_tokens": args.chunk_tokens})
        settings = settings.model_copy(update={"coordinator": c})
    pool, role_sampling = build_pool(settings.pool, store=None), RoleSampling.of(settings)
    encoder = make_encoder(settings)
    states = StateCache(encoder, store=None)
    rng = np.random.default_rng(0)
    W = HeadShape(len(pool), encoder.dim).unflatten(rng.standard_normal((len(pool) + 3) * encoder.dim) * 0.5)
    tasks = load_gsm8k(settings.data.resolved_root(), split="test")[:n_episodes]
    states.states([coordinator_text(tasks[0], ())])  # warm-up: load weights, first-call overheads
    decide_s, act_s, decided = [], [], []
    for task in tasks:
        turns = ()
        for _ in range(settings.coordinator.max_turns):
            t0 = time.perf_counter()
            text = coordinator_text(task, turns)
            h = states.states([text])[0]
            pm, pr = route_probs(W, h.astype(np.float64), len(pool))
            decided.append((text, int(np.argmax(pm)), int(np.argmax(pr))))
            m, role = int(rng.choice(len(pool), p=pm)), ROLES[int(rng.choice(3, p=pr))]
            if role is Role.VERIFIER and latest_answer(turns) is None:
                role = Role.WORKER  # keep the episode going: this bench measures turns
            msgs = role_messages(role, task, turns)
            t1 = time.perf_counter()
            resp = asyncio.run(role_sampling.complete(pool, m, msgs, role))
            t2 = time.perf_counter()
            decide_s.append(t1 - t0)
            act_s.append(t2 - t1)
            turns += (make_turn(pool.names[m], role, resp.text, resp.ok),)
            if role is Role.VERIFIER and turns[-1].verdict == "ACCEPT":
                break
    shares = [d / (d + a) for d, a in zip(decide_s, act_s)]
    # Same decisions? Re-encode every decided transcript in plain fp32 without any reuse and compare the argmax
    # model and role the head picks (only meaningful when the run used bf16 or prefix reuse, which it does).
    ref = TranscriptEncoder(settings.coordinator.encoder, max_tokens=settings.coordinator.max_encode_tokens,
                            dtype="float32", feature_cache_entries=0)
    agree = 0
    for text, m_arg, r_arg in decided:
        pm, pr = route_probs(W, ref.encode([text], reuse=False)[0].astype(np.float64), len(pool))
        agree += int(np.argmax(pm)) == m_arg and int(np.argmax(pr)) == r_arg
    total_share = sum(decide_s) / (sum(decide_s) + sum(act_s))
    print(json.dumps({"name": "coordinator_overhead", "figure": round(100 * total_share, 2), "unit": "% of turn wall time",
                      "goal": "<= 5", "compared_to": "the pool call of the same turn (embedded pool, same run)",
                      "detail": {"turns": len(shares), "decide_s_median": round(statistics.median(decide_s), 4),
                                 "act_s_median": round(statistics.median(act_s), 3),
                                 "share_per_turn_median_pct": round(100 * statistics.median(shares), 2),
                                 "argmax_decisions_equal_to_fp32_full_reencode": f"{agree}/{len(decided)}",
                                 "decide_s": [round(x, 4) for x in decide_s], "act_s": [round(x, 3) for x in act_s],
                                 "encoder": encoder.encoder_id, "pool": pool.names}}))


if __name__ == "__main__":
    sys.exit(main())
