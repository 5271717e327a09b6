"""The evaluate stage's W&B run sees what DVC sees: results.json as tables and summary values, the plots, the
artifacts (staged inside WANDB_DIR for a later `wandb sync`), the input lineage — and never a secret.

Real wandb in offline mode. wandb 0.31 writes no `files/wandb-summary.json` for an offline run: the summary,
config and artifact records live only in the run's transaction log `run-<id>.wandb`, which `_records` reads
(a LevelDB-style log of `wandb_internal_pb2.Record` protobufs)."""
import gzip
import json
import secrets
import time
import warnings
from pathlib import Path

import pytest
import yaml

from trinity.config import load_settings
from trinity.evaluation.results import EvalResults
from trinity.ops.tracking import StageRun, log_eval_results, wandb_group
from trinity.ops.wandb_artifacts import artifact_name, content_alias, recorded_inputs, restore_lineage

KEY_ENV = "TRINITY_TRACKING_TEST_CRED"  # a name redact would not guess: only the pool registration catches it
BENCHMARKS = ("math500", "mt_bench")
METHODS = ("trinity", "alone:smol", "oracle:best-single")


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Offline W&B under tmp_path; HOME and XDG dirs in tmp_path too, so a file W&B puts in its default
    (user-wide) data or cache dir is seen."""
    home = tmp_path / "home"
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DATA_HOME", str(home / ".local" / "share"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    for name in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR", "TRINITY_WANDB_GROUP"):
        monkeypatch.delenv(name, raising=False)  # restored (unset) after the test, whatever StageRun set
    params = {"pool": {"members": [
        {"name": "smol", "backend": "local", "model": "smollm2-135m-instruct"},
        {"name": "api", "backend": "openai", "model": "gpt-test", "base_url": "http://127.0.0.1:9",
         "api_key_env": KEY_ENV}]}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return load_settings(tmp_path / "params.yaml")


def _score(score, n=3, **kw):
    return {"score": score, "ci95": None if score is None else [max(0.0, score - 0.2), score + 0.2], "n": n,
            "unscored": 0, "small_sample": True, "tokens_per_task": 400.0, "wall_s_per_task": 2.5,
            "cost_usd_per_task": 0.0, "mean_turns": 2.0, "calls_new": 0, "failed_calls": 0, **kw}


def make_results(label: str = "best single member") -> dict:
    """A schema-complete results.json (docs/eval_results_schema.md) with 2 benchmarks and 3 methods."""
    return {
        "n_items": 5,
        "benchmarks": [{"name": "math500", "split": "in_distribution", "metric": "accuracy", "scale": 1.0, "n": 3},
                       {"name": "mt_bench", "split": "heldout", "metric": "judge score (1-10)", "scale": 10.0,
                        "n": 2}],
        "methods": [{"method": "trinity", "kind": "coordinator"},
                    {"method": "alone:smol", "kind": "single", "model": "smol"},
                    {"method": "oracle:best-single", "kind": "oracle",
                     "picks": {"math500": "alone:smol", "mt_bench": "alone:smol"}}],
        "scores": {
            "trinity": {"math500": _score(0.667), "mt_bench": _score(6.5, n=2, unscored=1, mean_turns=3.0)},
            "alone:smol": {"math500": _score(0.333), "mt_bench": _score(4.0, n=2)},
            "oracle:best-single": {"math500": _score(0.333), "mt_bench": _score(4.0, n=2)},
        },
        "averages": {"trinity": {"in_distribution": 0.667, "heldout": 0.65},
                     "alone:smol": {"in_distribution": 0.333, "heldout": 0.4},
                     "oracle:best-single": {"in_distribution": 0.333, "heldout": 0.4}},
        "paired": {
            "math500": [{"a": "trinity", "b": "alone:smol", "label": label, "diff": 0.333,
                         "ci95": [0.0, 0.667], "n": 3, "small_sample": True, "outcome": "wins"}],
            "mt_bench": [{"a": "trinity", "b": "alone:smol", "label": label, "diff": 2.5, "ci95": [-1.0, 5.0],
                          "n": 2, "small_sample": True, "outcome": "ties"}],
        },
        "judge": {"name": "smol", "model_id": "gguf:smol", "in_pool": True, "verdicts": 4, "unparseable": 1,
                  "failed": 0, "note": "a weak judge"},
        "bootstrap": {"resamples": 200, "seed": 0, "level": 0.95, "small_sample_below": 30},
        "seeds": {"data": 0, "evolve": 0, "evaluate": 0, "random_routing": 0},
        "checkpoint": {"run_fingerprint": "f", "code_version": "c", "method": "sep_cma", "generations": 1,
                       "params_hash": "p"},
        "pool": [{"name": "smol", "model_id": "gguf:smol"}],
        "never_trained_on": {"benchmarks": ["mt_bench"], "items": 2, "training_sources": ["math500"],
                             "training_items": 3, "check": "..."},
        "pool_calls": 10, "store_hits": 2, "wall_s": 12.0,
    }


def write_plot(plots_dir: Path, stem: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(1, 1), dpi=20)
    ax.plot([0, 1], [0, 1])
    path = plots_dir / f"{stem}.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def _records(run_dir: Path) -> list:
    """The protobuf records of an offline run's transaction log (the tests' own reader: tests/fixtures/wandb_log.py)."""
    from fixtures.wandb_log import read_records

    return read_records(next(run_dir.glob("run-*.wandb")))


def _finished_records(run_dir: Path, timeout_s: float = 30.0) -> list:
    """`_records` once the log holds the exit record: `run.finish()` can return before W&B's core process
    has flushed the offline transaction log."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _records(run_dir)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def _run_info(run_dir: Path) -> dict:
    summary, config, artifacts, run = {}, {}, [], None
    for r in _finished_records(run_dir):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run = r.run
            for item in r.run.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in r.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "summary":
            for item in r.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "artifact":
            artifacts.append(r.artifact)
    return {"run": run, "summary": summary, "config": config, "artifacts": artifacts}


