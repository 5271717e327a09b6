"""What every `trinity` command shares: the exit codes, the app, the options, and the helpers that turn a failure into
one line and an exit code."""
from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from trinity.serving.messages import ANSWER_FORMATS  # light, as trinity.stages: torch loads only when a command runs
from trinity.stages import STAGES

HELP = """`trinity` command line: ask the trained coordinator, read a stored trace, serve it as an OpenAI-compatible model,
run a pipeline stage, write the report (or a pipeline run's W&B Report), export the store to Parquet, check the
graders."""

EXIT_OK, EXIT_NO_ANSWER, EXIT_USAGE, EXIT_POOL_FAILURE, EXIT_NOT_FOUND, EXIT_FAILED = 0, 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
EXIT_CODES_HELP = (
    "Exit codes: 0 success; 1 the coordinator gave no answer; 2 bad usage or configuration (options, params, "
    "checkpoint, a store another process writes); 3 a pool failure left no answer; 4 no such episode or store; "
    "5 the command failed while running (any other error: one line on stderr, the traceback with --debug); "
    "130 interrupted. Relative paths (--params, --checkpoint, --store, --out) are read from --root.")

app = typer.Typer(name="trinity", help=HELP, epilog=EXIT_CODES_HELP, no_args_is_help=True,
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


def fail(message: str, code: int = EXIT_USAGE):
    print(f"trinity: {message}", file=sys.stderr, flush=True)
    raise typer.Exit(code)


def in_root(root: Path, path: Path) -> Path:
    """A path option as given when absolute, else read from ROOT."""
    return path if path.is_absolute() else root.resolve() / path


def store_paths(root: Path, checkpoint: Path | None, store: Path | None) -> tuple[Path, Path]:
    from trinity.stages.paths import Paths

    p = Paths(root.resolve())
    return (in_root(root, checkpoint) if checkpoint else p.checkpoint.parent,
            in_root(root, store) if store else p.store)


def params_path(root: Path, params: Path) -> Path:
    return in_root(root, params)


def load_coordinator(root: Path, params: Path, checkpoint: Path | None, store: Path | None, *, writer: bool,
                      trace_retention_days: float | None = None):
    """Coordinator.load, with what fails while loading (params, checkpoint, a pool member's missing key, the encoder,
    a store another process writes) turned into exit code 2 and a one-line message."""
    from trinity.config import ConfigError
    from trinity.coordinator.policy import CheckpointError
    from trinity.serving.conversation import Coordinator
    from trinity.pool.errors import PoolConfigError

    ckpt, store_path = store_paths(root, checkpoint, store)
    try:
        return Coordinator.load(ckpt, params_path(root, params), store_path, writer=writer,
                                trace_retention_days=trace_retention_days)
    except (ConfigError, CheckpointError, PoolConfigError, FileNotFoundError, RuntimeError) as e:
        fail(str(e))


def apply_retry_failures(flag: bool) -> None:
    if flag:
        os.environ["TRINITY_RETRY_FAILURES"] = "1"  # read by every Store this process opens
