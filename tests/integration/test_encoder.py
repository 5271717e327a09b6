"""TranscriptEncoder on the real bundled SmolLM2-135M (converted once from its GGUF, then cached)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from trinity.coordinator import encoder as encoder_mod
from trinity.coordinator.encoder import TranscriptEncoder, hf_cache_root

MODEL = "smollm2-135m-instruct"

EPISODE = [
    "system: You coordinate a pool of models.\nuser: A train leaves at 3pm travelling 60 km/h; a second "
    "one leaves the same station at 4pm at 90 km/h. When does the second catch up?",
    "\nworker: The first train has a 60 km head start. The gap closes at 30 km/h, so it takes 2 hours: "
    "the second train catches up at 6pm.",
    "\nverifier: REJECT. Check the head start again before accepting.",
    "\nthinker: <suggestion>Recompute the distance covered in the first hour.</suggestion>"
    "<suggested_role>worker</suggested_role>",
    "\nworker: In one hour the first train covers 60 km. 60 / (90 - 60) = 2 hours, so 6pm. Final: 6pm.",
]


def transcripts(parts: list[str]) -> list[str]:
    return ["".join(parts[: k + 1]) for k in range(len(parts))]


@pytest.fixture(scope="module")
def enc() -> TranscriptEncoder:
    # No feature memo, so repeated texts exercise the KV caches rather than a dictionary lookup; chunks of 16
    # positions (default 64) so these short transcripts reuse prefixes at several chunk boundaries.
    return TranscriptEncoder(MODEL, feature_cache_entries=0, chunk_tokens=16)


@pytest.fixture(scope="module")
def enc_last() -> TranscriptEncoder:
    return TranscriptEncoder(MODEL, pooling="last", max_tokens=64)


@pytest.fixture(scope="module")
def enc_svf() -> TranscriptEncoder:
    return TranscriptEncoder(MODEL, svf_layer=-2, feature_cache_entries=0)


def hf_hidden_states(e: TranscriptEncoder, text: str) -> tuple[torch.Tensor, ...]:
    ids = torch.from_numpy(e.tokenize(text)).unsqueeze(0)
    with torch.no_grad():
        return e.model(ids, output_hidden_states=True).hidden_states


def test_shapes_dtype_and_id(enc):
    out = enc.encode(["user: hi", "user: what is 2+2?\nworker: 4", EPISODE[0]])
    assert out.shape == (3, 576) and out.dtype == np.float32
    assert enc.dim == 576 and np.all(np.isfinite(out))
    assert enc.encode([]).shape == (0, 576)
    assert MODEL in enc.encoder_id and "penultimate" in enc.encoder_id
    with pytest.raises(TypeError):
        enc.encode("a bare string")


def test_deterministic_and_leaves_numpy_rng_alone(enc):
    state = np.random.get_state()
    a = enc.encode(EPISODE[:2], reuse=False)
    b = enc.encode(EPISODE[:2], reuse=False)
    np.testing.assert_array_equal(a, b)
    after = np.random.get_state()
    assert state[0] == after[0] and np.array_equal(state[1], after[1]) and state[2:] == after[2:]


def test_feature_is_penultimate_token_of_last_layer(enc, enc_last):
    text = EPISODE[0]
    hs = hf_hidden_states(enc, text)
    pen = enc.encode([text], reuse=False)[0]
    np.testing.assert_allclose(pen, hs[-1][0, -2].numpy(), atol=1e-5)
    last = enc_last.encode([text[:150]])[0]  # short enough for enc_last's max_tokens
    np.testing.assert_allclose(last, hf_hidden_states(enc_last, text[:150])[-1][0, -1].numpy(), atol=1e-5)
    assert np.abs(pen - enc_last.encode([text], reuse=False)[0]).max() > 1e-2
    assert enc.encoder_id != enc_last.encoder_id


def test_long_transcripts_keep_their_last_tokens(enc, enc_last):
    text = "".join(EPISODE)
    full = enc.tokenize(text)
    kept = enc_last.tokenize(text)
    assert len(full) > 64 and len(kept) == 64
    np.testing.assert_array_equal(kept, full[-64:])


def test_prefix_reuse_equals_full_encode_over_an_episode(enc):
    enc.clear_cache()
    texts = transcripts(EPISODE)
    before = enc.cache_stats()["tokens_reused"]
    incremental = np.stack([enc.encode([t])[0] for t in texts])  # one turn at a time, as an episode runs
    assert enc.cache_stats()["tokens_reused"] > before
    full = enc.encode(texts, reuse=False)
    np.testing.assert_array_equal(incremental, full)  # bit for bit: chunks cut at the same positions either way


def test_prefix_reuse_in_a_rollout_tree_does_not_corrupt_shared_prefixes(enc):
    enc.clear_cache()
    root = EPISODE[0]
    a = root + EPISODE[1]
    b = root + EPISODE[2]
    a2 = a + EPISODE[3]
    # Token boundary: "wor" + "ker" re-tokenizes differently from "wor" alone.
    c = root + "\nwor"
    c2 = root + "\nworker: six pm"
    unique = [root, a, b, a2, c, c2]
    order = unique + [a, b, root]
    hits = enc.cache_stats()["prefix_hits"]
    got = np.stack([enc.encode([t])[0] for t in order])
    assert enc.cache_stats()["prefix_hits"] - hits >= 6
    want = enc.encode(unique, reuse=False)
    np.testing.assert_array_equal(got, want[[0, 1, 2, 3, 4, 5, 1, 2, 0]])
    # Batched: parents are encoded before children, so the batch reuses its own prefixes.
    enc.clear_cache()
    np.testing.assert_array_equal(enc.encode([a2, b, root, a]), want[[3, 2, 0, 1]])


def test_prefix_cache_is_bounded():
    e = TranscriptEncoder(MODEL, prefix_cache_entries=2, prefix_cache_tokens=120)
    for t in [EPISODE[0], EPISODE[1], EPISODE[2], EPISODE[3] * 3]:
        e.encode([t])
        s = e.cache_stats()
        assert s["prefix_entries"] <= 2 and s["prefix_tokens"] <= 120


def test_svf_zero_delta_is_the_original_layer(enc, enc_svf):
    block = enc_svf.model.model.layers[enc_svf.num_layers - 2]
    originals = {n: m.weight.detach().clone() for n, m in block.named_modules()
                 if isinstance(m, torch.nn.Linear)}
    assert enc_svf.svf_num_params == 5 * 576 + 2 * 192  # q,o,gate,up,down: 576; k,v: 192
    base_id = enc_svf.encoder_id
    texts = EPISODE[:2]
    rng = np.random.default_rng(0)
    enc_svf.set_svf_delta(rng.normal(0, 0.05, enc_svf.svf_num_params))
    enc_svf.set_svf_delta(np.zeros(enc_svf.svf_num_params))
    for n, m in block.named_modules():
        if isinstance(m, torch.nn.Linear):
            assert torch.equal(m.weight, originals[n]), n
    assert enc_svf.encoder_id == base_id
    np.testing.assert_allclose(enc_svf.encode(texts), enc.encode(texts, reuse=False), atol=1e-4)


def test_svf_scaling_matches_the_formula_and_preserves_energy(enc_svf):
    rng = np.random.default_rng(1)
    delta = rng.normal(0, 0.1, enc_svf.svf_num_params).astype(np.float32)
    block = enc_svf.model.model.layers[enc_svf.num_layers - 2]
    try:
        enc_svf.set_svf_delta(delta)
        off = 0
        for name, size in enc_svf.svf_layout:
            m = dict(block.named_modules())[name]
            w0 = next(x.w0 for x in enc_svf._svf if x.name == name).double()
            u, s, vh = torch.linalg.svd(w0, full_matrices=False)
            s1 = s * (1 + torch.from_numpy(delta[off:off + size]).double())
            want = (u * s1) @ vh * (s.sum() / s1.sum())
            torch.testing.assert_close(m.weight.double(), want, atol=1e-5, rtol=0)
            got_s = torch.linalg.svdvals(m.weight.double())
            assert abs(got_s.sum().item() - s.sum().item()) < 1e-3 * s.sum().item()
            off += size
    finally:
        enc_svf.set_svf_delta(np.zeros(enc_svf.svf_num_params))


def test_svf_cached_residual_equals_full_recompute_and_id_tracks_delta(enc_svf):
    texts = transcripts(EPISODE[:3])
    rng = np.random.default_rng(2)
    d1 = rng.normal(0, 0.1, enc_svf.svf_num_params)
    d2 = rng.normal(0, 0.1, enc_svf.svf_num_params)
    ids = {}
    try:
        enc_svf.clear_cache()
        base = enc_svf.encode(texts)  # fills the residual cache at δ=0
        ids[0] = enc_svf.encoder_id
        for k, d in ((1, d1), (2, d2)):
            enc_svf.set_svf_delta(d)
            ids[k] = enc_svf.encoder_id
            hits = enc_svf.cache_stats()["residual_hits"]
            cached = enc_svf.encode(texts)
            assert enc_svf.cache_stats()["residual_hits"] == hits + len(texts)
            full = enc_svf.encode(texts, reuse=False)
            np.testing.assert_array_equal(cached, full)
            assert np.abs(cached - base).max() > 1e-3
        enc_svf.set_svf_delta(d1)
        assert enc_svf.encoder_id == ids[1]
    finally:
        enc_svf.set_svf_delta(np.zeros(enc_svf.svf_num_params))
    assert len(set(ids.values())) == 3 and "svf" in ids[1]


def test_svf_layer_must_be_below_the_feature_layer():
    with pytest.raises(ValueError, match="pooling"):
        TranscriptEncoder(MODEL, pooling="first")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not below"):
        TranscriptEncoder(MODEL, layer=10, svf_layer=12)


def test_generic_forward_path_from_a_local_hf_directory(enc, monkeypatch):
    """Architectures without the block loop use the model's own forward (with the same KV reuse)."""
    monkeypatch.setattr(encoder_mod, "_BLOCK_LOOP_TYPES", frozenset())
    e = TranscriptEncoder(str(hf_cache_root() / MODEL), layer=12, pooling="mean", chunk_tokens=16)
    assert e.encoder_id.startswith(MODEL + "@") and "h12of30-mean" in e.encoder_id
    texts = transcripts(EPISODE[:3])
    got = np.stack([e.encode([t])[0] for t in texts])
    assert e.cache_stats()["prefix_hits"] == 2
    np.testing.assert_array_equal(got, e.encode(texts, reuse=False))
    for t, g in zip(texts, got):
        np.testing.assert_allclose(g, hf_hidden_states(enc, t)[12][0].mean(0).numpy(), atol=1e-4)
    with pytest.raises(NotImplementedError):
        TranscriptEncoder(str(hf_cache_root() / MODEL), svf_layer=3)


