"""The trained policy's one home (`trinity.coordinator.policy`): a checkpoint saved whole (the .npy bytes those of
`np.save`), loaded from its stem, either file or its directory, and checked against the settings and the encoder it
is played with, every mismatch one `CheckpointError`; serving imports nothing from the pipeline's stages."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from fixtures.scripted_pool import HashEncoder
from trinity import code_version as cv
from trinity.config import CoordinatorSettings, PoolMember, PoolSettings, Settings
from trinity.coordinator.features import FeatureMap, features_json
from pydantic_core import PydanticSerializationError

from trinity.coordinator.checkpoint_meta import CheckpointMeta
from trinity.coordinator.policy import CheckpointError, Policy, checkpoint_stem, save_checkpoint

MEMBERS = ("a", "b")


def _settings(**coordinator) -> Settings:
    return Settings(pool=PoolSettings(members=[PoolMember(name=n, backend="local", model="x") for n in MEMBERS]),
                    coordinator=CoordinatorSettings(**coordinator))


def _meta_json(**extra) -> dict:
    return {"pool": [{"name": n, "model_id": f"m-{n}"} for n in MEMBERS], "svf_layer": None,
            "encoder": HashEncoder.encoder_id, "dim": HashEncoder.dim, **extra}


def _meta(**extra) -> CheckpointMeta:
    return CheckpointMeta.model_validate(_meta_json(**extra))


def test_save_writes_the_bytes_np_save_writes_and_load_reads_them_back(tmp_path):
    params = np.random.default_rng(0).normal(size=(len(MEMBERS) + 3) * HashEncoder.dim).astype(np.float32)
    stem = tmp_path / "checkpoints" / "coordinator"
    save_checkpoint(stem, params, _meta())
    expected = io.BytesIO()
    np.save(expected, params.astype(np.float64))
    assert stem.with_suffix(".npy").read_bytes() == expected.getvalue()
    assert stem.with_suffix(".json").read_text() == json.dumps(_meta_json(), indent=2, sort_keys=True) + "\n"
    assert sorted(p.name for p in stem.parent.iterdir()) == ["coordinator.json", "coordinator.npy"]  # no temp files

    for name in (stem, stem.with_suffix(".npy"), stem.with_suffix(".json"), stem.parent):
        loaded = Policy.load(name)
        assert loaded.path == stem and loaded.meta == _meta() and loaded.features is None
        np.testing.assert_array_equal(loaded.params, params.astype(np.float64))
    assert loaded.pool_names == list(MEMBERS)


def test_a_failed_save_leaves_the_old_checkpoint(tmp_path):
    stem = tmp_path / "coordinator"
    save_checkpoint(stem, np.zeros(3), _meta())
    with pytest.raises(PydanticSerializationError):  # the JSON cannot be written
        save_checkpoint(stem, np.ones(3), _meta(features={"norm": "none", "bad": object()}))
    assert json.loads(stem.with_suffix(".json").read_text()) == _meta_json()
    np.testing.assert_array_equal(np.load(stem.with_suffix(".npy")), np.zeros(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coordinator.json", "coordinator.npy"]


def test_a_missing_checkpoint_is_a_checkpoint_error(tmp_path):
    with pytest.raises(CheckpointError, match="expected coordinator.npy and coordinator.json beside each other"):
        Policy.load(tmp_path / "coordinator")
    (tmp_path / "a.npy").write_bytes(b"")
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "b.npy").write_bytes(b"")
    (tmp_path / "b.json").write_text("{}")
    with pytest.raises(CheckpointError, match=r"expected one <name>.npy \+ <name>.json pair, found \['a', 'b'\]"):
        checkpoint_stem(tmp_path)


def test_the_one_check_names_what_does_not_fit(tmp_path):
    n = (len(MEMBERS) + 3) * HashEncoder.dim
    stem = tmp_path / "coordinator"

    def loaded(params=None, **meta) -> Policy:
        save_checkpoint(stem, np.zeros(n) if params is None else params, _meta(**meta))
        return Policy.load(stem)

    settings, encoder = _settings(), HashEncoder()
    ok = loaded()
    ok.check(settings)
    ok.check(settings, encoder)
    delta, W = ok.split(settings, encoder)
    assert delta is None and W.shape == (len(MEMBERS) + 3, HashEncoder.dim)

    with pytest.raises(CheckpointError, match=r"trained on pool \['b', 'a'\], but the params configures "
                                              r"pool.members \['a', 'b'\]"):
        loaded(pool=[{"name": "b"}, {"name": "a"}]).check(settings)
    with pytest.raises(CheckpointError, match="coordinator.svf_layer -2, the params says None"):
        loaded(svf_layer=-2).check(settings)
    with pytest.raises(CheckpointError, match="coordinator.feature_norm 'none', the params says 'standardize'"):
        ok.check(_settings(feature_norm="standardize"))
    with pytest.raises(CheckpointError, match="checkpoint encoder 'other' differs from configured 'hash-encoder'"):
        loaded(encoder="other").check(settings, encoder)
    with pytest.raises(CheckpointError, match=f"does not fit encoder hash-encoder and pool .*expected {n} parameters"):
        loaded(np.zeros(n + 1)).check(settings, encoder)
    with pytest.raises(CheckpointError, match="features.norm 'whiten'"):
        loaded(features={"norm": "whiten"})

    # a standardising feature map: the head reads its d + 1 features
    fmap = FeatureMap(np.zeros(HashEncoder.dim, np.float32), np.ones(HashEncoder.dim, np.float32), 1.0)
    mapped = loaded(np.zeros((len(MEMBERS) + 3) * (HashEncoder.dim + 1)), features=features_json(fmap))
    mapped.check(_settings(feature_norm="standardize"), encoder)
    assert mapped.features.dim == HashEncoder.dim + 1
    assert mapped.states(encoder, None).dim == HashEncoder.dim + 1


def test_serving_imports_nothing_from_the_pipeline_stages():
    reached = {f.relative_to(cv.PACKAGE).as_posix() for f in cv.imported_files(entries=["serving.server"])}
    assert "coordinator/policy.py" in reached
    assert not {f for f in reached if f.startswith("stages/")}, sorted(reached)


def test_checkpoint_metadata_is_a_typed_record_that_names_what_is_wrong(tmp_path):
    """The metadata file is read into `CheckpointMeta`: a misspelt or mistyped field is a CheckpointError naming
    the file and the field, and what is read writes back the same bytes (unset fields stay out)."""
    stem = tmp_path / "coordinator"
    save_checkpoint(stem, np.zeros(3), _meta())
    text = stem.with_suffix(".json").read_text()
    assert Policy.load(stem).meta.to_json() == json.loads(text)
    stem.with_suffix(".json").write_text(json.dumps({**_meta_json(), "svf_layr": 3}))
    with pytest.raises(CheckpointError, match=r"coordinator.json: not a checkpoint's metadata \(svf_layr: unknown"):
        Policy.load(stem)
    stem.with_suffix(".json").write_text(json.dumps({**_meta_json(), "dim": "wide"}))
    with pytest.raises(CheckpointError, match=r"\(dim: Input should be a valid integer"):
        Policy.load(stem)
    stem.with_suffix(".json").write_text("{not json")
    with pytest.raises(CheckpointError, match="coordinator.json: not JSON"):
        Policy.load(stem)
