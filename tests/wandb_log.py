"""A test-side reader of W&B's transaction log (`run-<id>.wandb`): what W&B itself wrote for a run, to check the
project's own records (`trinity.ops.tracking.RUN_FILE`, the lineage and tables) against. The product never reads
this format (no public reader exists in wandb 0.31); only the tests do, as an independent witness."""
from __future__ import annotations

import struct
from pathlib import Path


def read_records(run_file: Path) -> list:
    """The protobuf records (`wandb_internal_pb2.Record`) of a run's transaction log: a LevelDB-style log of 32 KiB
    blocks of (crc, length, type) chunks after a 7-byte header."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(run_file).read_bytes()
    assert data[:4] == b":W&B", f"{run_file} is not a W&B transaction log"
    out, pos, buf, block = [], 7, b"", 32768
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        pos += 7
        if kind == 0:  # block padding
            pos += room - 7
            continue
        chunk, pos = data[pos:pos + length], pos + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):  # full / last chunk: a record is complete
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
    return out
