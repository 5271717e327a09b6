"""A planted API key never leaves the environment: not in a log line, the W&B run (config, summary, files),
the params file DVC tracks, a store row, an export or the report — even when the endpoint echoes it back
in an error."""
import logging
import secrets
from pathlib import Path

import pytest
import yaml

from fixtures.fake_openai_server import FakeOpenAIServer
from trinity.stages import paths as stage_paths, run_stage
from trinity.config import PROJECT_ROOT, load_settings
from trinity.coordinator.episode import OutageError
from trinity.ops.tracking import StageRun

KEY_ENV = "TRINITY_TEST_PROVIDER_KEY"


def test_planted_key_appears_nowhere(tmp_path, monkeypatch, caplog):
    key = "sk-trinity-" + secrets.token_hex(16)
    monkeypatch.setenv(KEY_ENV, key)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    caplog.set_level(logging.DEBUG)
    log_file = tmp_path / "debug.log"
    handler = logging.FileHandler(log_file)
    handler.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    # every third API request is answered by a proxy that echoes the bearer token in its error message
    with FakeOpenAIServer(script=["ok", "ok", "401echo"] * 200) as srv:
        params = {
            "data": {"root": str((PROJECT_ROOT / "../shared/benchmarks").resolve()), "train": {"math500": 2},
                     "heldout": {"gsm8k": 2}, "math500_max_level": 1},
            "pool": {"members": [
                {"name": "smol", "backend": "local", "model": "smollm2-135m-instruct", "max_tokens": 16},
                {"name": "api", "backend": "openai", "model": "gpt-test", "base_url": srv.base_url,
                 "api_key_env": KEY_ENV, "max_retries": 0, "timeout_s": 10.0, "price_input_per_mtok": 1.0,
                 "price_output_per_mtok": 2.0},
            ]},
            "coordinator": {"max_turns": 2, "thinker_max_tokens": 12, "verifier_max_tokens": 4, "max_encode_tokens": 256},
            "evolve": {"generations": 1, "popsize": 4, "episodes_per_candidate": 2},
        }
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
        settings = load_settings(tmp_path / "params.yaml")
        paths = stage_paths.Paths(tmp_path)
        for name in ("prepare", "encode", "evolve", "evaluate", "report"):
            with StageRun(settings, name, root=tmp_path) as run:
                fn = lambda settings, paths, tracker=None, name=name: run_stage(name, settings, paths, tracker=tracker)
                try:
                    out = fn(settings, paths, tracker=run) if name in ("evolve", "evaluate") else fn(settings, paths)
                except OutageError as e:  # the echoing proxy's 401s are outages: evaluate writes, then says so
                    assert name == "evaluate" and (paths.eval_dir / "results.json").exists(), e
                    assert key not in str(e)
                    out = {"outage": str(e)}
                run.summary(out if isinstance(out, dict) else {"out": str(out)})
                logging.getLogger("trinity.test").debug("stage %s done: %s", name, out)
        from trinity.cli import main as trinity_cli
        assert trinity_cli(["export", "--root", str(tmp_path)]) == 0  # the store's Parquet export, searched too
        assert any(r.authorization for r in srv.records)  # the key really was sent to the endpoint
        assert any(r.mode == "401echo" for r in srv.records)
    logging.getLogger().removeHandler(handler)
    handler.close()

    needle = key.encode()
    leaks = []
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any("wandb" in str(p) for p in files) and (tmp_path / "reports/summary.md").exists()
    assert any(p.suffix == ".parquet" for p in files) and any(p.suffix == ".duckdb" for p in files)
    for p in files:
        data = p.read_bytes()
        if needle in data or key[-16:].encode() in data:
            leaks.append(str(p.relative_to(tmp_path)))
    assert not leaks, f"API key found in {leaks}"
    # the database file may compress strings: ask it too
    from trinity.store import Store
    with Store(tmp_path / "data/store/trinity.duckdb") as store:
        hits = store.con.execute(
            "SELECT count(*) FROM responses WHERE contains(text, ?) OR contains(coalesce(error, ''), ?) "
            "OR contains(messages, ?)", [key[-16:]] * 3).fetchone()[0]
        hits += store.con.execute("SELECT count(*) FROM failures WHERE contains(coalesce(error, ''), ?)",
                                  [key[-16:]]).fetchone()[0]
        failures = store.con.execute("SELECT count(*) FROM failures").fetchone()[0]
    assert hits == 0 and failures > 0  # the echoing proxy's failures are recorded, redacted
    assert key not in caplog.text and key[-16:] not in caplog.text
