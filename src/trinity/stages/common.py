"""What more than one stage needs: the encoder and role caps the settings name, and the prepared splits (re-checked
by the contamination guard)."""
from __future__ import annotations

from trinity.config import Settings
from trinity.stages.paths import SPLIT_FILES, Paths


def make_encoder(settings: Settings):
    from trinity.coordinator.encoder import TranscriptEncoder

    c = settings.coordinator
    return TranscriptEncoder(c.encoder, max_tokens=c.max_encode_tokens, svf_layer=c.svf_layer, dtype=c.encoder_dtype,
                             chunk_tokens=c.encode_chunk_tokens)


def role_caps(settings: Settings) -> dict[str, int]:
    c = settings.coordinator
    return {"thinker": c.thinker_max_tokens, "verifier": c.verifier_max_tokens}


def load_tasks(paths: Paths):
    """The prepared splits (train, in_distribution, heldout), re-checked by the contamination guard: an edited
    file that puts an evaluation item in training fails here, loudly, before any model is called."""
    from trinity.data.splits import Splits, assert_no_contamination, load_tasks as load

    for name in SPLIT_FILES.values():
        if not (paths.prepared / name).exists():
            raise FileNotFoundError(f"{paths.prepared / name} is missing: run the prepare stage first")
    splits = Splits(**{split: load(paths.prepared / name) for split, name in SPLIT_FILES.items()})
    assert_no_contamination(splits.train, [*splits.in_distribution, *splits.heldout])
    return splits