def _run_dir(wandb_dir: Path) -> Path:
    (run_dir,) = (wandb_dir / "wandb").glob("offline-run-*")
    return run_dir


def _table(run_dir: Path, key: str) -> dict:
    folder, _, stem = key.rpartition("/")
    (path,) = (run_dir / "files" / "media" / "table" / folder).glob(f"{stem}_*.table.json")
    return json.loads(path.read_text())


def test_eval_results_tables_summary_plots_artifacts_and_lineage(env, tmp_path, monkeypatch):
    monkeypatch.setenv("TRINITY_WANDB_GROUP", "repro-20260101-abc")
    wandb_dir = tmp_path / "wandb"
    results = make_results()
    eval_dir = tmp_path / "data" / "eval"
    eval_dir.mkdir(parents=True)
    (eval_dir / "results.json").write_text(json.dumps(results))
    (eval_dir / "episodes.jsonl").write_text('{"method": "trinity", "score": 1.0}\n')
    ckpt = tmp_path / "data" / "checkpoints"
    ckpt.mkdir(parents=True)
    (ckpt / "coordinator.json").write_text('{"theta": [0.5]}')
    plots = tmp_path / "reports" / "plots"
    write_plot(plots, "scores_by_benchmark")
    write_plot(plots, "fitness")
    (plots / "notes.txt").write_text("not a plot")

    run = StageRun(env, "evaluate", root=tmp_path)
    try:
        assert run.offline
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # offline: recorded, no raise, no warning
            assert run.use_artifact("prepared data", "dataset") is None
            assert run.use_artifact("checkpoint", "model", [ckpt / "coordinator.json"]) is None
            assert run.use_artifact("checkpoint", "model", [ckpt / "coordinator.json"]) is None  # declared once
        log_eval_results(run, EvalResults.from_dict(results), plots)
        art = run.log_artifact("eval results/v1:x", "eval", [eval_dir / "results.json", eval_dir / "episodes.jsonl",
                                                            ckpt], metadata={"n_items": 5, "wall_s": float("nan")})
    finally:
        run.finish()
    assert art.name.startswith("eval-results-v1-x")

    run_dir = _run_dir(wandb_dir)
    info = _run_info(run_dir)
    assert info["run"].run_group == "repro-20260101-abc" and info["run"].job_type == "evaluate"

    # summary values, one per scored method x benchmark, and the split averages
    summary = info["summary"]
    for m in METHODS:
        for b in BENCHMARKS:
            assert summary[f"score/{m}/{b}"] == results["scores"][m][b]["score"]
        assert summary[f"avg_in_distribution/{m}"] == results["averages"][m]["in_distribution"]
        assert summary[f"avg_heldout/{m}"] == results["averages"][m]["heldout"]

    # offline lineage: the exact inputs (the version their files are) are in the config and the summary, where
    # restore_lineage finds them after `wandb sync`
    inputs = [{"name": "prepared-data", "type": "dataset", "alias": "latest"},
              {"name": "checkpoint", "type": "model", "alias": content_alias([ckpt / "coordinator.json"])}]
    assert inputs[1]["alias"].startswith("c-") and len(inputs[1]["alias"]) == 22
    assert summary["inputs"] == inputs and info["config"]["inputs"] == inputs
    assert recorded_inputs(run_dir) == inputs

    class PublicApi:  # W&B's public API (wandb.Api) is out of reach here: what restore_lineage asks of it
        def __init__(self):
            self.used = []

        def run(self, path):
            api = self

            class Run:
                def use_artifact(self, artifact):
                    api.used.append((path, artifact))
            return Run()

        def artifact(self, ref, type):
            return (ref, type)

    api = PublicApi()
    declared = restore_lineage(api, "me/trinity/abc123", recorded_inputs(run_dir))
    assert declared == ["me/trinity/prepared-data:latest", f"me/trinity/checkpoint:{inputs[1]['alias']}"]
    assert api.used[1] == ("me/trinity/abc123", (declared[1], "model"))

    # a table per benchmark, the summary table, the paired table
    for b in BENCHMARKS:
        t = _table(run_dir, f"eval/{b}")
        assert t["columns"] == ["method", "kind", "score", "ci_low", "ci_high", "n", "unscored", "tokens_per_task",
                                "wall_s_per_task", "cost_usd_per_task", "mean_turns"]
        rows = {r[0]: r for r in t["data"]}
        assert set(rows) == set(METHODS)
        s = results["scores"]["trinity"][b]
        assert rows["trinity"] == ["trinity", "coordinator", s["score"], *s["ci95"], s["n"], s["unscored"],
                                   s["tokens_per_task"], s["wall_s_per_task"], s["cost_usd_per_task"],
                                   s["mean_turns"]]
        assert rows["oracle:best-single"][1] == "oracle"
    t = _table(run_dir, "eval/summary")
    assert t["columns"] == ["method", "math500", "mt_bench", "avg_in_distribution", "avg_heldout"]
    assert ["trinity", 0.667, 6.5, 0.667, 0.65] in t["data"] and len(t["data"]) == 3
    t = _table(run_dir, "eval/paired")
    assert t["columns"] == ["benchmark", "a", "b", "label", "diff", "ci_low", "ci_high", "n", "outcome"]
    assert ["mt_bench", "trinity", "alone:smol", "best single member", 2.5, -1.0, 5.0, 2, "ties"] in t["data"]

    # every PNG of the plots dir, nothing else
    images = run_dir / "files" / "media" / "images" / "plots"
    assert len(list(images.glob("scores_by_benchmark_*.png"))) == 1 and len(list(images.glob("fitness_*.png"))) == 1
    assert not list(images.glob("notes*"))

    # the artifact: files by name, the directory as a tree, metadata JSON-safe; staged inside WANDB_DIR
    (record,) = [a for a in info["artifacts"] if a.type == "eval"]
    assert record.name == "eval-results-v1-x"
    # the version's content alias: what a consumer of these very files names
    assert set(record.aliases) == {"latest", content_alias([eval_dir / "results.json", eval_dir / "episodes.jsonl",
                                                              ckpt])}
    assert json.loads(record.metadata) == {"n_items": 5, "wall_s": None}
    entries = {e.path: e for e in record.manifest.contents}
    if not entries and record.manifest.manifest_file_path:  # large manifests go to a gzipped file
        with gzip.open(record.manifest.manifest_file_path, "rt") as f:
            entries = {json.loads(line)["path"]: json.loads(line) for line in f}
    assert set(entries) == {"results.json", "episodes.jsonl", "checkpoints/coordinator.json"}
    staging = wandb_dir.resolve() / "wandb-data" / "artifacts" / "staging"
    for entry, source in (("results.json", eval_dir / "results.json"),
                          ("checkpoints/coordinator.json", ckpt / "coordinator.json")):
        staged = Path(entries[entry].local_path)
        assert staged.is_relative_to(staging), staged
        assert staged.read_bytes() == source.read_bytes()
    # nothing of W&B's in the user-wide default data / cache dirs (only, at most, wandb's own debug logs)
    home = tmp_path / "home"
    assert not (home / ".local" / "share" / "wandb").exists()
    assert not (home / ".cache" / "wandb" / "artifacts").exists()


