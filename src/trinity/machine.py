"""What a reported figure must name besides its params: the commit it ran at and the kind of CPU (bf16-capable or
not). Standard library only; read by the benches and by the run records (scripts/keep_profile.py)."""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
"""The checkout this package runs from (an editable install: the project's root)."""


def cpu_kind() -> str:
    """'<model name>, <n> cores, bf16-capable | no native bf16' of this machine."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in flags.splitlines() if ln.startswith("model name")), "?")
        bf16 = "avx512_bf16" in flags or "amx_bf16" in flags
    except OSError:
        model, bf16 = platform.processor() or "?", False
    return f"{model}, {os.cpu_count()} cores, {'bf16-capable' if bf16 else 'no native bf16'}"


def commit(root: Path | None = None) -> str:
    """The short commit `root` (default: this checkout) is at, or 'unknown' outside a git checkout."""
    try:
        return subprocess.run(["git", "-C", str(root or CHECKOUT), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
