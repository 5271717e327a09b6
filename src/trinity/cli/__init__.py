"""The `trinity` command (`main`) and its commands: ask, trace, serve, stage, report, export, diagnose, check-graders;
`trinity store` is in store.py, what they share (exit codes, options, failing in one line) in common.py."""
from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Optional

import typer

from trinity.cli.common import (EXIT_FAILED, EXIT_INTERRUPTED, EXIT_NO_ANSWER, EXIT_NOT_FOUND, EXIT_OK,
                                EXIT_POOL_FAILURE, EXIT_USAGE, AnswerFormat, CheckpointOpt, LogLevel, ParamsOpt,
                                RetryOpt, RootOpt, StageName, StoreOpt, app, apply_retry_failures, fail, in_root,
                                load_coordinator, params_path, store_paths)
from trinity.cli.store import store_app
from trinity.serving.traces import RETENTION_ENV

app.add_typer(store_app)

_debug = False
"""--debug: an unexpected error prints its traceback (set by the top-level callback)."""


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="print the traceback of an unexpected error "
                                                                "(exit code 5)")] = False) -> None:
    global _debug
    _debug = debug


@app.command()
def ask(
    question: Annotated[str, typer.Argument(help="the question (one user message)")],
    answer_format: Annotated[AnswerFormat, typer.Option(
        "--answer-format", "-f", help="answer format the Worker is asked for: free (none), math (\\boxed{}), "
                                      "choice ('Answer: X'), code (one Python block)")] = AnswerFormat("free"),
    system: Annotated[Optional[str], typer.Option(help="instructions, as an OpenAI system message")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the full trace as JSON on stdout instead")] = False,
    texts: Annotated[bool, typer.Option("--texts/--no-texts", help="also print every turn's text (stderr)")] = False,
    root: RootOpt = Path("."),
    params: ParamsOpt = Path("params.yaml"),
    checkpoint: CheckpointOpt = None,
    store: StoreOpt = None,
    retry_failures: RetryOpt = False,
) -> None:
    """Answer a question with the trained coordinator over the pool: the answer on stdout, the trace (who acted, in
    which role, tokens, latency, verdict) as a table on stderr. The store is opened read-only when a pipeline writes
    it (then nothing new is saved). The episode's trace is kept: `trinity trace EPISODE_ID`."""
    from rich.console import Console

    from trinity.serving.conversation import ANSWERED, NO_ANSWER, answer_now
    from trinity.serving.messages import ConversationError, task_from_messages
    from trinity.serving.traces import render_trace

    apply_retry_failures(retry_failures)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    try:
        task = task_from_messages(messages, answer_format.value)
    except ConversationError as e:
        fail(str(e))
    with load_coordinator(root, params, checkpoint, store, writer=False) as coordinator:
        result = answer_now(coordinator, task)
    trace = result.trace()
    if as_json:
        print(json.dumps(trace, indent=2, ensure_ascii=False))
    else:
        render_trace(trace, Console(stderr=True), texts=texts)
        if result.outcome == ANSWERED:
            print(result.answer)
    if result.outcome != ANSWERED:
        print(f"trinity: no answer: {result.reason}", file=sys.stderr)
        raise typer.Exit(EXIT_NO_ANSWER if result.outcome == NO_ANSWER else EXIT_POOL_FAILURE)


@app.command()
def trace(
    episode_id: Annotated[Optional[str], typer.Argument(
        help="an episode id (printed by `trinity ask`, returned as trinity.episode_id by the server); "
             "omit it to list the latest episodes")] = None,
    texts: Annotated[bool, typer.Option("--texts/--no-texts", help="print the conversation and every turn's text")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the stored trace as JSON")] = False,
    limit: Annotated[int, typer.Option(help="how many episodes to list without EPISODE_ID", min=1)] = 20,
    root: RootOpt = Path("."),
    store: StoreOpt = None,
) -> None:
    """Render a stored episode (conversation, each turn's member, role, text, verdict, tokens, latency) from the
    store, read-only (works while a server or a pipeline writes it). Under TRINITY_TRACE_RETENTION_DAYS, older
    episodes are not shown (their writer deletes them)."""
    from rich.console import Console

    from trinity.config import ConfigError
    from trinity.store import Store
    from trinity.serving.traces import TraceLog, render_trace, retention_days_from_env

    _, store_path = store_paths(root, None, store)
    try:
        retention_days = retention_days_from_env()
    except ConfigError as e:
        fail(str(e))
    try:
        st = Store(store_path, read_only=True)
    except (FileNotFoundError, RuntimeError) as e:
        fail(str(e))
    try:
        log = TraceLog(st, retention_days=retention_days)
        if episode_id is None:
            rows = log.recent(limit)
            for eid, outcome, when in rows:
                print(f"{eid}  {outcome:<12}  {when}")
            if not rows:
                print(f"no stored episodes in {store_path}", file=sys.stderr)
            log.close()
            return
        found = log.get(episode_id)
        log.close()
    finally:
        st.close()
    if found is None:
        kept = f"; episodes older than {retention_days:g} days are not kept ({RETENTION_ENV})" \
            if retention_days is not None else ""
        fail(f"no episode {episode_id!r} in {store_path} (`trinity trace` lists the stored ones{kept})",
              EXIT_NOT_FOUND)
    if as_json:
        print(json.dumps(found, indent=2, ensure_ascii=False))
    else:
        render_trace(found, Console(), texts=texts)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="interface to listen on (loopback by default; 0.0.0.0 exposes it)")] =
        "127.0.0.1",
    port: Annotated[int, typer.Option(help="port (0: any free port, printed when listening)", min=0, max=65535)] =
        8000,
    max_body_bytes: Annotated[int, typer.Option(help="larger request bodies get 413", min=1024)] = 1_000_000,
    max_in_flight: Annotated[int, typer.Option(
        help="chat completions running at once (episodes and direct member calls, until their last call returns); "
             "one more gets 429 with Retry-After", min=1)] = 32,
    deadline_s: Annotated[float, typer.Option(
        help="seconds a request may take; beyond: 504 (streaming: an error event) and the episode's remaining turns "
             "are cancelled (the calls it made stay in the store)")] = 600.0,
    allow_unauthenticated: Annotated[bool, typer.Option(
        "--allow-unauthenticated", help="serve beyond loopback (--host 0.0.0.0, ...) without TRINITY_API_KEY: refused "
                                        "otherwise, since anyone who reaches the port could spend the pool's members")]
        = False,
    trace_retention_days: Annotated[Optional[float], typer.Option(
        envvar=RETENTION_ENV, min=0,
        help="delete stored conversations (the store's traces) older than this many days, at start and on each "
             "new one; 0: keep them forever (the default). Same as the environment variable; `trinity trace` "
             "reads the variable")] = None,
    log_level: Annotated[LogLevel, typer.Option(help="uvicorn / trinity log level")] = LogLevel("info"),
    root: RootOpt = Path("."),
    params: ParamsOpt = Path("params.yaml"),
    checkpoint: CheckpointOpt = None,
    store: StoreOpt = None,
    retry_failures: RetryOpt = False,
) -> None:
    """Serve the trained coordinator as an OpenAI-compatible endpoint: GET /v1/models, POST /v1/chat/completions
    (model "trinity" or a pool member's name; stream true for server-sent events). Set TRINITY_API_KEY to require
    'Authorization: Bearer <key>' (required beyond loopback unless --allow-unauthenticated). A client that
    disconnects cancels its episode's remaining turns. This process must be the store's only writer: it holds the
    store's writer lock (<store>.writer.lock) while it serves, so a weekly-retrain run is refused meanwhile, and it
    refuses to start (exit 2, naming the holder) while one runs."""
    from trinity.serving.security import ExposureError, api_key_from_env, check_exposure
    from trinity.serving.server import run_server

    if not deadline_s > 0 or deadline_s == float("inf"):
        fail(f"--deadline-s must be a number of seconds > 0, got {deadline_s:g}")
    try:
        check_exposure(host, api_key_from_env(), allow_unauthenticated)  # before anything slow is loaded
    except ExposureError as e:
        fail(str(e))
    apply_retry_failures(retry_failures)

    def ready(bound: int) -> None:
        print(f"trinity serve: listening on http://{host}:{bound}/v1", file=sys.stderr, flush=True)

    from trinity.ops.checkout_lock import StoreBusy, StoreLock

    try:  # the store's writer lock, for as long as this serves: weekly-retrain's `dvc repro` writes the same store
        store_lock = StoreLock(store_paths(root, checkpoint, store)[1], f"trinity serve on {host}:{port}")
    except StoreBusy as e:
        fail(f"{e}; this server would be a second writer: wait for it, or serve a copy of the store (--store)")
    with store_lock, load_coordinator(root, params, checkpoint, store, writer=True,
                                       trace_retention_days=trace_retention_days) as coordinator:
        run_server(coordinator, host, port, max_body_bytes=max_body_bytes, max_in_flight=max_in_flight,
                   deadline_s=deadline_s, allow_unauthenticated=allow_unauthenticated, log_level=log_level.value,
                   on_ready=ready)


