"""A W&B Report for one pipeline run (one W&B group), built with `wandb-workspaces` from the runs' own keys.

The report (`build_report`) has four sections, each a panel grid whose run set is the group's run of one stage
(`Group = <group> and JobType = <stage>`):

* scores per benchmark — the evaluate run's tables (`eval/summary`, one `eval/<benchmark>` per benchmark,
  `eval/paired`: `trinity.ops.tracking.log_eval_results`) and the report stage's `plots/scores`;
* fitness per generation — the evolve run's history (`saved_fitness`, `mean_fitness`, `best_candidate_fitness`,
  accuracies: `trinity.stages.evolve.generation_logger`) and `plots/fitness`;
* usage by model and role — evolve's `model_usage/<member>` and `role_usage/<role>` per generation and
  `plots/usage` (the coordinator's turns at evaluation, model x role);
* score vs compute — `plots/score_vs_compute` (average score against tokens per task, per method) and
  evolve's running totals of new calls and cost.

Every key a panel references is taken from the keys the group's runs logged (`LoggedRun`), never from a list kept
here: a panel whose keys no run logged is left out, and the section says what is missing (e.g. a stage DVC did not
re-run in this pipeline run: its run is in the group of the run that ran it). Where those keys come from, only
through public interfaces: online, the W&B server's public API (`wandb.Api().runs`: each run's `history_keys` and
`summary`, `server_runs`); offline, the record each stage's run writes when it ends (`trinity.ops.tracking.RUN_FILE`
in its files/ directory: the keys it passed to `run.log` and the summary, `local_runs`).

Saving (`publish`) needs W&B online (WANDB_MODE, else params `tracking.wandb_mode`), an API key (WANDB_API_KEY or
~/.netrc), the server reachable, and the group's runs on it (offline runs: `python -m trinity.ops.tracking sync`
first); then `Report.save()` uploads it. Else the report is built from the local records but not saved, and says
why. Either way its description (`describe`: sections, run sets, panels and their keys, from the report's public
fields) is written to `<WANDB_DIR>/reports/<group>.json`. Offline the run sets carry no entity/project; they get
them when saved.
"""
from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

from trinity.ops.tracking import (EVAL_PAIRED_TABLE, EVAL_SUMMARY_TABLE, EVAL_TABLE_PREFIX, PLOTS_PREFIX, RUN_FILE,
                                  group_name)

# What the stages log (trinity.stages.evolve.generation_logger, .report); panels use those of them a run holds.
FITNESS_KEYS = ("saved_fitness", "mean_fitness", "best_candidate_fitness")
ACCURACY_KEYS = ("saved_accuracy", "mean_accuracy")
MODEL_USAGE_PREFIX = "model_usage/"
ROLE_USAGE_PREFIX = "role_usage/"
COMPUTE_KEYS = ("calls_total", "cost_usd_total")
STAGE_EVALUATE, STAGE_EVOLVE, STAGE_REPORT = "evaluate", "evolve", "report"

OFFLINE_MODES = frozenset({"offline", "disabled", "dryrun"})


class ReportInputError(ValueError):
    """Nothing to build a report from (no run dir, no run of the group): a clear message, exit code 2."""


# ------------------------------------------------------------------------------------------ the runs' keys
@dataclass
class LoggedRun:
    """What a report needs to know of one W&B run: who it is and which keys it logged."""
    id: str
    name: str
    group: str
    job_type: str
    project: str
    entity: str
    started: float
    history_keys: list[str] = field(default_factory=list)
    """Keys passed to `run.log` (scalars, tables, images), in the order first logged."""
    summary_keys: list[str] = field(default_factory=list)
    path: str = ""
    """Where the run is: its local directory, or entity/project/id on the W&B server."""

    @property
    def keys(self) -> list[str]:
        return self.history_keys + [k for k in self.summary_keys if k not in self.history_keys]


def _shown(key: str) -> bool:
    return not key.startswith("_")  # W&B's own: _step, _runtime, _timestamp, _wandb


