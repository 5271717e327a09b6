"""W&B tracking: one run per pipeline stage, offline by default (env WANDB_MODE overrides params).

Everything logged passes through `redact` first, so no API key reaches a W&B config, summary, table,
artifact metadata or artifact file.

Runs of one pipeline run share a W&B group, and the next pipeline run gets another (`wandb_group`): W&B's own
`WANDB_RUN_GROUP` when set (`make run` sets one per run), else `TRINITY_WANDB_GROUP`, else the DVC experiment's
name (`DVC_EXP_NAME`, which `dvc exp run` gives every stage: `exp-<name>`), else an id of the run that started the
stage process — the root Prefect flow run (flows/pipeline.py: `prefect-<root flow run id>`), the nearest `dvc`
ancestor process of a hand-typed `dvc repro` (`dvc-<its start time>-<its pid>`: DVC tells a plain repro's stages
nothing per-run) — else this process. The job type is the stage name.

Lineage is to exact versions. An artifact version is named by its content: the producer logs it with the alias
`c-<hash of its files>` (`content_alias`) besides `latest`, and a consumer declares `<name>:c-<hash>` of the very
files it read, so an evaluation points at the checkpoint it evaluated, even after an ablation logged others.
Online, `use_artifact` draws the edge; offline (W&B cannot declare inputs then), the exact inputs are recorded in
the run's config and summary (`inputs`), and `restore_lineage` declares them through the public API once
`wandb sync` has uploaded the runs (`python -m trinity.ops.tracking sync`). Artifact names, content aliases and
the offline sync are in trinity.ops.wandb_artifacts.

Where W&B keeps its files. Runs are written under WANDB_DIR (default `data/wandb`, inside the project). W&B
also copies every artifact file (and every logged table: tables are artifacts too) to a *staging* dir,
`$WANDB_DATA_DIR/artifacts/staging`, default `~/.local/share/wandb/...`, and moves uploaded files to a cache,
`$WANDB_CACHE_DIR/artifacts`, default `~/.cache/wandb`; `artifact.download()` writes to `$WANDB_ARTIFACT_DIR`
(default `./artifacts`). An offline run's transaction log (`run-<id>.wandb`) refers to the staged copies by
absolute path, so `wandb sync` needs them. `StageRun` therefore points all three under WANDB_DIR
(`wandb-data/`, `wandb-cache/`, `wandb-artifacts/`) unless the user set them: the whole of WANDB_DIR is then
what a later `wandb sync` needs (at the same absolute path, as W&B records absolute staging paths).
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trinity.code_version import code_version
from trinity.config import PROJECT_ROOT, Settings
from trinity.files import write_json
from trinity.evaluation.results import SPLIT_KEYS, Cell, EvalResults
from trinity.ops.wandb_artifacts import (INPUTS_FILE, _NAME_MAXLEN, _artifact_type, _json_safe, _redacted_text_of,
                                         artifact_name, content_alias, sync)
from trinity.redact import redact, redact_text, register_pool

GROUP_ENV = "TRINITY_WANDB_GROUP"
RUN_FILE = "trinity_run.json"
"""Who the run is and the keys it logged (history and summary), as a file of the run written when it ends: what
`trinity.ops.wandb_report` builds an offline report from (online it asks W&B's public API, `wandb.Api().runs`)."""
WANDB_GROUP_ENV = "WANDB_RUN_GROUP"
DVC_EXP_ENV = "DVC_EXP_NAME"

# Keys the runs log (log_eval_results; trinity.ops.wandb_report builds its panels from the keys the runs hold).
EVAL_TABLE_PREFIX = "eval/"
EVAL_SUMMARY_TABLE = "eval/summary"
EVAL_PAIRED_TABLE = "eval/paired"
PLOTS_PREFIX = "plots/"

# W&B env var -> subdirectory of WANDB_DIR it defaults to here (see the module docstring).
_WANDB_STORAGE_ENV = {"WANDB_DATA_DIR": "wandb-data", "WANDB_CACHE_DIR": "wandb-cache",
                      "WANDB_ARTIFACT_DIR": "wandb-artifacts"}
# Values this module set itself: a later StageRun with another WANDB_DIR (tests, several roots in one
# process) moves them along; a value the user set is never touched.
_own_env: dict[str, str] = {}


def wandb_group() -> str:
    """The W&B group of this process's stage runs: one per pipeline run, shared by all its stages.

    1. env WANDB_RUN_GROUP (W&B's own), else TRINITY_WANDB_GROUP, when set: the user's name for the run (several
       repros may share it on purpose), made a valid group name (`group_name`).
    2. `exp-<DVC_EXP_NAME>`: `dvc exp run` names the experiment in every stage's environment.
    3. `dvc-<start>-<pid>` of the nearest `dvc` ancestor process. DVC starts every stage of a `dvc repro` (or
       `dvc exp run`) as a child process of that one `dvc` process, and tells a stage command nothing that is
       per-run (its env has only DVC_ROOT and DVC_STAGE), so the dvc process itself is the run: every stage
       of the repro finds the same one, and the next repro is another process (another pid, another start
       time: a reused pid does not start at the same second). Nothing is written to disk, so a crashed or
       partial repro leaves no state that a later one could pick up; stages DVC skips simply have no run in
       the group (their runs are in the group of the repro that ran them).
    4. `prefect-<root flow run id>` inside a Prefect flow run: the pipeline flow (flows/pipeline.py) runs the
       stage flows as subflows of one root flow run, in one process.
    5. `proc-<start>-<pid>` of this process: a stage run by hand, or a test, is its own run.
    """
    group = group_name(os.environ.get(WANDB_GROUP_ENV, "") or os.environ.get(GROUP_ENV, ""))
    if not group and os.environ.get(DVC_EXP_ENV):
        group = group_name(f"exp-{os.environ[DVC_EXP_ENV]}")
    return group or pipeline_run_id()


def group_name(name: str) -> str:
    """`name` as a group name a W&B Report's run-set filter can hold (trinity.ops.wandb_report): letters, digits
    and `._:+@-`, at most 128 characters; other runs of characters become one '-'."""
    clean = re.sub(r"[^A-Za-z0-9._:+@-]+", "-", redact_text(name.strip())).strip("-")
    return clean[:_NAME_MAXLEN]


def _stamp(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).strftime("%Y%m%dT%H%M%S")


def _is_dvc(cmdline: list[str]) -> bool:
    """`dvc ...` (the console script) or `python [-m] .../dvc ...`."""
    head = [Path(a).name for a in cmdline[:3]]
    if head and head[0] in ("dvc", "dvc.exe"):
        return True
    return bool(head) and head[0].startswith("python") and (
        (len(head) > 1 and head[1] in ("dvc", "dvc.exe")) or cmdline[1:3] == ["-m", "dvc"])


def _dvc_ancestor():
    """The nearest ancestor process that is `dvc`, or None."""
    import psutil

    try:
        parents = psutil.Process().parents()
    except psutil.Error:
        return None
    for proc in parents:
        try:
            if _is_dvc(proc.cmdline()):
                return proc
        except psutil.Error:  # gone, or not ours to read
            continue
    return None


def _prefect_root_flow_run_id() -> str | None:
    if "prefect" not in sys.modules:  # not in a flow: don't import Prefect just to ask
        return None
    try:
        from prefect.context import FlowRunContext

        ctx = FlowRunContext.get()
        if ctx is None or ctx.flow_run is None:
            return None
        from prefect.runtime import flow_run

        return str(flow_run.root_flow_run_id or ctx.flow_run.id)
    except Exception:  # the group is a label: never fail a stage over it
        return None


def pipeline_run_id() -> str:
    """The id of the pipeline run this process belongs to (steps 2-4 of `wandb_group`)."""
    import psutil

    dvc = _dvc_ancestor()
    if dvc is not None:
        try:
            return f"dvc-{_stamp(dvc.create_time())}-{dvc.pid}"
        except psutil.Error:
            pass
    root = _prefect_root_flow_run_id()
    if root:
        return f"prefect-{root}"
    me = psutil.Process()
    return f"proc-{_stamp(me.create_time())}-{me.pid}"


def _set_storage_env(wandb_dir: Path) -> None:
    for name, sub in _WANDB_STORAGE_ENV.items():
        current = os.environ.get(name)
        if not current or _own_env.get(name) == current:
            value = str((wandb_dir / sub).resolve())
            os.environ[name] = _own_env[name] = value


class StageRun:
    """A thin wrapper over a wandb run: log metrics, tables, images, artifacts and a summary, all redacted."""

    def __init__(self, settings: Settings, stage: str, config: dict[str, Any] | None = None,
                 root: Path = PROJECT_ROOT):
        import wandb

        from trinity.code_version import run_id

        register_pool(settings.pool)
        mode = os.environ.get("WANDB_MODE") or settings.tracking.wandb_mode
        wandb_dir = Path(os.environ.get("WANDB_DIR") or root / "data" / "wandb")
        wandb_dir.mkdir(parents=True, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        _set_storage_env(wandb_dir)
        self._wandb = wandb
        self.wandb_dir = wandb_dir
        self._inputs: list[dict[str, str]] = []
        self._history_keys: dict[str, None] = {}  # keys passed to `run.log`, in first-logged order
        self._summary_keys: dict[str, None] = {}
        self.run = wandb.init(
            project=settings.tracking.wandb_project, job_type=stage, group=wandb_group(), mode=mode,
            dir=str(wandb_dir), name=run_id(settings, stage),
            config=redact({"stage": stage, "params": settings.model_dump(exclude={"source_path"}),
                           "params_hash": settings.params_hash(), "code_version": code_version(),
                           **(config or {})}),
            settings=wandb.Settings(console="off", x_disable_stats=True), reinit="finish_previous")

    @property
    def dir(self) -> str | None:
        return getattr(self.run, "dir", None)

    @property
    def offline(self) -> bool:
        """True when the run cannot reach the W&B server (offline or disabled mode)."""
        return bool(getattr(self.run, "offline", False) or getattr(self.run, "disabled", False))

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        metrics = redact(metrics)
        self._history_keys.update(dict.fromkeys(metrics))
        self.run.log(metrics, step=step)

    def make_table(self, columns: list[str], rows: list[list[Any]]):
        """A redacted `wandb.Table` (not logged): cells of mixed types are allowed."""
        return self._wandb.Table(columns=redact(list(columns)), data=redact([list(r) for r in rows]),
                                 allow_mixed_types=True)

    def table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        self._log_media(key, self.make_table(columns, rows))

    def image(self, key: str, path: Path) -> None:
        """Log the image file at `path` (a PNG) as a `wandb.Image` under `key`."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"image to log not found: {path}")
        self._log_media(key, self._wandb.Image(str(path)))

    def _log_media(self, key: str, media) -> None:
        """A table or image under `key` (redacted): the object itself is already redacted, or a file."""
        key = redact_text(key)
        self._history_keys[key] = None
        self.run.log({key: media})

    def summary(self, values: dict[str, Any]) -> None:
        for k, v in redact(values).items():
            self._summary_keys[k] = None
            self.run.summary[k] = v

    def log_artifact(self, name: str, type: str, paths: Iterable[Path], metadata: dict | None = None):
        """Log the files `paths` (each by its file name; a directory by its name, with its tree) as a W&B
        artifact `name` of `type` (both made valid W&B names, see `artifact_name`); returns the artifact.

        `metadata` is redacted. A text file (json, jsonl, md, yaml, ...) that contains a secret is logged
        redacted, with a warning and its name in metadata["redacted_files"]; other files go in as they are.
        Offline, W&B stages a copy of each file under $WANDB_DATA_DIR (inside WANDB_DIR, see the module
        docstring) for a later `wandb sync`."""
        artifact_type = _artifact_type(type)
        artifact = self._wandb.Artifact(artifact_name(name), type=artifact_type)
        redacted_files: list[str] = []
        with tempfile.TemporaryDirectory(prefix="trinity-artifact-") as tmp:
            def add(path: Path, entry: str) -> None:
                red = _redacted_text_of(path)
                if red is None:
                    artifact.add_file(str(path), name=entry)
                    return
                copy = Path(tmp) / f"{len(redacted_files)}{path.suffix}"
                copy.write_text(red, encoding="utf-8")
                artifact.add_file(str(copy), name=entry)  # copied to staging now: the tmp dir may go
                redacted_files.append(entry)

            for p in paths:
                p = Path(p)
                if p.is_dir():
                    files = sorted(f for f in p.rglob("*") if f.is_file())
                    if any(_redacted_text_of(f) is not None for f in files):
                        for f in files:
                            add(f, f"{p.name}/{f.relative_to(p).as_posix()}")
                    else:
                        artifact.add_dir(str(p), name=p.name)
                elif p.is_file():
                    add(p, p.name)
                else:
                    raise FileNotFoundError(f"artifact {name!r}: no such file or directory: {p}")
        if redacted_files:
            warnings.warn(f"artifact {artifact.name!r}: secrets redacted from {redacted_files}", stacklevel=2)
        meta = dict(metadata or {})
        if redacted_files:
            meta["redacted_files"] = redacted_files
        artifact.metadata = _json_safe(redact(meta))
        return self.run.log_artifact(artifact, aliases=["latest", content_alias(paths)])

    def use_artifact(self, name: str, type: str, paths: Iterable[Path] | None = None):
        """Declare that this run consumed artifact `name` of `type` (the lineage prepared data -> checkpoint ->
        eval): the exact version holding the files `paths` (`content_alias`; None: "latest"). The dependency is
        always recorded in the run's config and summary ("inputs": [{"name", "type", "alias"}]).

        Online, this also calls `run.use_artifact("<name>:<alias>")` and returns the artifact (None, with a
        warning, when W&B cannot resolve it, e.g. its producer run is not synced yet). Offline (or disabled)
        it returns None and does not raise: W&B 0.31's `run.use_artifact` raises TypeError in offline mode, so
        the recorded inputs are what `restore_lineage` declares after `wandb sync`."""
        alias = content_alias(paths) if paths is not None else "latest"
        entry = {"name": artifact_name(name), "type": _artifact_type(type), "alias": alias}
        if entry not in self._inputs:
            self._inputs.append(entry)
        inputs = redact([dict(e) for e in self._inputs])
        self.run.config.update({"inputs": inputs}, allow_val_change=True)
        self.summary({"inputs": inputs})
        if self.dir and Path(self.dir).is_dir():  # a file of the run (synced with it; none when W&B is disabled),
            (Path(self.dir) / INPUTS_FILE).write_text(json.dumps(inputs, indent=1))  # read by `recorded_inputs`
        if self.offline:
            return None
        try:
            return self.run.use_artifact(f"{entry['name']}:{alias}", type=entry["type"])
        except Exception as e:  # lineage is worth a warning, never a failed stage
            warnings.warn(f"W&B could not resolve input artifact {entry['name']}:{alias} "
                          f"({redact_text(str(e))})", stacklevel=2)
            return None

    def log_eval_results(self, results: EvalResults, plots_dir: Path | None = None) -> None:
        """The evaluate stage's results in this run (`log_eval_results`)."""
        log_eval_results(self, results, plots_dir)

    def record(self) -> dict[str, Any]:
        """Who this run is and the keys it logged (`RUN_FILE`)."""
        r = self.run
        return {"id": r.id, "name": r.name, "group": r.group, "job_type": r.job_type, "project": r.project,
                "entity": getattr(r, "entity", "") or "", "started": float(r.start_time),
                "history_keys": list(self._history_keys), "summary_keys": list(self._summary_keys)}

    def _write_record(self) -> None:
        if self.dir and Path(self.dir).is_dir():  # none when W&B is disabled
            write_json(Path(self.dir) / RUN_FILE, self.record())

    def finish(self) -> None:
        self._write_record()
        self.run.finish()

    def __enter__(self) -> "StageRun":
        return self

    def __exit__(self, exc_type, *_) -> None:
        self._write_record()
        self.run.finish(exit_code=1 if exc_type else 0)


_BENCHMARK_COLUMNS = ["method", "kind", "score", "ci_low", "ci_high", "n", "unscored", "tokens_per_task",
                      "wall_s_per_task", "cost_usd_per_task", "mean_turns"]
_PAIRED_COLUMNS = ["benchmark", "a", "b", "label", "diff", "ci_low", "ci_high", "n", "outcome"]


def log_eval_results(tracker: StageRun, results: EvalResults, plots_dir: Path | None) -> None:
    """Log data/eval/results.json (docs/eval_results_schema.md; read as `EvalResults`) to the stage's W&B run, in
    one step:

    * `eval/<benchmark>`: a table per benchmark, one row per method with a score entry
      (columns: method, kind, score, ci_low, ci_high, n, unscored, tokens_per_task, wall_s_per_task,
      cost_usd_per_task, mean_turns);
    * `eval/summary`: one row per method, a column per benchmark's score, avg_in_distribution, avg_heldout;
    * `eval/paired`: the paired comparisons (benchmark, a, b, label, diff, ci_low, ci_high, n, outcome);
    * summary values `score/<method>/<benchmark>`, `avg_in_distribution/<method>`, `avg_heldout/<method>`
      (null scores are left out, as in metrics.json);
    * every `*.png` of `plots_dir` as an image `plots/<stem>`.
    """
    benchmarks = [b.name for b in results.benchmarks]
    benchmarks += sorted({b for per in results.scores.values() for b in per} - set(benchmarks))
    kinds = {m.id: m.kind for m in results.methods}
    methods = list(kinds) + [m for m in results.scores if m not in kinds]

    payload: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for bench in benchmarks:
        rows = []
        for m in methods:
            s = results.cell(m, bench)
            if s is None:
                continue
            lo, hi = s.ci95 or (None, None)
            rows.append([m, kinds.get(m), s.score, lo, hi, s.n, s.unscored, s.tokens_per_task, s.wall_s_per_task,
                         s.cost_usd_per_task, s.mean_turns])
            if s.score is not None:
                values[f"score/{m}/{bench}"] = s.score
        payload[f"{EVAL_TABLE_PREFIX}{bench}"] = tracker.make_table(_BENCHMARK_COLUMNS, rows)

    summary_rows = []
    splits = [k for k in SPLIT_KEYS if results.in_split(k)]
    for m in methods:
        summary_rows.append([m, *[(results.cell(m, b) or Cell()).score for b in benchmarks],
                             *(results.average(m, split) for split in splits)])
        for split in splits:
            if results.average(m, split) is not None:
                values[f"avg_{split}/{m}"] = results.average(m, split)
    payload[EVAL_SUMMARY_TABLE] = tracker.make_table(
        ["method", *benchmarks, *(f"avg_{split}" for split in splits)], summary_rows)

    paired_rows = []
    for bench, comparisons in results.paired.items():
        for c in comparisons:
            lo, hi = c.ci95 or (None, None)
            paired_rows.append([bench, c.a, c.b, c.label, c.diff, lo, hi, c.n, c.outcome])
    payload[EVAL_PAIRED_TABLE] = tracker.make_table(_PAIRED_COLUMNS, paired_rows)

    if plots_dir is not None and Path(plots_dir).is_dir():
        for png in sorted(Path(plots_dir).glob("*.png")):
            payload[f"{PLOTS_PREFIX}{png.stem}"] = tracker._wandb.Image(str(png))

    tracker.log(payload)
    tracker.summary(values)


__all__ = ["EVAL_PAIRED_TABLE", "EVAL_SUMMARY_TABLE", "EVAL_TABLE_PREFIX", "GROUP_ENV", "PLOTS_PREFIX", "RUN_FILE", "StageRun",
           "group_name", "log_eval_results", "pipeline_run_id", "wandb_group"]


if __name__ == "__main__":  # python -m trinity.ops.tracking sync [WANDB_DIR] [--entity E]
    import argparse

    ap = argparse.ArgumentParser(description="sync offline W&B runs, then restore their exact-version lineage")
    ap.add_argument("command", choices=["sync"])
    ap.add_argument("wandb_dir", nargs="?", default=str(PROJECT_ROOT / "data" / "wandb"))
    ap.add_argument("--project", default="trinity", help="the params' tracking.wandb_project")
    ap.add_argument("--entity", default=None)
    args = ap.parse_args()
    for path, declared in sync(Path(args.wandb_dir), args.project, args.entity):
        print(f"{path}: {', '.join(declared) or 'no recorded inputs'}")
