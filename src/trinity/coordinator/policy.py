"""The trained policy: a checkpoint ⇄ encoder, features, head and SVF scales. The one place that builds the
encoder the settings name, saves and loads a checkpoint, checks it against the settings it is played with, and
splits its parameter vector; the evolve and evaluate stages, serving (`trinity ask`, `trinity serve`) and the
benches all go through it.

A checkpoint is two files with one stem (data/checkpoints/coordinator):
- `<stem>.npy`: the flat parameter vector the optimiser evolved (float64, `np.save`), laid out as
  `ParamLayout`: [δ (SVF scales of one encoder block)…, head W…], δ only when `coordinator.svf_layer` is set;
- `<stem>.json`: what it was trained with (written by the evolve stage; a typed record, `CheckpointMeta`): the pool (member names in order, model
  ids), the encoder id (base, δ = 0), `svf_layer`, the feature map (`features`: none, or a standardising map's
  mean and scale: `coordinator.features`), the head shape, the run fingerprint, code version and fitness.
Each file is written whole or not at all (`trinity.files`), the parameters first.

A checkpoint is played only with what it was trained with (`Policy.check`, one error type, `CheckpointError`): the
same pool members in the same order (the head's first L logits are theirs), the same `coordinator.svf_layer` and
`coordinator.feature_norm`, the same encoder (its hidden states are what the head reads), and so a parameter vector
of the layout that pool and encoder give. The feature map itself is the checkpoint's, never refitted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trinity.config import Settings
from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.coordinator.features import FeatureMap
from trinity.coordinator.head import HeadShape, ParamLayout
from trinity.files import atomic_open, write_text


class CheckpointError(ValueError):
    """The checkpoint is missing, or does not fit the settings (pool, svf_layer, feature_norm, encoder, shape)."""


def make_encoder(settings: Settings):
    """The transcript encoder `settings.coordinator` names (model, token budget, SVF block, dtype, chunking)."""
    from trinity.coordinator.encoder import TranscriptEncoder

    c = settings.coordinator
    return TranscriptEncoder(c.encoder, max_tokens=c.max_encode_tokens, svf_layer=c.svf_layer, dtype=c.encoder_dtype,
                             chunk_tokens=c.encode_chunk_tokens)


def checkpoint_layout(settings: Settings, n_models: int, states) -> ParamLayout:
    """The layout of a trained parameter vector played on `states` (a `StateCache`: its encoder and feature map)
    with a pool of `n_models`, as in training: the head reads `states.dim` features (the encoder's hidden size, or
    the feature map's), and δ has the encoder's `svf_num_params` scales when `coordinator.svf_layer` is set."""
    n_svf = int(getattr(states.encoder, "svf_num_params", 0)) if settings.coordinator.svf_layer is not None else 0
    return ParamLayout(HeadShape(n_models=n_models, dim=states.dim), n_svf)


def param_split(settings: Settings, params: np.ndarray, n_models: int, states) -> tuple[np.ndarray | None,
                                                                                        np.ndarray]:
    """(SVF scales or None, head W) of a trained parameter vector (`checkpoint_layout`). ValueError when the
    vector has another length."""
    return checkpoint_layout(settings, n_models, states).split(params)


def checkpoint_stem(path: str | Path) -> Path:
    """The stem of a checkpoint named by `data/checkpoints` (a directory holding one <name>.npy + <name>.json
    pair), the stem itself, or either file. CheckpointError when there is no such pair."""
    p = Path(path)
    if p.is_dir():
        stems = sorted({f.with_suffix("") for f in p.glob("*.npy") if f.with_suffix(".json").exists()})
        if len(stems) != 1:
            raise CheckpointError(f"checkpoint directory {p}: expected one <name>.npy + <name>.json pair, found "
                                  f"{[s.name for s in stems] or 'none'}")
        return stems[0]
    stem = p.with_suffix("") if p.suffix in (".npy", ".json") else p
    if not (stem.with_suffix(".npy").exists() and stem.with_suffix(".json").exists()):
        raise CheckpointError(f"checkpoint {p}: expected {stem.name}.npy and {stem.name}.json beside each other "
                              "(train one with `dvc repro` or `trinity stage evolve`)")
    return stem


def save_checkpoint(path: Path, params: np.ndarray, metadata: CheckpointMeta) -> None:
    """Checkpoint = params .npy (float64) + JSON metadata beside it (same stem), each written atomically. The
    metadata is serialised before anything is written: metadata JSON cannot hold leaves the old checkpoint whole."""
    path = Path(path)
    meta_text = json.dumps(metadata.to_json(), indent=2, sort_keys=True) + "\n"
    with atomic_open(path.with_suffix(".npy"), "wb") as f:
        np.save(f, params.astype(np.float64))
    write_text(path.with_suffix(".json"), meta_text)


@dataclass(frozen=True, eq=False)
class Policy:
    """A checkpoint as loaded: its parameter vector, its metadata and the feature map its head reads. What the
    vector splits into (δ, W) depends on the encoder it is played with: `split`, after `check`."""

    path: Path
    """The checkpoint's stem (<stem>.npy + <stem>.json)."""
    params: np.ndarray
    """The flat vector as saved: [δ…, W…] (float64)."""
    meta: CheckpointMeta
    features: FeatureMap | None
    """The feature map the head was trained on (None: raw hidden states)."""

    @classmethod
    def load(cls, path: str | Path) -> "Policy":
        """The checkpoint at `path` (a stem, either file, or a directory holding one pair: `checkpoint_stem`)."""
        stem = checkpoint_stem(path)
        params = np.load(stem.with_suffix(".npy"))
        meta_file = stem.with_suffix(".json")
        try:
            meta = CheckpointMeta.from_json(json.loads(meta_file.read_text()), str(meta_file))
            features = FeatureMap.from_json(meta.features)
        except json.JSONDecodeError as e:
            raise CheckpointError(f"checkpoint {meta_file}: not JSON ({e})") from None
        except ValueError as e:
            raise CheckpointError(f"checkpoint {stem}: {e}") from None
        return cls(stem, params, meta, features)

    @property
    def pool_names(self) -> list[str]:
        """The pool members the head was trained on, in order (its first L logits)."""
        return self.meta.pool_names

    def check(self, settings: Settings, encoder=None) -> None:
        """CheckpointError unless this checkpoint can be played with `settings`: the same pool members in the same
        order, coordinator.svf_layer and coordinator.feature_norm; with `encoder`, also the encoder id it was
        trained with (when the checkpoint records one) and a vector of the layout this pool and encoder give.
        A stage checks the settings first (a wrong checkpoint fails before anything slow is loaded), then again
        with the encoder once it is loaded."""
        params_file = settings.source_path or "the params"
        hint = "use the params it was trained with, or rerun evolve"
        members = [m.name for m in settings.pool.members]
        if self.pool_names != members:
            raise CheckpointError(f"checkpoint {self.path} was trained on pool {self.pool_names}, but {params_file} "
                                  f"configures pool.members {members}: {hint}")
        c = settings.coordinator
        if self.meta.svf_layer != c.svf_layer:
            raise CheckpointError(f"checkpoint {self.path} was trained with coordinator.svf_layer "
                                  f"{self.meta.svf_layer!r}, {params_file} says {c.svf_layer!r}: {hint}")
        if (self.features is None) != (c.feature_norm == "none"):
            raise CheckpointError(f"checkpoint {self.path} was trained with coordinator.feature_norm "
                                  f"{(self.meta.features or {}).get('norm', 'none')!r}, {params_file} says "
                                  f"{c.feature_norm!r}: {hint}")
        if encoder is None:
            return
        trained = self.meta.encoder
        if trained is not None and trained != encoder.encoder_id:
            raise CheckpointError(f"checkpoint encoder {trained!r} differs from configured {encoder.encoder_id!r} "
                                  f"(checkpoint {self.path}): {hint}")
        self.split(settings, encoder)

    def split(self, settings: Settings, encoder) -> tuple[np.ndarray | None, np.ndarray]:
        """(SVF scales or None, head W) for `encoder` and the pool of `settings` (`checkpoint_layout`);
        CheckpointError when the vector does not have that layout's length."""
        members = [m.name for m in settings.pool.members]
        try:
            return param_split(settings, self.params, len(members), self.states(encoder, None))
        except ValueError as e:
            raise CheckpointError(f"checkpoint {self.path} does not fit encoder {encoder.encoder_id} and pool "
                                  f"{members}: {e}") from None

    def states(self, encoder, store):
        """The StateCache the head reads: `encoder`'s hidden states (kept in `store`) through this feature map."""
        from trinity.coordinator.episode import StateCache

        return StateCache(encoder, store, features=self.features)
