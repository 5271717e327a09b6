"""Local decode speed through Trinity (Pool.complete → LocalChatModel → worker thread) vs raw
llama-cpp-python on the same GGUF, prompt and settings, interleaved in one run (goal: ratio >= 0.8)."""
import asyncio
import json
import statistics
import sys
import time

from trinity.config import PoolMember, PoolSettings
from trinity.pool.bundled import model_path
from trinity.pool.local import load_llama
from trinity.pool.runtime import build_pool
from trinity.records import ChatMessage

MODEL = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b-instruct"
MAX_TOKENS = 96
PROMPT = "Explain, step by step, how to compute the greatest common divisor of 1071 and 462."


def main():
    member = PoolMember(name="m", backend="local", model=MODEL, max_tokens=MAX_TOKENS, temperature=0.0)
    pool = build_pool(PoolSettings(members=[member]), store=None)  # no store: every call decodes
    llm, lock = load_llama(model_path(MODEL), member.n_ctx, member.n_threads)
    trinity_tps, raw_tps = [], []
    for rep in range(6):
        # same prompt on both sides within a rep (identical greedy output), a new prompt per rep; the side that
        # goes second gets llama.cpp's prompt cache, so the order alternates
        text = f"{PROMPT} (run {rep})"

        def trinity():
            t0 = time.perf_counter()
            out = asyncio.run(pool.complete(0, [ChatMessage("user", text)], "worker"))
            trinity_tps.append(out.completion_tokens / (time.perf_counter() - t0))

        def raw():
            t0 = time.perf_counter()
            with lock:
                out = llm.create_chat_completion(messages=[{"role": "user", "content": text}], max_tokens=MAX_TOKENS,
                                                 temperature=0.0, top_p=0.95, seed=0)
            raw_tps.append(out["usage"]["completion_tokens"] / (time.perf_counter() - t0))

        for side in ((trinity, raw) if rep % 2 == 0 else (raw, trinity)):
            side()
    t, r = statistics.median(trinity_tps), statistics.median(raw_tps)
    print(json.dumps({"name": "pool_decode", "figure": round(t / r, 3), "unit": "ratio", "goal": ">= 0.8",
                      "compared_to": f"raw llama-cpp-python create_chat_completion, same GGUF ({MODEL}) and prompt",
                      "detail": {"trinity_tok_per_s": [round(x, 2) for x in trinity_tps],
                                 "raw_tok_per_s": [round(x, 2) for x in raw_tps], "max_tokens": MAX_TOKENS,
                                 "n_threads": member.n_threads}}))


if __name__ == "__main__":
    sys.exit(main())