@pytest.fixture(scope="module")
def enc_bf16() -> TranscriptEncoder:
    return TranscriptEncoder(MODEL, feature_cache_entries=0, dtype="bfloat16", chunk_tokens=16)


def test_bfloat16_features_follow_fp32_and_have_their_own_id(enc, enc_bf16):
    texts = transcripts(EPISODE)
    full32 = enc.encode(texts, reuse=False)
    full16 = enc_bf16.encode(texts, reuse=False)
    assert full16.dtype == np.float32 and enc_bf16.dtype == torch.bfloat16
    cos = (full16 * full32).sum(1) / np.linalg.norm(full16, axis=1) / np.linalg.norm(full32, axis=1)
    assert cos.min() > 0.999, cos
    assert "/bf16/" in enc_bf16.encoder_id and "/fp32/" in enc.encoder_id  # never mixed in the state store
    enc_bf16.clear_cache()
    incremental = np.stack([enc_bf16.encode([t])[0] for t in texts])  # prefix reuse in bf16
    assert enc_bf16.cache_stats()["tokens_reused"] > 0
    np.testing.assert_array_equal(incremental, full16)  # exact in bf16 too: a resumed run replays exactly


def test_dtype_is_validated():
    with pytest.raises(ValueError, match="dtype"):
        encoder_mod.resolve_dtype("float16")
    assert encoder_mod.resolve_dtype("float32") is torch.float32
    assert encoder_mod.resolve_dtype("auto") in (torch.float32, torch.bfloat16)