def read_run(run_dir: Path) -> LoggedRun | None:
    """The run whose files are in `run_dir` (`offline-run-*` or `run-*`), from the record it wrote when it ended
    (`trinity.ops.tracking.RUN_FILE`); None for a run without one (not a stage's run, or one still running)."""
    record = Path(run_dir) / "files" / RUN_FILE
    if not record.is_file():
        return None
    try:
        r = json.loads(record.read_text())
        return LoggedRun(id=r["id"], name=r["name"], group=r["group"], job_type=r["job_type"], project=r["project"],
                         entity=r.get("entity") or "", started=float(r["started"]),
                         history_keys=[k for k in r["history_keys"] if _shown(k)],
                         summary_keys=[k for k in r["summary_keys"] if _shown(k)], path=str(run_dir))
    except (ValueError, KeyError, TypeError) as e:
        raise ReportInputError(f"{record}: not a run record ({e.__class__.__name__}: {e})") from e


def local_runs(wandb_dir: Path) -> list[LoggedRun]:
    """Every stage run under WANDB_DIR (its `wandb/` folder), oldest first."""
    base = Path(wandb_dir) / "wandb"
    if not base.is_dir():
        raise ReportInputError(f"no W&B runs: {base} does not exist (the pipeline writes its runs there; set "
                               f"WANDB_DIR or --root to where they are)")
    runs = [r for d in sorted(base.glob("*run-*")) if d.is_dir() and (r := read_run(d)) is not None]
    return sorted(runs, key=lambda r: (r.started, r.path))


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).replace(tzinfo=timezone.utc).timestamp()


def server_runs(api, entity: str, project: str, group: str) -> list[LoggedRun]:
    """The runs of `group` in entity/project on the W&B server, through its public API (`wandb.Api().runs`,
    their `history_keys` and `summary`), oldest first: online runs, and offline ones once synced."""
    out = []
    for r in api.runs(f"{entity}/{project}", filters={"group": group}, order="+created_at"):
        history = (r.history_keys or {}).get("keys") or {}
        out.append(LoggedRun(id=r.id, name=r.name, group=r.group, job_type=r.job_type, project=r.project,
                             entity=r.entity, started=_epoch(r.created_at),
                             history_keys=[k for k in history if _shown(k)],
                             summary_keys=[k for k in r.summary.keys() if _shown(k)],
                             path=f"{r.entity}/{r.project}/{r.id}"))
    return out


def select_group(runs: list[LoggedRun], group: str | None, where: Path) -> tuple[str, list[LoggedRun]]:
    """The runs of `group` (default: the group of the newest run), oldest first."""
    if not runs:
        raise ReportInputError(f"no W&B runs under {where}")
    if group is None:
        group = runs[-1].group
    if group != group_name(group):  # a run-set filter cannot hold it (e.g. " = " is rewritten as " == ")
        raise ReportInputError(f"W&B group {group!r}: a report can only filter on names of letters, digits and "
                               f"._:+@- (trinity.ops.tracking.group_name); this one has other characters")
    chosen = [r for r in runs if r.group == group]
    if not chosen:
        groups = sorted({r.group for r in runs}, key=lambda g: max(r.started for r in runs if r.group == g))
        raise ReportInputError(f"no W&B run of group {group!r} under {where}; groups there (newest last): "
                               f"{', '.join(groups[-10:])}")
    return group, chosen


# ------------------------------------------------------------------------------------------ the report
def _stage_runs(runs: list[LoggedRun], stage: str) -> list[LoggedRun]:
    return [r for r in runs if r.job_type == stage]


def _logged(runs: list[LoggedRun], wanted) -> list[str]:
    """The keys of `wanted` (an iterable of keys, or a prefix string) that some run logged, in logged order."""
    have: dict[str, None] = {}
    for r in runs:
        for k in r.keys:
            have.setdefault(k, None)
    if isinstance(wanted, str):
        return [k for k in have if k.startswith(wanted)]
    return [k for k in wanted if k in have]