@app.command()
def stage(
    name: Annotated[StageName, typer.Argument(help="the stage to run")],
    params: Annotated[Path, typer.Option(help="params file (validated when loaded; relative: in ROOT)")] =
        Path("params.yaml"),
    root: RootOpt = Path("."),
    retry_failures: RetryOpt = False,
) -> None:
    """Run one pipeline stage without W&B (and without Prefect, unless pool.task_runner is 'dask'); prints its
    summary as JSON."""
    from trinity.stages import paths as stage_paths, run_stage
    from trinity.config import ConfigError, load_settings

    apply_retry_failures(retry_failures)
    try:
        settings = load_settings(params_path(root, params))
    except ConfigError as e:
        fail(str(e))
    out = run_stage(name.value, settings, stage_paths.Paths(root.resolve()))
    print(json.dumps(out, default=str))


@app.command()
def report(
    wandb: Annotated[bool, typer.Option("--wandb", help="build the W&B Report of one pipeline run (a W&B group) "
                                        "from the runs under WANDB_DIR (default ROOT/data/wandb) instead")] = False,
    group: Annotated[Optional[str], typer.Option(help="with --wandb: the pipeline run's W&B group (default: the "
                                                      "group of the newest run)")] = None,
    project: Annotated[Optional[str], typer.Option(help="with --wandb: W&B project (default: the runs' own)")] = None,
    entity: Annotated[Optional[str], typer.Option(help="with --wandb: W&B entity (default: WANDB_ENTITY, the runs' "
                                                       "own, else your default entity)")] = None,
    params: Annotated[Path, typer.Option(help="params file (its tracking.wandb_mode, unless WANDB_MODE is set; "
                                              "relative: in ROOT)")] = Path("params.yaml"),
    root: RootOpt = Path("."),
) -> None:
    """Write the evaluation report (ROOT/reports: summary.md, traces.md, plots/*.png) from the pipeline's files;
    with --wandb, build the W&B Report of a pipeline run instead (per-benchmark tables, fitness curves, usage by
    model and role, score vs compute), save it when W&B is online with an API key and the server answers, and
    write its model to WANDB_DIR/reports/<group>.json either way."""
    root = root.resolve()
    if not wandb:
        from trinity.evaluation.report import write_report
        from trinity.evaluation.results import ResultsFormatError
        from trinity.stages.paths import Paths

        p = Paths(root)
        try:
            written = write_report(p.eval_dir, p.evolve_dir, p.checkpoint.with_suffix(".json"), p.reports)
        except (FileNotFoundError, ResultsFormatError) as e:
            fail(str(e))
        for name, path in written.items():
            print(f"{name}: {path}")
        return

    from trinity.ops.wandb_report import ReportInputError, outline, publish

    mode = os.environ.get("WANDB_MODE")
    if not mode:
        from trinity.config import ConfigError, load_settings

        path = params_path(root, params)
        try:
            mode = load_settings(path).tracking.wandb_mode if path.exists() else "offline"
        except ConfigError as e:
            fail(str(e))
    wandb_dir = Path(os.environ.get("WANDB_DIR") or root / "data" / "wandb")
    try:
        out = publish(wandb_dir, group=group, project=project, entity=entity, mode=mode)
    except ReportInputError as e:
        fail(str(e))
    stages_run = ", ".join(f"{r.job_type} ({r.name})" for r in out.runs)
    print(f"W&B report of group {out.group}: {len(out.runs)} runs: {stages_run}")
    print("\n".join(outline(json.loads(out.description_path.read_text())["report"])))
    print(f"description: {out.description_path}")
    if out.saved:
        print(f"saved: {out.url}")
    else:
        print(f"trinity: W&B report built but NOT saved: {out.reason}; its description is in {out.description_path}",
              file=sys.stderr)


