"""The weak mode, where bubblewrap cannot run and the caller opted in: rlimits, a scrubbed environment, a
temporary cwd, a kill of every process that carries the run's token; as root also `unshare` of the
namespaces and the drop to a fresh uid. It does not hide the host's files from the code."""
from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import tempfile
from pathlib import Path

from trinity.grading.sandbox.bwrap import fresh_uid, python_layout
from trinity.grading.sandbox.common import MAIN_FILE, SandboxResult
from trinity.grading.sandbox.limits import SandboxLimits
from trinity.grading.sandbox.supervision import supervise

log = logging.getLogger(__name__)


def run_weak(sb: SandboxLimits, files: dict[str, bytes], stdin: bytes, timeout: float) -> SandboxResult:
    as_root = os.geteuid() == 0
    workdir = tempfile.mkdtemp(prefix="trinity-sandbox-")
    try:
        os.chmod(workdir, 0o1777 if as_root else 0o700)
        for name, data in files.items():
            p = Path(workdir, name)
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
            p.chmod(0o644)
        exe = os.path.abspath(sb.interpreter)
        argv: list[str] = []
        extra_nproc = 0
        if as_root and shutil.which("unshare"):
            argv += ["unshare", "--net", "--ipc", "--uts", "--pid", "--fork", "--kill-child", "--mount",
                     "--mount-proc", "--"]
            if shutil.which("setpriv") and all(_world_usable(d) for d in python_layout(exe)[0] + (exe,)):
                uid = fresh_uid()
                argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
            else:
                log.warning("weak sandbox: %s is not usable by an unprivileged uid; the code runs as root", exe)
        else:
            # RLIMIT_NPROC counts every process of this uid: leave room for the ones already running.
            extra_nproc = _count_own_processes()
        env = sb.inner_env(workdir)
        # Without a PID namespace a daemon can leave the process group; the run's token in the
        # environment finds it afterwards (unless the code scrubs its own environment: weak mode).
        token = secrets.token_hex(16)
        env["TRINITY_SANDBOX_RUN"] = token
        argv += sb.rlimit_args(timeout, extra_nproc) + [exe, *sb.python_flags, MAIN_FILE]
        try:
            return supervise(sb, argv, stdin, timeout, pass_fds=(), info_r=None, info_w=None, bwrap=False,
                             env=env, cwd=workdir)
        finally:
            _kill_tagged(token)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_tagged(token: str) -> None:
    """SIGKILL every process whose environment carries TRINITY_SANDBOX_RUN=<token>."""
    needle = f"TRINITY_SANDBOX_RUN={token}".encode()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            fd = os.pidfd_open(int(d))
        except OSError:
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle in f.read():
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(fd)


def _world_usable(path: str) -> bool:
    """Whether any uid can reach `path` (search permission on every ancestor) and read/execute it."""
    p = Path(os.path.realpath(path))
    try:
        for anc in reversed(p.parents):
            if not os.stat(anc).st_mode & 0o001:
                return False
        return bool(os.stat(p).st_mode & 0o005)
    except OSError:
        return False


def _count_own_processes() -> int:
    uid = os.getuid()
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n