def build_report(runs: list[LoggedRun], group: str, *, project: str, entity: str = "", bind: bool = False):
    """The `wandb_workspaces.reports.v2.Report` of one pipeline run. `runs`: the group's runs (`select_group`).
    `bind`: give each run set the entity and project (saving does; building its model then asks the server for
    the project's id)."""
    import wandb_workspaces.reports.v2 as wr

    def runset(stage: str):
        where = {"entity": entity, "project": project} if bind else {}
        return wr.Runset(name=f"{stage} ({group})"[:128], filters=f"Group = {group!r} and JobType = {stage!r}",
                         **where)

    def grid(stage: str, panels: list) -> list:
        panels = [p for p in panels if p is not None]
        return [wr.PanelGrid(runsets=[runset(stage)], panels=panels)] if panels else []

    def missing(stage: str, what: str) -> list:
        return [wr.P(f"Not in this pipeline run: {what} (no `{stage}` run of group {group} logged it; DVC re-runs "
                     "only the stages whose inputs changed, and a skipped stage's run is in the group of the run "
                     "that ran it).")]

    def line(title: str, keys: list[str], **kw):
        return wr.LinePlot(title=title, x="Step", y=keys, layout=wr.Layout(w=12, h=8), **kw) if keys else None

    def images(stage_runs: list[LoggedRun], stems: list[str]):
        keys = _logged(stage_runs, [f"{PLOTS_PREFIX}{s}" for s in stems])
        return wr.MediaBrowser(title=", ".join(keys), media_keys=keys, num_columns=1,
                               layout=wr.Layout(w=24, h=12)) if keys else None

    evaluate, evolve, report = (_stage_runs(runs, s) for s in (STAGE_EVALUATE, STAGE_EVOLVE, STAGE_REPORT))
    stages = ", ".join(f"{r.job_type} ({r.name})" for r in runs)
    blocks: list = [
        wr.P(f"Pipeline run {group}: {len(runs)} W&B runs — {stages}. Lineage of the artifacts: prepared-data "
             "(dataset) → coordinator (model) → eval-results; each run lists its inputs in its config and summary "
             "(`inputs`)."),
        wr.TableOfContents(),
    ]

    # --- scores per benchmark: the evaluate run's tables
    blocks.append(wr.H2("Scores per benchmark"))
    tables = _logged(evaluate, EVAL_TABLE_PREFIX)
    ordered = ([t for t in tables if t == EVAL_SUMMARY_TABLE]
               + sorted(t for t in tables if t not in (EVAL_SUMMARY_TABLE, EVAL_PAIRED_TABLE))
               + [t for t in tables if t == EVAL_PAIRED_TABLE])
    if ordered:
        blocks.append(wr.P(f"{EVAL_SUMMARY_TABLE}: every method's score per benchmark and both averages; "
                           f"{EVAL_TABLE_PREFIX}<benchmark>: score, 95% interval, n, tokens, time and cost per task; "
                           f"{EVAL_PAIRED_TABLE}: the paired comparisons with their intervals and outcome."))
        blocks += grid(STAGE_EVALUATE, [wr.WeavePanelSummaryTable(table_name=t, layout=wr.Layout(w=24, h=10))
                                        for t in ordered])
    else:
        blocks += missing(STAGE_EVALUATE, "the per-benchmark tables")
    blocks += grid(STAGE_REPORT, [images(report, ["scores"])])

    # --- fitness per generation: evolve's history
    blocks.append(wr.H2("Fitness per generation"))
    fitness = _logged(evolve, FITNESS_KEYS)
    if fitness:
        blocks.append(wr.P("saved_fitness: the vector the run saves (CMA's mean) on fixed scoring episodes; "
                           "mean_fitness / best_candidate_fitness: the generation's candidates on their minibatch."))
        blocks += grid(STAGE_EVOLVE, [line("Fitness", fitness), line("Accuracy", _logged(evolve, ACCURACY_KEYS))])
    else:
        blocks += missing(STAGE_EVOLVE, "the fitness curves")
    blocks += grid(STAGE_REPORT, [images(report, ["fitness"])])

    # --- usage by model and role
    blocks.append(wr.H2("Usage by model and role"))
    models, roles = _logged(evolve, MODEL_USAGE_PREFIX), _logged(evolve, ROLE_USAGE_PREFIX)
    if models or roles:
        blocks.append(wr.P("Training: the coordinator's picks per generation, by pool member and by role. "
                           "Evaluation: its turns per benchmark, model x role (the plot)."))
        blocks += grid(STAGE_EVOLVE, [line("Turns per model (training)", models),
                                      line("Turns per role (training)", roles)])
    else:
        blocks += missing(STAGE_EVOLVE, "the usage per model and role during training")
    blocks += grid(STAGE_REPORT, [images(report, ["usage"])])

    # --- score vs compute
    blocks.append(wr.H2("Score vs compute"))
    blocks += grid(STAGE_REPORT, [images(report, ["score_vs_compute"])])
    blocks += grid(STAGE_EVOLVE, [line("New LLM calls and cost (training, running totals)",
                                       _logged(evolve, COMPUTE_KEYS))])
    if not _logged(report, [f"{PLOTS_PREFIX}score_vs_compute"]):
        blocks += missing(STAGE_REPORT, "the score vs compute plot")

    title = f"Trinity pipeline run {group}"[:128]
    return wr.Report(project=project, entity=entity, title=title,
                     description=f"Trinity: scores, fitness, usage and compute of W&B group {group}",
                     blocks=blocks)


