"""Transcript → feature vector: a hidden state of the coordinator LM.

The paper's feature is the last layer's hidden state at the *penultimate* token of the transcript
(the last token costs ~6 points in its ablation); layer, token position and mean pooling are
configurable here for ablations. The coordinator generates nothing, so encoding is one forward pass,
and almost all of the cost of a training run's encoding is spent on tokens it has seen before:

- **KV-prefix reuse.** Turn k+1 of an episode extends turn k's transcript, and sibling nodes of a
  rollout tree share their parent's transcript. The encoder keeps the key/value cache of recently
  encoded token sequences (LRU, bounded by entries and tokens) and runs only the tokens after the
  longest common *token* prefix (texts are tokenized whole, so a token that straddles the old/new
  boundary is recomputed), rounded down to whole chunks of `chunk_tokens` positions. Every sequence is
  run in chunks cut at the same absolute positions, cached or not, so a reused prefix gives *bit-identical*
  features to a full re-encode: a feature never depends on what happened to be cached, which is what makes
  a resumed or extended training run replay an uninterrupted one exactly. At least the last two tokens are
  always recomputed, so the penultimate token's state comes from a real forward pass. Stored caches are never written to: a reused prefix is
  a view that the next `DynamicCache.update` concatenates into a new tensor. (A transcript longer than
  `max_tokens` keeps its last tokens, so its start moves every turn and it is encoded from scratch.)
- **SVF.** With `svf_layer=k` the singular values of the weight matrices of block k are scaled
  (energy preserving: W' = U diag(S(1+δ)) Vᵀ · ΣS/ΣS(1+δ)), applied as W + U diag(S' − S) Vᵀ so δ=0
  gives W bit for bit. Blocks below k are frozen, so the residual stream at block k's input is cached
  per token sequence, and a new δ only recomputes blocks k and above.

A bundled GGUF id is dequantised through transformers' GGUF reader once and the fp32 copy is cached
(save_pretrained) under ~/.cache/trinity/models/hf/<id>/ (env TRINITY_MODEL_CACHE moves the root);
later loads read that copy. `encoder_id` names model, conversion, feature config and adapter; it is
the key of the hidden-state store. Not thread-safe: one encoder per process/thread.

Loading (GGUF → torch, dtype, threads) is in `encoder_loading`, the caches and the prefix lookup in
`prefix_cache`, the SVF decomposition and scaling in `svf`.
"""
from __future__ import annotations

import os
from typing import Literal, Sequence

import numpy as np

# OpenMP threads that spin while waiting collapse when the 2 cores are shared with pool models or other
# jobs (a forward pass measured 3-5x slower); sleeping waiters cost ~1% when the cores are free. This
# only takes effect if torch is first imported here; the user's own setting always wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

from trinity.coordinator.encoder_loading import (  # noqa: E402
    ENCODER_DTYPES, EncoderDtype, EncoderError, LoadedModel, hf_cache_root, load_causal_lm, num_threads_from_env,
    resolve_dtype,
)
from trinity.coordinator.prefix_cache import LRU, PrefixEntry, find_prefix  # noqa: E402
from trinity.coordinator.svf import SVFMatrix, adapter_key, apply_delta, decompose_block  # noqa: E402

Pooling = Literal["penultimate", "last", "mean"]
POOLINGS: tuple[str, ...] = ("penultimate", "last", "mean")

# Architectures whose decoder forward is embed → rotary → blocks → norm with no extra scaling; for these
# the encoder runs the blocks itself (needed for SVF's partial recompute and for stopping at an early
# feature layer). Any other causal LM goes through its own `model.model(...)` forward.
_BLOCK_LOOP_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})
_DEFAULT_PREFIX_CACHE_BYTES = 1 << 30
_DEFAULT_RESIDUAL_CACHE_BYTES = 256 << 20
_DTYPE_TAGS = {torch.float32: "fp32", torch.bfloat16: "bf16"}

__all__ = [
    "ENCODER_DTYPES", "POOLINGS", "EncoderDtype", "EncoderError", "LoadedModel", "Pooling", "TranscriptEncoder",
    "hf_cache_root", "load_causal_lm", "num_threads_from_env", "resolve_dtype",
]


