"""What graders call: `Sandbox` (limits and environment; `run`, `run_many`), `SandboxJob`, which mode runs
(bubblewrap, or the weak mode where it cannot start), and where the BigCodeBench sandbox venv lives."""
from __future__ import annotations

import logging
import os
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from trinity.env import env_flag
from trinity.grading.sandbox.bwrap import run_bwrap
from trinity.grading.sandbox.common import MAIN_FILE, SandboxResult, SandboxUnavailable
from trinity.grading.sandbox.limits import SandboxLimits
from trinity.grading.sandbox.weak import run_weak

log = logging.getLogger(__name__)

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
class Sandbox(SandboxLimits):
    """A sandboxed run's limits and environment (`SandboxLimits`: python, timeout_s, memory_mb, ...); `run` executes
    one program, `run_many` several."""

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
