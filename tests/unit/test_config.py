import textwrap

import pytest

from trinity.config import ConfigError, EvolveSettings, load_settings, PROJECT_ROOT


def write(tmp_path, text):
    p = tmp_path / "params.yaml"
    p.write_text(textwrap.dedent(text))
    return p


MINIMAL_POOL = """
pool:
  members:
    - {name: a, backend: local, model: smollm2-135m-instruct}
"""


def test_project_params_load():
    from trinity.pool.bundled import BUNDLED

    s = load_settings(PROJECT_ROOT / "params.yaml")
    # The default pool is the whole embedded pool: every bundled model, each run locally.
    assert sorted(m.model for m in s.pool.members) == sorted(BUNDLED)
    assert {m.backend for m in s.pool.members} == {"local"}
    # the paper's σ0 is the schema's default; params.yaml sets its own for make run's small population (README)
    assert EvolveSettings().sigma0 == pytest.approx(0.03) and s.evolve.sigma0 > 0


def test_unknown_key_names_key_and_file(tmp_path):
    p = write(tmp_path, MINIMAL_POOL + "evolve:\n  generatoins: 3\n")
    with pytest.raises(ConfigError) as e:
        load_settings(p)
    assert str(p) in str(e.value) and "evolve.generatoins" in str(e.value) and "unknown key" in str(e.value)


def test_wrong_type_names_key(tmp_path):
    p = write(tmp_path, MINIMAL_POOL + "evolve:\n  sigma0: lots\n")
    with pytest.raises(ConfigError) as e:
        load_settings(p)
    assert "evolve.sigma0" in str(e.value) and "'lots'" in str(e.value)


def test_string_for_int_rejected(tmp_path):
    p = write(tmp_path, MINIMAL_POOL + "evolve:\n  generations: '3'\n")
    with pytest.raises(ConfigError, match="evolve.generations"):
        load_settings(p)


def test_unknown_backend_and_member_key(tmp_path):
    p = write(tmp_path, """
    pool:
      members:
        - {name: a, backend: grpc, model: x}
        - {name: b, backend: local, model: x, colour: red}
    """)
    with pytest.raises(ConfigError) as e:
        load_settings(p)
    msg = str(e.value)
    assert "pool.members.0.backend" in msg and "pool.members.1.colour" in msg


def test_duplicate_member_names(tmp_path):
    p = write(tmp_path, """
    pool:
      members:
        - {name: a, backend: local, model: x}
        - {name: a, backend: local, model: y}
    """)
    with pytest.raises(ConfigError, match="unique"):
        load_settings(p)


def test_encode_chunk_tokens_read_and_zero_rejected(tmp_path):
    s = load_settings(write(tmp_path, MINIMAL_POOL + "coordinator:\n  encode_chunk_tokens: 96\n"))
    assert s.coordinator.encode_chunk_tokens == 96
    with pytest.raises(ConfigError) as e:
        load_settings(write(tmp_path, MINIMAL_POOL + "coordinator:\n  encode_chunk_tokens: 0\n"))
    assert "coordinator.encode_chunk_tokens" in str(e.value)


def test_int_accepted_for_float(tmp_path):
    p = write(tmp_path, MINIMAL_POOL + "evolve:\n  sigma0: 1\nreward:\n  cost_weight: 0\n")
    s = load_settings(p)
    assert s.evolve.sigma0 == 1.0 and isinstance(s.reward.cost_weight, float)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.yaml")
    p = write(tmp_path, "pool: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(p)


def test_data_root_env_override(tmp_path, monkeypatch):
    s = load_settings(write(tmp_path, MINIMAL_POOL))
    monkeypatch.setenv("TRINITY_DATA_DIR", str(tmp_path))
    assert s.data.resolved_root() == tmp_path


def test_where_calls_run_is_a_pool_setting_and_the_old_evolve_keys_say_where_they_went(tmp_path):
    p = write(tmp_path, MINIMAL_POOL + "evolve:\n  task_runner: dask\n  dask_workers: 3\n")
    with pytest.raises(ConfigError) as e:
        load_settings(p)
    msg = str(e.value)
    assert str(p) in msg and "evolve.dask_workers, evolve.task_runner moved to the pool section" in msg
    assert "pool.dask_workers, pool.task_runner" in msg
    s = load_settings(write(tmp_path, MINIMAL_POOL + "  task_runner: dask\n  dask_workers: 3\n"))
    assert (s.pool.task_runner, s.pool.dask_workers) == ("dask", 3)
    with pytest.raises(ConfigError, match="pool.dask_threads_per_worker must be >= 1"):
        load_settings(write(tmp_path, MINIMAL_POOL + "  dask_threads_per_worker: 0\n"))


def test_where_calls_run_is_no_part_of_a_run_identity(tmp_path):
    """The params hash (so the run id) ignores the pool's execution settings; every other pool key counts."""
    base = load_settings(write(tmp_path, MINIMAL_POOL))
    elsewhere = load_settings(write(tmp_path, MINIMAL_POOL + "  task_runner: dask\n  dask_workers: 5\n"
                                    "  dask_address: tcp://127.0.0.1:8786\n"))
    assert elsewhere.params_hash() == base.params_hash()
    assert load_settings(write(tmp_path, MINIMAL_POOL + "  local_engine: in-process\n")).params_hash() \
        != base.params_hash()