@app.command()
def export(
    out: Annotated[Optional[Path], typer.Option(help="directory for the Parquet files (relative: in ROOT); default "
                                                     "ROOT/data/exports")] = None,
    store: StoreOpt = None,
    root: RootOpt = Path("."),
) -> None:
    """Export the response store to Parquet (responses, failures, states, episodes: one file per table) for
    DuckDB/pyarrow scans. Opens the store read-only: works while a pipeline writes it. Not a pipeline stage: the
    store is a cache that every run and experiment adds to, so its export is a view of it, not an output DVC could
    rebuild from a stage's dependencies."""
    from trinity.store import Store
    from trinity.store_segments import export_parquet

    _, store_path = store_paths(root, None, store)
    if not store_path.is_file():
        fail(f"no response store at {store_path} (run the pipeline first, or pass --store)", EXIT_NOT_FOUND)
    dest = in_root(root, out) if out else root.resolve() / "data" / "exports"
    with Store(store_path, read_only=True) as st:
        written = export_parquet(st, dest)
    for table, path in written.items():
        print(f"{table}: {path}")


@app.command()
def diagnose(
    heads: Annotated[int, typer.Option(help="random candidates drawn around the CMA mean (Q4)")] = 200,
    grade: Annotated[bool, typer.Option("--grade/--no-grade", help="grade unlabelled math/choice answers (the ones "
                                                                   "no run graded)")] = True,
    root: RootOpt = Path("."),
) -> None:
    """Diagnose a finished pipeline run from its files alone (ROOT/params.yaml and data/: checkpoint, store,
    prepared tasks, root states, eval episodes, evolve history and optimiser state): Q1 why episodes end where they
    do, Q2 hidden-state geometry, Q3 the saved head's exact expected accuracy and reward, Q4 fitness signal vs noise,
    Q5 other checks. Read-only (the store is opened read-only); no LLM call, no encoder load. Run it at the commit
    that produced the run: the trees are rebuilt with this checkout's prompts and keys (`trinity.diagnosis`)."""
    from trinity.diagnosis import diagnose as print_diagnosis
    from trinity.stages.paths import Paths

    root = root.resolve()
    p = Paths(root)
    for needed in (p.store, p.checkpoint.with_suffix(".json")):
        if not needed.is_file():
            fail(f"no finished run under {root}: {needed} is missing", EXIT_NOT_FOUND)
    print_diagnosis(root, heads, grade_unlabelled=grade)


