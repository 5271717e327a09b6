"""`trinity` command line: ask the trained coordinator, read a stored trace, serve it as an OpenAI-compatible model,
run a pipeline stage, write the report (or a pipeline run's W&B Report), export the store to Parquet, check the
graders."""
from __future__ import annotations

import json
import os
import sys
import traceback
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from trinity.serving.conversation import ANSWER_FORMATS  # light, as trinity.stages: torch loads only when a command runs
from trinity.serving.traces import RETENTION_ENV
from trinity.stages import STAGES

EXIT_OK, EXIT_NO_ANSWER, EXIT_USAGE, EXIT_POOL_FAILURE, EXIT_NOT_FOUND, EXIT_FAILED = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
EXIT_CODES_HELP = (
    "Exit codes: 0 success; 1 the coordinator gave no answer; 2 bad usage or configuration (options, params, "
    "checkpoint, a store another process writes); 3 a pool failure left no answer; 4 no such episode or store; "
    "5 the command failed while running (any other error: one line on stderr, the traceback with --debug); "
    "130 interrupted. Relative paths (--params, --checkpoint, --store, --out) are read from --root.")

app = typer.Typer(name="trinity", help=__doc__, epilog=EXIT_CODES_HELP, no_args_is_help=True,
                  add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


AnswerFormat = Enum("AnswerFormat", {f: f for f in ANSWER_FORMATS}, type=str)
StageName = Enum("StageName", {s: s for s in STAGES}, type=str)
LogLevel = Enum("LogLevel", {v: v for v in ("critical", "error", "warning", "info", "debug")}, type=str)

RootOpt = Annotated[Path, typer.Option(help="project directory holding data/; every relative path option is read "
                                            "from it")]
ParamsOpt = Annotated[Path, typer.Option(help="params file the checkpoint was trained with (relative: in ROOT)")]
CheckpointOpt = Annotated[Optional[Path], typer.Option(
    help="checkpoint directory (holding coordinator.npy + coordinator.json) or its stem (relative: in ROOT); "
         "default ROOT/data/checkpoints")]
StoreOpt = Annotated[Optional[Path], typer.Option(
    help="response store (DuckDB file; relative: in ROOT); default ROOT/data/store/trinity.duckdb")]
RetryOpt = Annotated[bool, typer.Option(
    "--retry-failures", help="ask again every request whose stored answer is a failure (outages are always asked "
                             "again; this also re-asks deterministic failures). Same as TRINITY_RETRY_FAILURES=1")]


_debug = False
"""--debug: an unexpected error prints its traceback (set by the top-level callback)."""


@app.callback()
def _options(debug: Annotated[bool, typer.Option("--debug", help="print the traceback of an unexpected error "
                                                                "(exit code 5)")] = False) -> None:
    global _debug
    _debug = debug


def _fail(message: str, code: int = EXIT_USAGE):
    print(f"trinity: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


def _in_root(root: Path, path: Path) -> Path:
    """A path option as given when absolute, else read from ROOT."""
    return path if path.is_absolute() else root.resolve() / path


def _paths(root: Path, checkpoint: Path | None, store: Path | None) -> tuple[Path, Path]:
    from trinity.stages.paths import Paths

    p = Paths(root.resolve())
    return (_in_root(root, checkpoint) if checkpoint else p.checkpoint.parent,
            _in_root(root, store) if store else p.store)


def _params_path(root: Path, params: Path) -> Path:
    return _in_root(root, params)


def _load_coordinator(root: Path, params: Path, checkpoint: Path | None, store: Path | None, *, writer: bool,
                      trace_retention_days: float | None = None):
    """Coordinator.load, with what fails while loading (params, checkpoint, a pool member's missing key, the encoder,
    a store another process writes) turned into exit code 2 and a one-line message."""
    from trinity.config import ConfigError
    from trinity.coordinator.policy import CheckpointError
    from trinity.serving.conversation import Coordinator
    from trinity.pool.errors import PoolConfigError

    ckpt, store_path = _paths(root, checkpoint, store)
    try:
        return Coordinator.load(ckpt, _params_path(root, params), store_path, writer=writer,
                                trace_retention_days=trace_retention_days)
    except (ConfigError, CheckpointError, PoolConfigError, FileNotFoundError, RuntimeError) as e:
        _fail(str(e))


def _retry(flag: bool) -> None:
    if flag:
        os.environ["TRINITY_RETRY_FAILURES"] = "1"  # read by every Store this process opens


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

    from trinity.serving.conversation import ANSWERED, NO_ANSWER, ConversationError, answer_now, task_from_messages
    from trinity.serving.traces import render_trace

    _retry(retry_failures)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    try:
        task = task_from_messages(messages, answer_format.value)
    except ConversationError as e:
        _fail(str(e))
    with _load_coordinator(root, params, checkpoint, store, writer=False) as coordinator:
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

    _, store_path = _paths(root, None, store)
    try:
        retention_days = retention_days_from_env()
    except ConfigError as e:
        _fail(str(e))
    try:
        st = Store(store_path, read_only=True)
    except (FileNotFoundError, RuntimeError) as e:
        _fail(str(e))
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
        _fail(f"no episode {episode_id!r} in {store_path} (`trinity trace` lists the stored ones{kept})",
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
    from trinity.serving.server import ExposureError, api_key_from_env, check_exposure, run_server

    if not deadline_s > 0 or deadline_s == float("inf"):
        _fail(f"--deadline-s must be a number of seconds > 0, got {deadline_s:g}")
    try:
        check_exposure(host, api_key_from_env(), allow_unauthenticated)  # before anything slow is loaded
    except ExposureError as e:
        _fail(str(e))
    _retry(retry_failures)

    def ready(bound: int) -> None:
        print(f"trinity serve: listening on http://{host}:{bound}/v1", file=sys.stderr, flush=True)

    from trinity.ops.checkout_lock import StoreBusy, StoreLock

    try:  # the store's writer lock, for as long as this serves: weekly-retrain's `dvc repro` writes the same store
        store_lock = StoreLock(_paths(root, checkpoint, store)[1], f"trinity serve on {host}:{port}")
    except StoreBusy as e:
        _fail(f"{e}; this server would be a second writer: wait for it, or serve a copy of the store (--store)")
    with store_lock, _load_coordinator(root, params, checkpoint, store, writer=True,
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
    """Run one pipeline stage without W&B (and without Prefect, unless evolve.task_runner is 'dask'); prints its
    summary as JSON."""
    from trinity.stages import paths as stage_paths, run_stage
    from trinity.config import ConfigError, load_settings

    _retry(retry_failures)
    try:
        settings = load_settings(_params_path(root, params))
    except ConfigError as e:
        _fail(str(e))
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
            _fail(str(e))
        for name, path in written.items():
            print(f"{name}: {path}")
        return

    from trinity.ops.wandb_report import ReportInputError, outline, publish

    mode = os.environ.get("WANDB_MODE")
    if not mode:
        from trinity.config import ConfigError, load_settings

        path = _params_path(root, params)
        try:
            mode = load_settings(path).tracking.wandb_mode if path.exists() else "offline"
        except ConfigError as e:
            _fail(str(e))
    wandb_dir = Path(os.environ.get("WANDB_DIR") or root / "data" / "wandb")
    try:
        out = publish(wandb_dir, group=group, project=project, entity=entity, mode=mode)
    except ReportInputError as e:
        _fail(str(e))
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

    _, store_path = _paths(root, None, store)
    if not store_path.is_file():
        _fail(f"no response store at {store_path} (run the pipeline first, or pass --store)", EXIT_NOT_FOUND)
    dest = _in_root(root, out) if out else root.resolve() / "data" / "exports"
    with Store(store_path, read_only=True) as st:
        written = st.export_parquet(dest)
    for table, path in written.items():
        print(f"{table}: {path}")


store_app = typer.Typer(name="store", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        rich_markup_mode=None, help="Ship a store's responses and states as content-addressed "
                        "segments (zstd Parquet), and load them into another store: a committed run's (replay/), or "
                        "a team's through DVC (docs/operations.md, \"Sharing a store\").")
app.add_typer(store_app)
SegmentsArg = Annotated[Path, typer.Argument(help="segment directory (relative: in ROOT), e.g. replay/default")]


@store_app.command("export")
def store_export(directory: SegmentsArg, store: StoreOpt = None, root: RootOpt = Path(".")) -> None:
    """Write every response (sample) and hidden state of the store that DIRECTORY's segments lack as new segments
    (one per kind, named by the SHA-256 of its bytes). Needs the store's writer lock only to read it consistently:
    run it when no pipeline writes the store."""
    from trinity.store import Store
    from trinity.store_segments import describe, export_segments

    _, store_path = _paths(root, None, store)
    if not store_path.is_file():
        _fail(f"no response store at {store_path} (run the pipeline first, or pass --store)", EXIT_NOT_FOUND)
    dest = _in_root(root, directory)
    with Store(store_path, read_only=True) as st:
        counts = export_segments(st, dest)
    info = describe(dest)
    print(f"exported {counts} new to {dest} ({', '.join(counts.files) or 'no new segment'}); it now holds "
          f"{info['kinds']['responses']['rows']} responses and {info['kinds']['states']['rows']} states in "
          f"{info['bytes'] / 1e6:.2f} MB")


@store_app.command("import")
def store_import(directory: SegmentsArg, store: StoreOpt = None, root: RootOpt = Path(".")) -> None:
    """Load every segment of DIRECTORY into the store (created if missing), skipping the rows it holds: every
    response and state a run shipped, so that rerunning it pays for none of them. This process must be the store's
    only writer."""
    from trinity.store import Store
    from trinity.store_segments import SegmentError, import_segments

    _, store_path = _paths(root, None, store)
    src = _in_root(root, directory)
    try:
        with Store(store_path) as st:
            counts = import_segments(st, src)
    except SegmentError as e:
        _fail(str(e), EXIT_NOT_FOUND)
    except RuntimeError as e:  # another process writes the store
        _fail(str(e), EXIT_USAGE)
    print(f"imported {counts} into {store_path} from {len(counts.files)} segment(s) of {src}")


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