def _panel(panel) -> dict:
    """A panel of the report: its kind, title and the run keys it shows (the panel classes' public fields)."""
    import wandb_workspaces.reports.v2 as wr

    if isinstance(panel, wr.LinePlot):
        keys = list(panel.y)
    elif isinstance(panel, wr.MediaBrowser):
        keys = list(panel.media_keys)
    elif isinstance(panel, wr.WeavePanelSummaryTable):
        keys = [panel.table_name]
    else:
        keys = []
    return {"type": type(panel).__name__, "title": getattr(panel, "title", None), "keys": keys}


def _filters(runset) -> str:
    f = runset.filters
    return f if isinstance(f, str) else " and ".join(str(x) for x in f)


def describe(report) -> dict:
    """The report as built (`build_report`), from its public fields: title, project and each section with its text
    and its panel grids — each grid's run set (name, filters, where it is bound) and panels (kind, keys shown).
    What `publish` writes beside the report, saved or not."""
    import wandb_workspaces.reports.v2 as wr

    sections: list[dict] = [{"heading": None, "text": [], "grids": []}]
    for block in report.blocks:
        if isinstance(block, wr.H2):
            sections.append({"heading": str(block.text), "text": [], "grids": []})
        elif isinstance(block, wr.P):
            sections[-1]["text"].append(str(block.text))
        elif isinstance(block, wr.PanelGrid):
            sections[-1]["grids"].append({
                "runsets": [{"name": rs.name, "filters": _filters(rs), "entity": rs.entity or "",
                             "project": rs.project or ""} for rs in block.runsets],
                "panels": [_panel(p) for p in block.panels]})
    return {"title": report.title, "description": report.description, "project": report.project,
            "entity": report.entity or "", "sections": sections}


def outline(described: dict) -> list[str]:
    """The report (`describe`) in a few lines: each section, and each panel with its run set's stage and the keys
    it shows."""
    lines = []
    for sec in described["sections"]:
        if sec["heading"]:
            lines.append(f"## {sec['heading']}")
        for grid in sec["grids"]:
            where = "; ".join(rs["name"].split(" (")[0] for rs in grid["runsets"])  # the stage: "<stage> (<group>)"
            for p in grid["panels"]:
                lines.append(f"   [{where}] {p['type']}: {', '.join(p['keys'])}")
    return lines


# ------------------------------------------------------------------------------------------ saving
def _api_key_present(base_url: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    import netrc

    try:
        return netrc.netrc().authenticators(urlparse(base_url).hostname or "") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def _reachable(base_url: str, timeout_s: float = 5.0) -> str | None:
    """None if a TCP connection to the W&B server opens, else why not."""
    u = urlparse(base_url)
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=timeout_s).close()
        return None
    except OSError as e:
        return f"{u.hostname}:{port} unreachable ({e.__class__.__name__}: {e})"


def base_url_of_wandb() -> str:
    """The W&B server the SDK would use: WANDB_BASE_URL, else the SDK's default (wandb.Settings)."""
    import wandb

    return os.environ.get("WANDB_BASE_URL") or str(wandb.Settings().base_url)


