"""`trinity store export|import`: ship a store's responses and states as content-addressed segments, and load them
into another store (`trinity.store_segments`)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from trinity.cli.common import EXIT_NOT_FOUND, EXIT_USAGE, RootOpt, StoreOpt, fail, in_root, store_paths

store_app = typer.Typer(name="store", no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        rich_markup_mode=None, help="Ship a store's responses and states as content-addressed "
                        "segments (zstd Parquet), and load them into another store: a committed run's (replay/), or "
                        "a team's through DVC (docs/operations.md, \"Sharing a store\").")
SegmentsArg = Annotated[Path, typer.Argument(help="segment directory (relative: in ROOT), e.g. replay/default")]


@store_app.command("export")
def store_export(directory: SegmentsArg, store: StoreOpt = None, root: RootOpt = Path(".")) -> None:
    """Write every response (sample) and hidden state of the store that DIRECTORY's segments lack as new segments
    (one per kind, named by the SHA-256 of its bytes). Needs the store's writer lock only to read it consistently:
    run it when no pipeline writes the store."""
    from trinity.store import Store
    from trinity.store_segments import describe, export_segments

    _, store_path = store_paths(root, None, store)
    if not store_path.is_file():
        fail(f"no response store at {store_path} (run the pipeline first, or pass --store)", EXIT_NOT_FOUND)
    dest = in_root(root, directory)
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

    _, store_path = store_paths(root, None, store)
    src = in_root(root, directory)
    try:
        with Store(store_path) as st:
            counts = import_segments(st, src)
    except SegmentError as e:
        fail(str(e), EXIT_NOT_FOUND)
    except RuntimeError as e:  # another process writes the store
        fail(str(e), EXIT_USAGE)
    print(f"imported {counts} into {store_path} from {len(counts.files)} segment(s) of {src}")
