"""Supervision of one run: feed stdin, capture capped output, enforce the wall clock and the memory watchdog,
and kill the whole run (through the PID-namespace init's pidfd, or the process tree in weak mode)."""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from typing import Sequence

from trinity.grading.sandbox.common import SandboxResult
from trinity.grading.sandbox.limits import SandboxLimits


def _descendants(root_pid: int) -> list[int]:
    """root_pid and every process below it (via /proc/<pid>/task/<tid>/children)."""
    out, stack = [], [root_pid]
    seen = set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    stack += [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                pass
    return out


_PAGE = os.sysconf("SC_PAGE_SIZE")


def _rss_bytes(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * _PAGE
        except (OSError, ValueError, IndexError):
            pass
    return total


def _open_ns_init(info: bytes, bwrap_pid: int) -> int | None:
    """A pidfd for the namespace init that bwrap reported on --info-fd, once it is verifiably
    bwrap's child (so a reused pid can never be signalled)."""
    try:
        pid = int(json.loads(info.decode())["child-pid"])
    except (ValueError, KeyError, UnicodeDecodeError):
        return None
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            ppid = next((int(line.split()[1]) for line in f if line.startswith("PPid:")), -1)
    except OSError:
        ppid = -1
    if ppid != bwrap_pid:
        os.close(fd)
        return None
    return fd


def supervise(sb: SandboxLimits, argv: list[str], stdin: bytes, timeout: float, *, pass_fds: tuple[int, ...],
              info_r: int | None, info_w: int | None, bwrap: bool, env: dict[str, str] | None = None,
              cwd: str | None = None) -> SandboxResult:
    cap = sb.max_output_bytes
    # bubblewrap itself gets a minimal environment: its /proc/<pid>/environ is visible inside.
    outer_env = env if env is not None else {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    t0 = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=pass_fds,
            env=outer_env, cwd=cwd, start_new_session=True, close_fds=True,
        )
    finally:
        if info_w is not None:
            os.close(info_w)  # our copy; bwrap keeps its own
    ns_init: int | None = None  # a pidfd of the sandbox's PID-namespace init (immune to pid reuse)
    info_buf = b""
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    truncated = {"stdout": False, "stderr": False}
    killed_reason: str | None = None
    timed_out = False

    sel = selectors.DefaultSelector()
    assert proc.stdout and proc.stderr and proc.stdin
    for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
        os.set_blocking(pipe.fileno(), False)
        sel.register(pipe.fileno(), selectors.EVENT_READ, name)
    if info_r is not None:
        os.set_blocking(info_r, False)
        sel.register(info_r, selectors.EVENT_READ, "info")
    stdin_view = memoryview(stdin)
    if stdin_view:
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
    else:
        proc.stdin.close()

    def kill(reason: str) -> None:
        nonlocal killed_reason
        if killed_reason is None:
            killed_reason = reason
        if ns_init is not None:
            # SIGKILL to a PID namespace's init takes down every process of the namespace.
            try:
                signal.pidfd_send_signal(ns_init, signal.SIGKILL)
            except ProcessLookupError:
                pass
        else:
            # Weak mode / sandbox not started yet: everything still in the run's process tree.
            for pid in _descendants(proc.pid)[1:]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    deadline = t0 + timeout
    watch_from = t0 + 0.25
    next_watch = watch_from
    exited_at: float | None = None
    open_streams = 2
    while True:
        now = time.monotonic()
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if open_streams == 0 and (exited_at is not None or proc.poll() is not None):
            break
        if exited_at is not None and now - exited_at > 1.0:
            break  # something outside the sandbox's reach still holds our pipes (weak mode): stop reading
        if killed_reason is None and now >= deadline:
            timed_out = True
            kill("timeout")
        if killed_reason is None and sb.rss_limit_mb and now >= next_watch:
            next_watch = now + 0.1
            if _rss_bytes(_descendants(proc.pid)) > sb.rss_limit_mb << 20:
                kill("memory_limit")
        wait = 0.05 if killed_reason is not None else min(max(deadline - now, 0.0), 0.1)
        for key, _ in sel.select(timeout=wait):
            name = key.data
            if name == "stdin":
                try:
                    n = os.write(key.fd, stdin_view[:65536])
                    stdin_view = stdin_view[n:]
                except (BrokenPipeError, BlockingIOError, OSError) as e:
                    if isinstance(e, BlockingIOError):
                        continue
                    stdin_view = stdin_view[:0]
                if not stdin_view:
                    sel.unregister(key.fd)
                    proc.stdin.close()
                continue
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(key.fd)
                if name != "info":
                    open_streams -= 1
                continue
            if name == "info":
                info_buf += chunk
                if ns_init is None:
                    ns_init = _open_ns_init(info_buf, proc.pid)
                continue
            buf = bufs[name]
            room = cap - len(buf)
            if len(chunk) > room:
                buf += chunk[:max(room, 0)]
                truncated[name] = True
                if killed_reason is None:
                    kill("output_limit")
            else:
                buf += chunk
        if killed_reason is not None and proc.poll() is not None and now - (exited_at or now) > 0.5:
            break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        kill(killed_reason or "timeout")
        proc.wait()
    wall = time.monotonic() - t0
    sel.close()
    if ns_init is not None:
        os.close(ns_init)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        try:
            pipe.close()
        except OSError:
            pass

    rc = proc.returncode
    if bwrap and rc is not None and 128 < rc < 128 + 65:
        rc = -(rc - 128)  # bwrap's init reports a death by signal N as 128+N
    if killed_reason is None and rc is not None and rc < 0:
        killed_reason = {
            signal.SIGXCPU: "cpu_limit", signal.SIGXFSZ: "file_size_limit",
        }.get(-rc, f"signal {signal.Signals(-rc).name}" if -rc in signal.valid_signals() else f"signal {-rc}")
    if killed_reason is not None and rc == 0:
        rc = -signal.SIGKILL
    return SandboxResult(
        exit_code=rc if rc is not None else -signal.SIGKILL,
        stdout=bytes(bufs["stdout"]).decode("utf-8", "replace"),
        stderr=bytes(bufs["stderr"]).decode("utf-8", "replace"),
        timed_out=timed_out,
        killed_reason=killed_reason,
        wall_s=wall,
        stdout_truncated=truncated["stdout"],
        stderr_truncated=truncated["stderr"],
    )