def test_a_secret_reaches_no_file_of_the_run(env, tmp_path, monkeypatch):
    key = "trinity-cred-" + secrets.token_hex(16)  # no known key shape: caught only as a registered env value
    monkeypatch.setenv(KEY_ENV, key)
    wandb_dir = tmp_path / "wandb"
    results = make_results(label=f"vs endpoint with key {key}")
    results["scores"]["trinity"]["math500"]["note"] = key
    leaky = tmp_path / "leaky.json"
    leaky.write_text(json.dumps({"request": {"headers": f"key={key}"}}))
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01binary")

    with StageRun(env, "evaluate", root=tmp_path) as run:
        log_eval_results(run, EvalResults.from_dict(results), None)
        run.table("eval/extra", ["method", "detail"], [["trinity", f"error: {key}"]])
        with pytest.warns(UserWarning, match="secrets redacted"):
            run.log_artifact("eval", "eval", [leaky, tmp_path / "blob.bin"],
                             metadata={"endpoint": {"note": f"called with {key}"}, "api_key": key})
        with pytest.raises(FileNotFoundError):
            run.log_artifact("missing", "eval", [tmp_path / "nope.json"])

    run_dir = _run_dir(wandb_dir)
    info = _run_info(run_dir)  # waits for the transaction log to be complete
    files = [p for p in wandb_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in files) and any("staging" in p.parts for p in files)
    leaks = [str(p.relative_to(wandb_dir)) for p in files if key[-16:].encode() in p.read_bytes()]
    assert not leaks, f"secret found in {leaks}"

    # ... and it was logged, redacted, not dropped
    assert info["run"].run_group == wandb_group() and info["run"].job_type == "evaluate"  # this process: its own run
    marker = f"[REDACTED:{KEY_ENV}]"
    assert marker in json.dumps(_table(run_dir, "eval/paired")["data"])
    assert marker in json.dumps(_table(run_dir, "eval/extra")["data"])
    (record,) = [a for a in info["artifacts"] if a.type == "eval"]
    meta = json.loads(record.metadata)
    assert meta["endpoint"]["note"] == f"called with {marker}" and meta["api_key"] == "[REDACTED]"
    assert meta["redacted_files"] == ["leaky.json"]
    entries = {e.path: e for e in record.manifest.contents}
    assert set(entries) == {"leaky.json", "blob.bin"}
    assert marker in Path(entries["leaky.json"].local_path).read_text()


def test_artifact_names_are_valid_wandb_names():
    assert artifact_name("eval results/v1:x") == "eval-results-v1-x"
    assert artifact_name("prepared_data.v2") == "prepared_data.v2"
    assert artifact_name("///") == "artifact"
    assert len(artifact_name("a" * 300)) == 128
