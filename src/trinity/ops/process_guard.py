"""No process outlives the run that started it, even when that run is SIGKILLed.

A flow run started as `python flows/<stage>.py` without PREFECT_API_URL makes Prefect start an ephemeral API
server (a uvicorn subprocess) that it stops at exit; a SIGKILL skips every exit handler, and the server then ran on,
orphaned (seen: 69 min). The same holds for whatever else a run starts (LocalCluster workers, the W&B service).

`guard_this_process()` marks this process's environment with a token (TRINITY_PROCESS_GUARD=<pid>:<random>) that
every process started from then on inherits, and starts a guardian: a small process of its own session, without
the token, that waits for this process to end (a pidfd: it wakes at the exit, whatever the cause) and then
SIGTERMs every process whose environment carries the token, SIGKILLs those left after a grace period, and exits.
Marking by environment rather than by parentage finds the processes that detached or were orphaned too, and
needs no record kept while the run lives; a process started with an environment of its own (not this one's
plus changes) is not covered. A normal exit costs nothing: Prefect has stopped its server by then, and the
guardian finds nothing to do. A run started by another guarded run (`dvc repro` of a pipeline flow) gets a
guardian of its own, which the outer guardian's SIGTERM leaves to clean up after it.

Why not PR_SET_PDEATHSIG on the server: it fires when the *thread* that started the child ends, and Prefect
starts its ephemeral server from whichever thread first needs the API, inside Prefect's own Popen call.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid

ENV = "TRINITY_PROCESS_GUARD"
GRACE_S = 5.0

_guardian: subprocess.Popen | None = None


def _start_time(pid: int) -> str | None:
    """The kernel's start time of a live process (field 22 of /proc/<pid>/stat), None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


def guard_this_process() -> str:
    """Start this process's guardian (once; see the module doc); returns the token its descendants carry."""
    global _guardian
    token = os.environ.get(ENV, "")
    if _guardian is not None and token.startswith(f"{os.getpid()}:"):
        return token
    token = f"{os.getpid()}:{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k != ENV}  # the guardian must not find itself
    _guardian = subprocess.Popen([sys.executable, os.path.abspath(__file__), token, _start_time(os.getpid())],
                                 env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    os.environ[ENV] = token  # inherited by every process started from now on
    return token


def marked(token: str) -> list[int]:
    """Live processes whose (initial) environment carries `token`."""
    needle = f"{ENV}={token}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0") and _start_time(int(entry)) is not None:
                    out.append(int(entry))
        except OSError:  # gone, or not ours
            pass
    return out


def _wait_for_exit(pid: int, start_time: str) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):
        fd = None
    if _start_time(pid) != start_time:  # gone before we watched (or the pid was reused)
        return
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has exited
        os.close(fd)
        return
    while _start_time(pid) == start_time:  # no pidfd (kernel < 5.3): poll
        time.sleep(0.2)


def _clean_up(token: str) -> list[int]:
    signalled: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 2.0)):
        for pid in marked(token):
            try:
                os.kill(pid, sig)
                signalled.add(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while marked(token) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not marked(token):
            break
    return sorted(signalled)


def _main(token: str, start_time: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the run; the guardian cleans up after it
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    _wait_for_exit(int(token.split(":")[0]), start_time)
    left = _clean_up(token)
    if left:
        print(f"[process-guard] run {token.split(':')[0]} ended; stopped the {len(left)} process(es) it left: "
              f"{left}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
