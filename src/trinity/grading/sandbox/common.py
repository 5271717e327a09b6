"""What every part of the sandbox shares: the error, the result record, the sandbox's own paths."""
from __future__ import annotations

from dataclasses import dataclass

WORKDIR = "/sandbox"  # cwd and HOME inside the sandbox (a fresh tmpfs)
PRIVATE_TMPFS_ROOTS = ("/tmp", "/dev/shm", WORKDIR)  # each a fresh, size-capped tmpfs inside the sandbox


def in_private_tmpfs(path: str) -> bool:
    """Whether `path` lies strictly inside one of the sandbox's own tmpfs mounts (so a host directory at that
    path is hidden inside, and whatever the sandbox writes there never reaches the host)."""
    return any(path.startswith(t + "/") for t in PRIVATE_TMPFS_ROOTS)


MAIN_FILE = "main.py"


class SandboxUnavailable(RuntimeError):
    """bubblewrap cannot run here and the weak mode was not asked for."""


@dataclass(frozen=True)
class SandboxResult:
    """What one sandboxed run did.

    exit_code: the program's exit status (0-255); -N when it was killed by signal N (inside the
    sandbox bubblewrap reports a death by signal N as 128+N, which is mapped back to -N).
    killed_reason: None, or why the run was stopped or died: "timeout", "output_limit",
    "memory_limit", "cpu_limit", "file_size_limit", "signal <NAME>".
    """

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False
    killed_reason: str | None = None
    wall_s: float = 0.0
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def ok(self) -> bool:
        """Exited by itself with status 0."""
        return self.exit_code == 0 and not self.timed_out and self.killed_reason is None
