"""P-bench: one sep-CMA-ES generation (popsize 32 x 16 episodes, head only) on fully stored rollout trees.

First the store is filled: one generation is played (max_turns 3, the default coordinator), which stores
every response and hidden state its 512 episodes need. Then the *same* generation (same seed → same
candidates, tasks and episode seeds) is played again, several times, through `evolve()`: every node and
state is stored, so a generation is pycma ask/tell + the episode loop walking memoised trees (lookups and
one head product per candidate per turn) + grading memo + writing 512 episode rows. The figure is the
median wall time of that generation (GenerationRecord.wall_s; calls and encodes are asserted to be 0).

Compared, same run: one real call to the cheapest bundled member (SmolLM2-135M through llama.cpp, a 64-token
reply to a short math prompt), the unit every training generation pays thousands of times. The loop was
rewritten for readability (issue 25: one loop, no hand-written draws or tree memos); the old goal (<= 50 ms,
set for the memo-tree loop) is retired: at the paper's shape the loop's own work is 0.3 s of a 5,020 s
generation (reports/evidence/training_cost.json), so the goal is now that a whole stored generation costs less than
one real call. Also reported: a "cold" generation (fresh in-memory caches: states and responses come from the
DuckDB store).

Filling: by default with a deterministic stand-in pool and encoder (replies of realistic length and format —
Worker solutions with a boxed answer, Thinker suggestions with a suggested role, ACCEPT/REJECT verdicts —
and 576-d states), because filling 512 episodes' trees with the real embedded pool takes far longer than
the timed part, which never calls a model. `--fill real` fills with the embedded SmolLM2 pool (two members)
and the real encoder instead (slow: hundreds of real calls).

Usage: .venv/bin/python -m bench.generation_cached [--reps 7] [--fill synthetic|real]
Last line: one JSON object (see the bench format in DESIGN.md).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

import numpy as np

from trinity.config import PoolMember, Settings
from trinity.records import ChatResponse

DIM = 576  # the bundled encoder's hidden size (SmolLM2-135M)


class StandInModel:
    """Deterministic replies (a function of the prompt) in each role's format, of realistic length."""

    def __init__(self, name: str):
        self.name, self.model_id = name, f"bench-stand-in:{name}"

    async def chat(self, messages, sampling):
        text = messages[-1].content
        h = hashlib.sha256(f"{self.name}|{text}".encode()).digest()
        filler = " ".join(f"step {i}: we simplify the expression and check the intermediate value {h[i % 32]}."
                          for i in range(4 + h[0] % 8))
        if "ACCEPT or REJECT" in text:
            reply = ("The computation is consistent.\nVerdict: ACCEPT" if h[1] % 2
                     else "The final step is wrong.\nVerdict: REJECT")
        elif "<suggestion>" in text:
            role = ("worker", "verifier", "worker", None)[h[2] % 4]
            reply = f"<suggestion>{filler[:300]}</suggestion>" + (f"<suggested_role>{role}</suggested_role>" if role else "")
        else:
            reply = f"{filler} Answer: {'ABCD'[h[3] % 4]}. So the result is \\boxed{{{h[4] % 10}}}."
        return ChatResponse(text=reply, model=self.model_id, prompt_tokens=len(text) // 4,
                            completion_tokens=len(reply) // 4)


class StandInEncoder:
    encoder_id, dim = "bench-stand-in-encoder-576", DIM

    def encode(self, texts):
        return np.stack([np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little"))
                         .standard_normal(DIM).astype(np.float32) for t in texts])


def _summary(eps):
    return [(e.candidate, e.task.id, e.path, [(t.model, t.role, t.text) for t in e.turns], e.reward, e.correct)
            for e in eps]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--fill", choices=["synthetic", "real"], default="synthetic")
    ap.add_argument("--popsize", type=int, default=32)
    ap.add_argument("--episodes", type=int, default=16, help="episodes per candidate (= tasks per generation)")
    args = ap.parse_args()

    from trinity.coordinator.episode import RolloutTrees, StateCache
    from trinity.data.splits import build_splits
    from trinity.evolve.loop import evolve, minibatch, param_layout
    from trinity.grading import grade
    from trinity.pool.runtime import Pool, build_pool
    from trinity.store import Store

    real = args.fill == "real"
    members = [{"name": "a", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 24, "temperature": 0.8},
               {"name": "b", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 16, "temperature": 0.3}]
    half = args.episodes // 2
    settings = Settings.model_validate({
        "data": {"train": {"math500": half, "mmlu": args.episodes - half}, "heldout": {"gsm8k": 1},
                 "math500_max_level": 2},
        "pool": {"members": members},
        "coordinator": {"thinker_max_tokens": 16, "verifier_max_tokens": 4, "max_encode_tokens": 512},
        "evolve": {"generations": 1, "popsize": args.popsize, "episodes_per_candidate": args.episodes},
    })
    d = settings.data
    train, _ = build_splits(d.resolved_root(), train=d.train, heldout=d.heldout, seed=d.seed,
                            math500_max_level=d.math500_max_level)
    if real:
        from trinity.coordinator.policy import make_encoder

        encoder = make_encoder(settings)
    else:
        encoder = StandInEncoder()

    with tempfile.TemporaryDirectory(prefix="trinity-bench-gen-") as tmp, Store(Path(tmp) / "s.duckdb") as store:
        if real:
            pool = build_pool(settings.pool, store)  # evolve asks each role's caps of settings
        else:
            pool = Pool([StandInModel(m["name"]) for m in members], [PoolMember(**m) for m in members], store)
        states, trees = StateCache(encoder, store), RolloutTrees()
        t0 = time.perf_counter()
        fill = evolve(settings, train, pool, states, grade, store=store, run_id="fill", trees=trees).history[0]
        fill_s = time.perf_counter() - t0

        def generation(run_id, states=states, trees=trees):
            rec = evolve(settings, train, pool, states, grade, store=store, run_id=run_id, trees=trees).history[0]
            assert rec.calls_made == 0 and rec.states_encoded == 0, (rec.calls_made, rec.states_encoded)
            return rec

        generation("warm-up")
        layout = param_layout(settings, len(pool), states)
        tasks = minibatch(train, args.episodes, settings.evolve.seed, 0)
        gen_ms = [1e3 * generation(f"rep{rep}").wall_s for rep in range(args.reps)]
        assert pool.stats.calls_made == fill.calls_made, "the timed part made LLM calls"

        def episodes():
            return [type("E", (), {"candidate": k, "task": t, "path": "[]"}) for k in range(args.popsize) for t in tasks]

        # rows of one generation into the store, alone
        rows = [{"run_id": "rows", "generation": 0, "candidate": e.candidate, "task_id": e.task.id, "path": e.path,
                 "reward": 0.0, "correct": 0.0, "cost_usd": 0.0} for e in episodes()]
        put_ms = []
        for _ in range(3):
            t1 = time.perf_counter()
            store.put_episodes(rows)
            put_ms.append(1e3 * (time.perf_counter() - t1))
        # cold: fresh in-memory caches, everything read back from the store
        cold = generation("cold", states=StateCache(encoder, store), trees=RolloutTrees())
        n_states = store.state_count()
        n_responses = store.response_count()

    call_ms = _one_real_call_ms()
    figure = statistics.median(gen_ms)
    print(json.dumps({
        "name": "generation_cached", "figure": round(figure, 2), "unit": "ms per generation",
        "goal": "< one real call (compared_to)", "met": figure < call_ms,
        "compared_to": {"what": "one real SmolLM2-135M call (llama.cpp, 64 completion tokens, greedy), same run",
                        "ms": round(call_ms, 1)},
        "detail": {
            "generation_ms": [round(x, 2) for x in gen_ms],
            "put_episodes_ms": [round(x, 2) for x in put_ms],
            "cold_generation_ms": round(1e3 * cold.wall_s, 1),
            "popsize": args.popsize, "tasks": len(tasks), "episodes": args.popsize * len(tasks),
            "n_params": layout.n_params, "max_turns": settings.coordinator.max_turns, "fill": args.fill,
            "fill_calls": fill.calls_made, "fill_states": fill.states_encoded, "fill_s": round(fill_s, 1),
            "stored_responses": n_responses, "stored_states": n_states,
            "picks_per_generation": sum(fill.model_usage.values()), "reps": args.reps,
        },
    }))


def _one_real_call_ms() -> float:
    """Wall time of one real call to the cheapest bundled member (model loaded first; the median of 3)."""
    from trinity.config import PoolMember
    from trinity.pool.local import LocalChatModel
    from trinity.records import ChatMessage, SamplingParams

    model = LocalChatModel(PoolMember(name="smollm2", backend="local", model="smollm2-135m-instruct"))
    msgs = [ChatMessage(role="user", content="What is 17 * 23? Think step by step, then give the answer.")]
    sampling = SamplingParams(temperature=0.0, max_tokens=64)
    asyncio.run(model.chat(msgs, sampling))  # load
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        asyncio.run(model.chat(msgs, sampling))
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


if __name__ == "__main__":
    main()
