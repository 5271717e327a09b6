"""What graders call: `Sandbox` (limits and environment; `run`, `run_many`), `SandboxJob`, which mode runs
(bubblewrap, or the weak mode where it cannot start), and where the BigCodeBench sandbox venv lives."""
from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from trinity.config import env_flag
from trinity.grading.sandbox.bwrap import run_bwrap
from trinity.grading.sandbox.common import MAIN_FILE, SandboxResult, SandboxUnavailable
from trinity.grading.sandbox.weak import run_weak

log = logging.getLogger(__name__)

_PASSTHROUGH_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`, Fedora: `dnf install bubblewrap`, "
    "Arch: `pacman -S bubblewrap`) and allow user namespaces (as a normal user: sysctl "
    "kernel.unprivileged_userns_clone=1 where that knob exists; in a container: run it with "
    "--privileged or a seccomp/apparmor profile that permits unshare). To run graded code anyway with "
    "rlimits only (no filesystem isolation), pass allow_weak=True or set TRINITY_SANDBOX_WEAK=1."
)


@dataclass(frozen=True)
class SandboxJob:
    """One program for `Sandbox.run_many`."""

    code: str
    stdin: str = ""
    timeout_s: float | None = None
    files: Mapping[str, str | bytes] | None = None


def _weak_requested() -> bool:
    return env_flag("TRINITY_SANDBOX_WEAK")


@dataclass(frozen=True)
class Sandbox:
    """Limits and environment of a sandboxed run; `run` executes one program, `run_many` several.

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

    # ------------------------------------------------------------------------------------------
    @property
    def interpreter(self) -> str:
        return self.python or sys.executable

    def mode(self) -> str:
        """'bwrap' (full sandbox) or 'weak'; raises SandboxUnavailable when neither is allowed."""
        ok, why = _bwrap_works(self.interpreter)
        if ok:
            return "bwrap"
        if self.allow_weak or _weak_requested():
            log.warning("bubblewrap unavailable (%s); running graded code in the WEAK sandbox", why)
            return "weak"
        raise SandboxUnavailable(f"bubblewrap cannot run here: {why}. To fix: {_INSTALL_HINT}")

    def run(
        self,
        code: str,
        stdin: str = "",
        timeout_s: float | None = None,
        files: Mapping[str, str | bytes] | None = None,
    ) -> SandboxResult:
        """Run `code` as the main program (`python main.py` in a fresh work dir) with `stdin`.

        `files` adds more files to the work dir (relative names)."""
        mode = self.mode()
        timeout = float(timeout_s if timeout_s is not None else self.timeout_s)
        all_files: dict[str, bytes] = {}
        for name, content in (files or {}).items():
            _check_relname(name)
            all_files[name] = content.encode() if isinstance(content, str) else bytes(content)
        all_files[MAIN_FILE] = code.encode("utf-8", "surrogateescape")
        if mode == "bwrap":
            return run_bwrap(self, all_files, stdin.encode("utf-8", "surrogateescape"), timeout)
        return run_weak(self, all_files, stdin.encode("utf-8", "surrogateescape"), timeout)

    def run_many(
        self, jobs: Iterable[SandboxJob | str], workers: int | None = None
    ) -> list[SandboxResult]:
        """Run several programs concurrently (default: one per core); results in input order."""
        items = [j if isinstance(j, SandboxJob) else SandboxJob(code=j) for j in jobs]
        if not items:
            return []
        self.mode()  # fail fast, once
        n = max(1, min(workers or os.cpu_count() or 1, len(items)))
        if n == 1:
            return [self.run(j.code, j.stdin, j.timeout_s, j.files) for j in items]
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="sandbox") as pool:
            return list(pool.map(lambda j: self.run(j.code, j.stdin, j.timeout_s, j.files), items))

    # ------------------------------------------------------------------------------------------
    def _cpu_limit(self, timeout: float) -> int:
        return int(self.cpu_s) if self.cpu_s is not None else int(timeout) + 1

    def _rlimit_args(self, timeout: float, extra_nproc: int = 0) -> list[str]:
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

    def _inner_env(self, workdir: str) -> dict[str, str]:
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


def _check_relname(name: str) -> None:
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ValueError(f"sandbox file names must be relative and stay in the work dir: {name!r}")


# ----------------------------------------------------------------------------------------------
# Availability: whether the full sandbox starts here

_probe_lock = threading.Lock()
_probe_cache: dict[str, tuple[bool, str]] = {}


def _bwrap_works(python: str) -> tuple[bool, str]:
    """Whether the full sandbox can start here (checked once per interpreter, by running it)."""
    with _probe_lock:
        if python in _probe_cache:
            return _probe_cache[python]
        if shutil.which("bwrap") is None:
            res = (False, "the `bwrap` executable is not on PATH")
        elif shutil.which("prlimit") is None or (os.geteuid() == 0 and shutil.which("setpriv") is None):
            res = (False, "util-linux's `prlimit`/`setpriv` are missing")
        else:
            try:
                probe = Sandbox(python=python, timeout_s=60)
                r = run_bwrap(probe, {MAIN_FILE: b"print('ok')\n"}, b"", 60.0)
                res = (True, "") if (r.exit_code == 0 and r.stdout.strip() == "ok") else (
                    False, f"probe run failed (exit {r.exit_code}): {r.stderr.strip()[-800:]}")
            except SandboxUnavailable as e:
                res = (False, str(e))
            except OSError as e:
                res = (False, f"cannot start bwrap: {e}")
        _probe_cache[python] = res
        return res


def default_sandbox_venv() -> Path:
    """Where scripts/setup_sandbox_env.sh puts the BigCodeBench environment."""
    if os.environ.get("TRINITY_SANDBOX_VENV"):
        return Path(os.environ["TRINITY_SANDBOX_VENV"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "trinity" / "sandbox-venv"


def sandbox_python(venv: str | os.PathLike | None = None) -> str | None:
    """The BigCodeBench sandbox venv's interpreter, or None when it has not been built."""
    root = Path(venv) if venv is not None else default_sandbox_venv()
    exe = root / "bin" / "python"
    return str(exe) if exe.exists() else None