def why_not_saved(mode: str) -> str | None:
    """None when a report can be saved (W&B online, an API key, the server reachable), else the reason."""
    if mode in OFFLINE_MODES:
        return f"W&B mode is {mode!r} (set WANDB_MODE=online to save)"
    base_url = base_url_of_wandb()
    if not _api_key_present(base_url):
        return f"no W&B API key (WANDB_API_KEY or ~/.netrc for {base_url})"
    return _reachable(base_url)


@dataclass
class Published:
    group: str
    runs: list[LoggedRun]
    description_path: Path
    saved: bool
    url: str | None
    reason: str | None
    """Why it was not saved (None when saved)."""


def publish(wandb_dir: Path, *, group: str | None = None, project: str | None = None, entity: str | None = None,
            mode: str = "offline") -> Published:
    """Build the report of `group` (default: the newest local run's group) and save it when W&B can be reached
    (`why_not_saved`): then its runs and their keys come from the server (`server_runs`, the public API), else from
    the run records under `wandb_dir` (`local_runs`). Its description (`describe`) is written to
    `<wandb_dir>/reports/<group>.json` either way."""
    import wandb_workspaces.reports.v2 as wr  # noqa: F401  (a missing package fails here, before any work)

    wandb_dir = Path(wandb_dir)
    reason = why_not_saved(mode)
    try:
        local = local_runs(wandb_dir)
    except ReportInputError:
        if reason is not None or group is None:
            raise
        local = []  # online, a named group: the server has its runs
    if group is None:
        group, _ = select_group(local, None, wandb_dir / "wandb")
    mine = [r for r in local if r.group == group]
    project = project or next((r.project for r in reversed(mine) if r.project), None) or "trinity"
    entity = entity or os.environ.get("WANDB_ENTITY") or next((r.entity for r in reversed(mine) if r.entity), "")
    url, runs, report = None, [], None
    if reason is None:
        try:
            import wandb

            api = wandb.Api()
            entity = entity or api.default_entity or ""
            runs = server_runs(api, entity, project, group)
            if not runs:
                reason = (f"no run of group {group} in {entity}/{project} on the W&B server (offline runs get there "
                          f"with `python -m trinity.ops.tracking sync`)")
            else:
                report = build_report(runs, group, project=project, entity=entity, bind=True)
                report.save()
                url = report.url
        except Exception as e:  # the description is still written below; say why it was not saved
            reason = f"saving failed: {e.__class__.__name__}: {e}"
    if reason is not None:
        group, runs = select_group(local, group, wandb_dir / "wandb")
        report = build_report(runs, group, project=project, entity=entity, bind=False)
    out = wandb_dir / "reports" / f"{group}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "group": group, "project": project, "entity": entity, "saved": reason is None, "url": url,
        "not_saved_because": reason,
        "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": [{"id": r.id, "name": r.name, "job_type": r.job_type, "path": r.path} for r in runs],
        "report": describe(report)}, indent=2) + "\n")
    return Published(group=group, runs=runs, description_path=out, saved=reason is None, url=url, reason=reason)


def publish_if_online(wandb_dir: Path, *, group: str, project: str | None, mode: str) -> Published | None:
    """The report stage's hook (flows/report.py): when W&B is online, build and save the report of this
    pipeline run (`group`) and say where it went; else do nothing (`trinity report --wandb` builds it on
    demand). Never fails the stage: a report is worth a message, not a failed pipeline."""
    if mode in OFFLINE_MODES:
        return None
    try:
        out = publish(wandb_dir, group=group, project=project, mode=mode)
    except Exception as e:  # noqa: BLE001
        print(f"[report] W&B report of group {group} not built: {e.__class__.__name__}: {e}", flush=True)
        return None
    print(f"[report] W&B report of group {group}: " + (f"saved: {out.url}" if out.saved else
          f"built but NOT saved ({out.reason}); its description is in {out.description_path}"), flush=True)
    return out


__all__ = ["LoggedRun", "Published", "ReportInputError", "build_report", "describe", "local_runs", "outline", "publish",
           "publish_if_online", "read_run", "select_group", "server_runs", "why_not_saved"]