@app.command("check-graders", context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                                "help_option_names": []})
def check_graders(ctx: typer.Context) -> None:
    """Run the canonical solutions through the graders; one JSON line per benchmark (arguments are passed on:
    `trinity check-graders --help`)."""
    from trinity.grading.check import main as check_main

    raise typer.Exit(check_main(list(ctx.args)) or 0)


def main(argv: list[str] | None = None) -> int:
    """The `trinity` console script; returns the exit code (EXIT_CODES_HELP): an expected failure has printed its
    one line already; any other error prints one line (its traceback too with --debug) and returns EXIT_FAILED."""
    from typer.exceptions import TyperException

    global _debug
    _debug = False
    try:  # not standalone: click would turn Ctrl-C into "Aborted!" and exit code 1 (which means "no answer")
        code = app(args=argv, prog_name="trinity", standalone_mode=False)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else EXIT_USAGE)
    except typer.Exit as e:
        code = e.exit_code
    except TyperException as e:  # bad usage: the message and the usage line
        e.show()
        return EXIT_USAGE
    except (KeyboardInterrupt, typer.Abort):
        print("trinity: interrupted", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the documented exit code for every unexpected error
        if _debug:
            traceback.print_exc()
        where = "" if _debug else " (--debug prints the traceback)"
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"trinity: {type(e).__name__}: {first}{where}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    if code == EXIT_INTERRUPTED:  # typer's own answer to Ctrl-C: an exit code, no message
        print("trinity: interrupted", file=sys.stderr, flush=True)
    return code if isinstance(code, int) else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