class TranscriptEncoder:
    """Hidden-state features of transcripts from a causal LM (CPU, eval, no grad; features are float32).

    model: bundled GGUF id, .gguf path, local HF model directory or hub id (offline cache).
    layer: hidden-state index as in HF `hidden_states` (0 = embeddings, i = after block i,
        -1 or num_layers = last block after the final norm, the paper's choice).
    pooling: "penultimate" (paper), "last", or "mean" over all tokens.
    max_tokens: longer transcripts keep their leading special tokens and their last tokens.
    prefix_cache_entries / prefix_cache_tokens: LRU bounds of the KV-prefix cache (tokens default to
        what fits in 1 GiB of keys/values); prefix_cache_entries=0 disables prefix reuse.
    svf_layer: block index (negative counts from the end) whose matrices get SVF scales; None = no SVF.
    svf_matrices: names of the block's linear layers to adapt (default: all, e.g. q/k/v/o/gate/up/down).
    residual_cache_tokens: LRU bound (tokens) of the per-transcript residual cache used with SVF.
    dtype: compute dtype of the forward pass ("float32", "bfloat16", or "auto", see `resolve_dtype`); it is
        part of `encoder_id`, so features of different dtypes never mix in the hidden-state store.
    chunk_tokens: sequences are run in chunks cut at multiples of this many positions, and prefixes are reused
        in whole chunks, so an encode gives the same bits whatever the caches hold (see `_forward_frozen`).
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        *,
        layer: int = -1,
        pooling: Pooling = "penultimate",
        max_tokens: int = 2048,
        num_threads: int | None = None,
        prefix_cache_entries: int = 128,
        prefix_cache_tokens: int | None = None,
        svf_layer: int | None = None,
        svf_matrices: Sequence[str] | None = None,
        residual_cache_tokens: int | None = None,
        feature_cache_entries: int = 4096,
        dtype: EncoderDtype = "float32",
        chunk_tokens: int = 128,
    ):
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be >= 2, got {max_tokens}")
        if chunk_tokens < 1:
            raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
        self._chunk = chunk_tokens
        torch.set_num_threads(num_threads or num_threads_from_env())
        self._dtype = resolve_dtype(dtype)
        loaded = load_causal_lm(model)
        self._lm = loaded.model.to(self._dtype)
        self._tok = loaded.tokenizer
        self._model_key, self._conversion = loaded.model_key, loaded.conversion
        self._config = self._lm.config.get_text_config(decoder=True)
        self._base = self._lm.get_decoder() if hasattr(self._lm, "get_decoder") else self._lm.model
        self.num_layers = int(self._config.num_hidden_layers)
        self._dim = int(self._config.hidden_size)
        L = self.num_layers
        if not -(L + 1) <= layer <= L:
            raise ValueError(f"layer must be in [{-(L + 1)}, {L}] for a {L}-block model, got {layer}")
        self._h = layer % (L + 1)  # 0..L; L = final normed output
        self._pooling: Pooling = pooling
        self._max_tokens = max_tokens
        self._head = list(self._tok("", add_special_tokens=True)["input_ids"])

        self._layer_types = list(getattr(self._config, "layer_types", None) or ["full_attention"] * L)
        self._block_loop = (self._config.model_type in _BLOCK_LOOP_TYPES
                            and set(self._layer_types) <= {"full_attention", "sliding_attention"})
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer
        self._DynamicCache = DynamicCache
        probe = DynamicCache(config=self._config)
        # Prefix reuse needs plain growing layers (a sliding-window layer has dropped old tokens).
        self._reuse_ok = (len(probe.layers) == L and all(type(x) is DynamicLayer for x in probe.layers)
                          and prefix_cache_entries > 0)

        # SVF
        self._svf: list[SVFMatrix] = []
        self._svf_layer: int | None = None
        if svf_layer is not None:
            if not self._block_loop:
                raise NotImplementedError(
                    f"SVF needs the block loop, available for {sorted(_BLOCK_LOOP_TYPES)}; "
                    f"this model is {self._config.model_type!r}")
            if not -L <= svf_layer < L:
                raise ValueError(f"svf_layer must be in [{-L}, {L - 1}], got {svf_layer}")
            k = svf_layer % L
            if k >= self._h_blocks:
                raise ValueError(f"svf_layer {k} is not below the feature layer (hidden_states[{self._h}]); "
                                 f"its scales would not change the feature")
            self._svf_layer = k
            self._svf = decompose_block(self._base.layers[k], k, svf_matrices)
        self._svf_delta = np.zeros(self.svf_num_params, dtype=np.float32)
        self._adapter_key = ""

        # Frozen blocks whose keys/values the prefix cache holds.
        if not self._block_loop:
            self._n_frozen = L
        else:
            self._n_frozen = self._svf_layer if self._svf_layer is not None else self._h_blocks
        kv_heads = int(getattr(self._config, "num_key_value_heads", None) or self._config.num_attention_heads)
        head_dim = int(getattr(self._config, "head_dim", None) or self._dim // self._config.num_attention_heads)
        itemsize = torch.empty((), dtype=self._dtype).element_size()
        self.kv_bytes_per_token = 2 * self._n_frozen * kv_heads * head_dim * itemsize
        if prefix_cache_tokens is None:
            prefix_cache_tokens = _DEFAULT_PREFIX_CACHE_BYTES // max(self.kv_bytes_per_token, 1)
        if residual_cache_tokens is None:
            residual_cache_tokens = _DEFAULT_RESIDUAL_CACHE_BYTES // (itemsize * self._dim)
        self._prefix = LRU(max(prefix_cache_entries, 0), prefix_cache_tokens)
        self._residuals = LRU(1 << 30, residual_cache_tokens)
        self._features = LRU(feature_cache_entries, feature_cache_entries)
        self._stats = dict.fromkeys(("texts", "tokens", "feature_hits", "residual_hits", "prefix_hits",
                                     "tokens_reused", "tokens_computed", "upper_tokens"), 0)

    # -- identity ----------------------------------------------------------------------------------

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def model(self) -> torch.nn.Module:
        """The underlying transformers causal LM (shared, eval mode; SVF edits its weights in place)."""
        return self._lm

    @property
    def tokenizer(self):
        return self._tok

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def pooling(self) -> Pooling:
        return self._pooling

    @property
    def max_tokens(self) -> int:
        return self._max_tokens

    @property
    def _h_blocks(self) -> int:
        return self._h  # number of blocks the feature needs (L for the final output)

    @property
    def base_id(self) -> str:
        """Model + conversion + dtype + feature config: what the features are, before any SVF adapter."""
        return (f"{self._model_key}/{self._conversion}/{_DTYPE_TAGS[self._dtype]}/"
                f"h{self._h}of{self.num_layers}-{self.pooling}-max{self.max_tokens}-c{self._chunk}")

    @property
    def encoder_id(self) -> str:
        """`base_id` (+ adapter hash when SVF scales are non-zero)."""
        s = self.base_id
        if self._adapter_key:
            s += f"/{self._adapter_key}"
        return s

    # -- SVF ---------------------------------------------------------------------------------------

    @property
    def svf_num_params(self) -> int:
        return sum(m.size for m in self._svf)

    @property
    def svf_layout(self) -> list[tuple[str, int]]:
        """(matrix name, number of singular values) in the order `set_svf_delta` reads δ."""
        return [(m.name, m.size) for m in self._svf]

    @property
    def svf_delta(self) -> np.ndarray:
        return self._svf_delta.copy()

    def set_svf_delta(self, delta: np.ndarray) -> None:
        """Scale block `svf_layer`'s singular values by (1+δ), renormalised to keep ΣS per matrix."""
        if not self._svf:
            raise EncoderError("this encoder was built without svf_layer")
        d = np.asarray(delta, dtype=np.float32).reshape(-1)
        if d.shape != (self.svf_num_params,):
            raise ValueError(f"delta must have {self.svf_num_params} values, got shape {np.shape(delta)}")
        if not np.all(np.isfinite(d)):
            raise ValueError("delta has non-finite values")
        apply_delta(self._svf, d)
        self._svf_delta = d.copy()
        self._adapter_key = adapter_key(self._svf_layer, self._svf, d)

    # -- tokens --------------------------------------------------------------------------------------

    def tokenize(self, text: str) -> np.ndarray:
        """Token ids the model reads for `text` (leading special tokens kept, then the last tokens)."""
        ids = list(self._tok(text, add_special_tokens=True)["input_ids"])
        if len(ids) > self.max_tokens:
            head = self._head if ids[:len(self._head)] == self._head else []
            ids = head + ids[len(ids) - (self.max_tokens - len(head)):]
        if not ids:
            raise ValueError("text tokenizes to no tokens; the encoder needs at least one")
        return np.asarray(ids, dtype=np.int64)

    # -- encoding ------------------------------------------------------------------------------------

    def encode(self, texts: Sequence[str], *, reuse: bool = True) -> np.ndarray:
        """Features of `texts`, float32 (n, dim). reuse=False bypasses (and does not fill) every cache."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts")
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        if not texts:
            return out
        ids = [self.tokenize(t) for t in texts]
        # Parents before children (lexicographic token order) so each text can extend an earlier one.
        order = sorted(range(len(texts)), key=lambda i: ids[i].tolist())
        with torch.no_grad():
            for i in order:
                out[i] = self._encode_ids(ids[i], reuse)
        return out

    def encode_ids(self, ids: np.ndarray, *, reuse: bool = True) -> np.ndarray:
        """Feature of one already tokenized sequence, float32 (dim,)."""
        with torch.no_grad():
            return self._encode_ids(np.asarray(ids, dtype=np.int64), reuse)

    def clear_cache(self) -> None:
        self._prefix.clear()
        self._residuals.clear()
        self._features.clear()

    def cache_stats(self) -> dict:
        return {
            **self._stats,
            "prefix_entries": len(self._prefix), "prefix_tokens": self._prefix.size,
            "prefix_bytes": self._prefix.size * self.kv_bytes_per_token,
            "residual_entries": len(self._residuals), "residual_tokens": self._residuals.size,
            "feature_entries": len(self._features),
        }

    def _encode_ids(self, ids: np.ndarray, reuse: bool) -> np.ndarray:
        n = len(ids)
        key = ids.tobytes()
        st = self._stats
        st["texts"] += 1
        st["tokens"] += n
        fkey = self._adapter_key.encode() + b"|" + key
        if reuse:
            hit = self._features.get(fkey)
            if hit is not None:
                st["feature_hits"] += 1
                return hit.copy()
        svf = self._svf_layer is not None
        residual = self._residuals.get(key) if (svf and reuse) else None
        if residual is not None:
            st["residual_hits"] += 1
        else:
            use_prefix = reuse and self._reuse_ok
            p, entry = (find_prefix(self._prefix, ids, max_p=n if svf else n - min(2, n), chunk=self._chunk)
                        if use_prefix else (0, None))
            if entry is not None and p == n:  # SVF: same tokens, residual still in the prefix entry
                x = entry.residual[:0]
                cache = None
            else:
                cache = self._cache_from(entry, p)
                x = self._forward_frozen(torch.from_numpy(ids[p:]).unsqueeze(0), p, cache)
            st["tokens_reused"] += p
            st["tokens_computed"] += n - p
            if entry is not None:
                st["prefix_hits"] += 1
            if svf:
                residual = x if entry is None else torch.cat([entry.residual[:p], x])
            states = None
            if not svf:
                states = x if entry is None or self.pooling != "mean" else torch.cat([entry.states[:p], x])
            if use_prefix and cache is not None:
                if entry is not None and p == len(entry.ids):
                    self._prefix.pop(entry.ids.tobytes())  # superseded: the new entry extends it
                kv = [(cache.layers[i].keys, cache.layers[i].values) for i in range(self._n_frozen)]
                self._prefix.put(key, PrefixEntry(ids, kv, residual if svf else None,
                                                   states if self.pooling == "mean" else None), n)
            if svf and reuse:
                self._residuals.put(key, residual, n)
            if not svf:
                # Rows of `states` are tokens offset..n-1.
                feat = self._pool(states, n, offset=n - states.shape[0])
                if reuse:
                    self._features.put(fkey, feat, 1)
                return feat.copy()
        # SVF: blocks from the adapted one upward, over the whole sequence.
        st["upper_tokens"] += n
        pos = torch.arange(n).unsqueeze(0)
        h = self._run_blocks(residual.unsqueeze(0), self._svf_layer, self._h_blocks, pos, None)
        if self._h == self.num_layers:
            h = self._base.norm(h)
        feat = self._pool(h[0], n, offset=0)
        if reuse:
            self._features.put(fkey, feat, 1)
        return feat.copy()

    def _pool(self, states: torch.Tensor, n: int, offset: int) -> np.ndarray:
        if self.pooling == "mean":
            v = states.to(torch.float32).mean(dim=0)
        else:
            pos = n - 1 if self.pooling == "last" else max(n - 2, 0)
            v = states[pos - offset]
        return v.to(torch.float32).numpy().copy()

    def _cache_from(self, entry: PrefixEntry | None, p: int):
        cache = self._DynamicCache(config=self._config)
        if entry is not None and p > 0:
            for layer, (k, v) in zip(cache.layers, entry.kv):
                layer.lazy_initialization(k, v)
                # Views: DynamicLayer.update concatenates into a new tensor, never writes into these.
                layer.keys, layer.values = k[:, :, :p, :], v[:, :, :p, :]
        return cache

    def _forward_frozen(self, new_ids: torch.Tensor, p: int, cache) -> torch.Tensor:
        """Run the frozen part over tokens p.. (extending `cache`) in chunks aligned to multiples of `chunk`
        positions: returns, per new token, the stream at the SVF block's input, or (no SVF) the feature-layer
        state, final-normed if it is the last layer. Every encode, cached or not, cuts a sequence at the same
        positions, so a feature never depends on what happened to be in the cache (resumed runs are exact)."""
        m = new_ids.shape[1]
        if m == 0:
            return self._forward_span(new_ids, p, cache)
        outs, start = [], 0
        while start < m:
            end = min(m, ((p + start) // self._chunk + 1) * self._chunk - p)
            outs.append(self._forward_span(new_ids[:, start:end], p + start, cache))
            start = end
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _forward_span(self, new_ids: torch.Tensor, p: int, cache) -> torch.Tensor:
        m = new_ids.shape[1]
        pos = torch.arange(p, p + m).unsqueeze(0)
        if not self._block_loop:
            want = self._h
            out = self._base(input_ids=new_ids, position_ids=pos, past_key_values=cache, use_cache=True,
                             output_hidden_states=want if want != self.num_layers else None)
            h = out.last_hidden_state if want == self.num_layers else out.hidden_states[want]
            return h[0]
        x = self._base.embed_tokens(new_ids)
        x = self._run_blocks(x, 0, self._n_frozen, pos, cache)
        if self._svf_layer is None and self._h == self.num_layers:
            x = self._base.norm(x)
        return x[0]

    def _run_blocks(self, x: torch.Tensor, start: int, stop: int, pos: torch.Tensor, cache) -> torch.Tensor:
        """Blocks [start, stop) over x [1, m, d] at positions `pos`, as the model's own forward does."""
        if start >= stop:
            return x
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        kw = dict(config=self._config, inputs_embeds=x, attention_mask=None, past_key_values=cache,
                  position_ids=pos)
        types = self._layer_types[start:stop]
        masks = {}
        if "full_attention" in types:
            masks["full_attention"] = create_causal_mask(**kw)
        if "sliding_attention" in types:
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
        pe = self._base.rotary_emb(x, pos)
        for i in range(start, stop):
            x = self._base.layers[i](x, attention_mask=masks[self._layer_types[i]], position_embeddings=pe,
                                     position_ids=pos, past_key_values=cache, use_cache=cache is not None)
        return x
