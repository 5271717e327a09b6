"""P-bench: transcript-encoder throughput vs a plain transformers forward pass of the same model.

Transcripts of 300, 750 and 1500 tokens (cut from the realistic episode of bench/prefix_reuse.py) are
encoded (a) by `TranscriptEncoder.encode([text], reuse=False)` (no caches: the engine alone) and (b) the
way the paper's code does it, `model(**tokenizer(text), output_hidden_states=True)` on the same
transformers model object, taking `hidden_states[-1][0, -2]`. Both sides tokenize, run on the same
threads, are warmed up, and alternate order within each repetition; the figure is the ratio of
tokens/s, median over repetitions. Features of both sides are compared (they must agree to ~1e-5).
--dtype picks the compute dtype of the shared model object (default auto, as the pipeline's
coordinator.encoder_dtype: bfloat16 on CPUs with native bf16 kernels). When that is not float32, a plain fp32
forward of a second copy is timed too (detail: the speed-up over the paper's fp32 way, and how far the
features moved).

Usage: .venv/bin/python -m bench.encoder_throughput [--model smollm2-135m-instruct] [--reps 5] [--dtype auto] [--chunk-tokens 128]
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

from bench.prefix_reuse import transcripts
from trinity.coordinator.encoder import TranscriptEncoder, load_causal_lm

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--chunk-tokens", type=int, default=128, help="encode chunk size (params: coordinator.encode_chunk_tokens)")
    ap.add_argument("--lengths", default="300,750,1500")
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    args = ap.parse_args()

    enc = TranscriptEncoder(args.model, feature_cache_entries=0, dtype=args.dtype, chunk_tokens=args.chunk_tokens)
    lm, tok = enc.model, enc.tokenizer
    episode = transcripts()[-1]
    ids = enc.tokenize(episode + episode)
    texts = [tok.decode(ids[:n].tolist()) for n in (int(x) for x in args.lengths.split(","))]
    n_tokens = [len(tok(t)["input_ids"]) for t in texts]
    print(f"encoder {enc.encoder_id}; lengths {n_tokens}", file=sys.stderr)

    def plain(text: str) -> np.ndarray:
        with torch.no_grad():
            inputs = tok(text, return_tensors="pt")
            hs = lm(**inputs, output_hidden_states=True).hidden_states
            return hs[-1][0, -2].float().numpy().copy()

    def ours(text: str) -> np.ndarray:
        return enc.encode([text], reuse=False)[0]

    sides = {"encoder": ours, "plain": plain}
    if enc.dtype != torch.float32:
        lm32 = load_causal_lm(args.model).model  # fp32, as loaded

        def plain_fp32(text: str) -> np.ndarray:
            with torch.no_grad():
                return lm32(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states[-1][0, -2].numpy().copy()

        sides["plain_fp32"] = plain_fp32
    for f in sides.values():  # warm-up
        f(texts[0])
    times = {s: [[] for _ in texts] for s in sides}
    max_diff = 0.0
    cos_fp32 = []
    ratios = []
    for rep in range(args.reps):
        for i, text in enumerate(texts):
            order = tuple(sides) if (rep + i) % 2 == 0 else tuple(reversed(sides))
            feats = {}
            for s in order:
                t0 = time.perf_counter()
                feats[s] = sides[s](text)
                times[s][i].append(time.perf_counter() - t0)
            max_diff = max(max_diff, float(np.abs(feats["encoder"] - feats["plain"]).max()))
            if "plain_fp32" in feats:
                a, b = feats["encoder"].astype(np.float64), feats["plain_fp32"].astype(np.float64)
                cos_fp32.append(float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)))
        rep_enc = sum(x[-1] for x in times["encoder"])
        rep_plain = sum(x[-1] for x in times["plain"])
        ratios.append(rep_plain / rep_enc)
        print(f"rep {rep + 1}: encoder {rep_enc:.3f}s, plain {rep_plain:.3f}s", file=sys.stderr)

    total = sum(n_tokens)
    med = {s: [statistics.median(x) for x in times[s]] for s in sides}
    tps = {s: total / sum(med[s]) for s in sides}
    print(f"{'tokens':>6} {'encoder_ms':>10} {'plain_ms':>9}")
    for i, n in enumerate(n_tokens):
        print(f"{n:>6} {med['encoder'][i] * 1e3:>10.1f} {med['plain'][i] * 1e3:>9.1f}")
    print(f"tokens/s: encoder {tps['encoder']:.1f}, plain {tps['plain']:.1f}")
    print(json.dumps({
        "name": "encoder_throughput",
        "figure": round(statistics.median(ratios), 3),
        "unit": "x (encoder tokens/s / plain forward tokens/s)",
        "goal": ">= 1.0",
        "compared_to": "transformers model(**inputs, output_hidden_states=True) on the same model object",
        "detail": {
            "encoder_id": enc.encoder_id, "reps": args.reps, "threads": torch.get_num_threads(),
            "lengths_tokens": n_tokens,
            "encoder_tokens_per_s": round(tps["encoder"], 1), "plain_tokens_per_s": round(tps["plain"], 1),
            "encoder_ms": [round(v * 1e3, 1) for v in med["encoder"]],
            "plain_ms": [round(v * 1e3, 1) for v in med["plain"]],
            "per_rep_ratio": [round(r, 3) for r in ratios],
            "max_abs_feature_diff": max_diff,
            **({"plain_fp32_tokens_per_s": round(tps["plain_fp32"], 1),
                "speedup_vs_plain_fp32": round(tps["encoder"] / tps["plain_fp32"], 3),
                "min_cosine_vs_fp32_features": round(min(cos_fp32), 6)} if cos_fp32 else {}),
        },
    }))


if __name__ == "__main__":
    main()
