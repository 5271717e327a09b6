"""A sandboxed run's limits and environment (`SandboxLimits`): what the runners (bwrap.py, weak.py, supervision.py)
read. `api.Sandbox` adds running to them; the runners never import it."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

_PASSTHROUGH_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


@dataclass(frozen=True)
class SandboxLimits:
    """Limits and environment of a sandboxed run.

    python: the interpreter inside the sandbox (a venv's bin/python or a plain one); default the
    interpreter running this process (the project venv). Its venv and base installation are bound
    read-only at their own paths.
    """

    python: str | None = None
    timeout_s: float = 10.0  # wall clock, per run
    cpu_s: int | None = None  # RLIMIT_CPU per process; default: ceil(timeout) + 1
    memory_mb: int = 2048  # RLIMIT_AS per process (address space)
    rss_limit_mb: int | None = 2048  # all processes of the run together (watchdog); None: off
    max_procs: int = 64  # RLIMIT_NPROC: processes + threads of the sandbox uid
    max_file_mb: int = 64  # RLIMIT_FSIZE
    max_open_files: int = 256  # RLIMIT_NOFILE
    tmpfs_mb: int = 256  # size of the work dir (cwd, HOME); /tmp and /dev/shm get the same cap each
    max_output_bytes: int = 1 << 20  # per captured stream
    allow_weak: bool = False  # run without bubblewrap (weaker) instead of raising SandboxUnavailable
    env: tuple[tuple[str, str], ...] = ()  # extra environment variables inside the sandbox
    ro_binds: tuple[tuple[str, str], ...] = ()  # extra read-only binds: (host path, sandbox path)
    python_flags: tuple[str, ...] = ("-B", "-s")  # no bytecode writes, no user site-packages

    @property
    def interpreter(self) -> str:
        return self.python or sys.executable

    def _cpu_limit(self, timeout: float) -> int:
        return int(self.cpu_s) if self.cpu_s is not None else int(timeout) + 1

    def rlimit_args(self, timeout: float, extra_nproc: int = 0) -> list[str]:
        """prlimit's argv prefix that applies the per-process limits of a run of `timeout` seconds."""
        mb = 1 << 20
        return [
            "prlimit",
            # soft < hard: the soft limit sends SIGXCPU (reported as "cpu_limit"), the hard one SIGKILL
            f"--cpu={self._cpu_limit(timeout)}:{self._cpu_limit(timeout) + 1}",
            f"--as={self.memory_mb * mb}",
            f"--nproc={self.max_procs + extra_nproc}",
            f"--fsize={self.max_file_mb * mb}",
            f"--nofile={self.max_open_files}",
            "--core=0",
            "--",
        ]

    def inner_env(self, workdir: str) -> dict[str, str]:
        """The whole environment a sandboxed program sees (nothing of the host's but _PASSTHROUGH_ENV)."""
        py_bin = os.path.dirname(os.path.abspath(self.interpreter))
        env = {
            "PATH": f"{py_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": "/tmp",
            "USER": "sandbox",
            "LOGNAME": "sandbox",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONIOENCODING": "utf-8",
            "MPLBACKEND": "Agg",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "NUMEXPR_MAX_THREADS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "3",
            # glibc reserves 64 MB of address space per malloc arena (one per thread, up to 8 per
            # core): under RLIMIT_AS that would fail threaded programs that use little memory.
            "MALLOC_ARENA_MAX": "2",
        }
        for k in _PASSTHROUGH_ENV:
            if k in os.environ:
                env[k] = os.environ[k]
        env.update(dict(self.env))
        return env
