"""Loading the encoder's causal LM: a bundled GGUF id, a .gguf path, a local HF directory or a hub id → fp32 CPU
torch modules, with a key that names the weights and how they were converted; the compute dtype and thread count.

A bundled GGUF id is dequantised through transformers' GGUF reader once and the fp32 copy is cached
(save_pretrained) under ~/.cache/trinity/models/hf/<id>/ (env TRINITY_MODEL_CACHE moves the root);
later loads read that copy.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from trinity.files import file_sha256
from trinity.pool import bundled

EncoderDtype = Literal["auto", "float32", "bfloat16"]
ENCODER_DTYPES: tuple[str, ...] = ("auto", "float32", "bfloat16")
_CONVERSION_MARKER = "trinity-conversion.json"


class EncoderError(RuntimeError):
    pass


AUTO_DTYPE_ENV = "TRINITY_ENCODER_AUTO_DTYPE"
"""What "auto" resolves to, instead of this CPU's pick: a replay sets it to the dtype of the states it ships
(`trinity.store_segments`), so that a run made on a bf16 CPU is replayed from its own states on any CPU."""


def resolve_dtype(dtype: str) -> torch.dtype:
    """"float32" | "bfloat16" | "auto": bfloat16 where oneDNN has native bf16 kernels (AVX512-BF16 / AMX),
    about 2x faster than fp32 there with features within ~1e-4 cosine of fp32; fp32 elsewhere (bf16 is
    emulated, and slower, on CPUs without those instructions). env TRINITY_ENCODER_AUTO_DTYPE overrides auto."""
    if dtype == "float32":
        return torch.float32
    if dtype == "bfloat16":
        return torch.bfloat16
    if dtype == "auto":
        forced = os.environ.get(AUTO_DTYPE_ENV, "").strip()
        if forced:
            if forced not in ("float32", "bfloat16"):
                raise ValueError(f"{AUTO_DTYPE_ENV}={forced!r}: expected float32 or bfloat16")
            return resolve_dtype(forced)
        try:
            native = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):
            native = False
        return torch.bfloat16 if native else torch.float32
    raise ValueError(f"dtype must be one of {ENCODER_DTYPES}, got {dtype!r}")


def num_threads_from_env(default: int = 2) -> int:
    """Torch CPU threads: env TRINITY_TORCH_THREADS, else `default` (the project's machines have 2 cores)."""
    raw = os.environ.get("TRINITY_TORCH_THREADS")
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise EncoderError(f"TRINITY_TORCH_THREADS must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise EncoderError(f"TRINITY_TORCH_THREADS must be a positive integer, got {raw!r}")
    return n


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    model_key: str
    """Which weights: id/path plus a content fingerprint."""
    conversion: str
    """How they became the fp32 torch module (e.g. GGUF dequantised by transformers x.y)."""


def hf_cache_root() -> Path:
    return bundled.cache_dir() / "hf"


def _gguf_source(model: str) -> tuple[str, Path, str] | None:
    """(cache name, gguf path, sha256) for a bundled id or a .gguf path; None for HF models."""
    if model in bundled.BUNDLED:
        path = bundled.model_path(model)  # assembles and hash-checks the parts
        marker = path.with_suffix(path.suffix + ".sha256")
        sha = marker.read_text().strip() if marker.exists() else file_sha256(path)
        return model, path, sha
    p = Path(model).expanduser()
    if p.suffix == ".gguf" and p.is_file():
        sha = file_sha256(p)
        return f"{p.stem}-{sha[:12]}", p, sha
    return None


def _convert_gguf(gguf: Path, out: Path, sha: str) -> None:
    """Dequantise a GGUF to an fp32 HF checkpoint at `out` (atomically: temp dir, then rename)."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # `from_pretrained(gguf_file=...)` needs accelerate; the same transformers GGUF reader is used
    # directly instead: config and tokenizer from the file's metadata, tensors dequantised to fp32.
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    parsed = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)
    tensors = {k: torch.as_tensor(v, dtype=torch.float32) for k, v in parsed["tensors"].items()}
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied:
        raise EncoderError(
            f"GGUF {gguf} does not map onto {type(model).__name__}: missing {sorted(set(missing) - tied)}, "
            f"unexpected {sorted(unexpected)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    os.chmod(tmp, 0o755)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _CONVERSION_MARKER).write_text(json.dumps({
            "source": gguf.name, "source_sha256": sha, "dtype": "float32",
            "transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
        }, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:
            # Another process finished the same conversion first; its copy is as good as ours.
            if not (out / _CONVERSION_MARKER).exists():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _dir_fingerprint(d: Path) -> str:
    h = hashlib.sha256()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        f = d / name
        if f.exists():
            h.update(name.encode() + b"\0" + f.read_bytes())
    for f in sorted(d.glob("*.safetensors")) + sorted(d.glob("*.bin")):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:12]


def load_causal_lm(model: str, attn_implementation: str = "sdpa") -> LoadedModel:
    """Load `model` (bundled GGUF id, .gguf path, local HF directory or hub id) as fp32 CPU modules."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_source(model)
    if src is not None:
        name, gguf, sha = src
        out = hf_cache_root() / name
        marker = out / _CONVERSION_MARKER
        meta = json.loads(marker.read_text()) if marker.exists() else None
        if meta is None or meta.get("source_sha256") != sha:
            _convert_gguf(gguf, out, sha)
            meta = json.loads(marker.read_text())
        path, model_key = out, f"{name}@sha256:{sha[:16]}"
        conversion = f"gguf-dequant-tf{meta['transformers']}"
    else:
        p = Path(model).expanduser()
        if p.is_dir():
            path, model_key, conversion = p, f"{p.resolve().name}@{_dir_fingerprint(p)}", "hf"
        else:
            path, model_key, conversion = model, model, "hf"  # hub id; revision appended below
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=attn_implementation)
    tok = AutoTokenizer.from_pretrained(path)
    if src is None and not Path(str(path)).is_dir():
        commit = getattr(lm.config, "_commit_hash", None)
        model_key = f"{model}@{commit[:12]}" if commit else model
    lm.eval()
    lm.requires_grad_(False)
    return LoadedModel(lm, tok, model_key, conversion)
