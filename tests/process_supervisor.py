"""Long-running processes for a test (a Prefect server, a worker) that never outlive it, even when the test is
SIGKILLed.

`Supervisor()` starts this file as a separate process that starts the test's processes on request. It is a
Linux *child subreaper* (prctl PR_SET_CHILD_SUBREAPER): every process they start, even one that detaches into
a session of its own (as a Prefect process worker does for each flow run, and `prefect server` for its
services), stays in its process tree instead of being adopted by init. When the test stops it, or when the
test dies — its end of the supervisor's stdin closes (EOF), and PR_SET_PDEATHSIG sends SIGTERM as well — the
supervisor SIGTERMs every descendant, SIGKILLs what is left after a grace period, reaps them all and exits.

Protocol, one JSON object a line on stdin, one reply a line on stdout:
  {"cmd": "start", "name": ..., "argv": [...], "env": {...}, "cwd": ..., "log": path} → {"pid": n}
  {"cmd": "descendants"}  → {"pids": [...]}  (live processes under the supervisor, zombies excluded)
  {"cmd": "stop"}  (or EOF)  → {"killed": [...]} then exit
"""
from __future__ import annotations

import ctypes
import json
import os
import selectors
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 8.0


# ---------------------------------------------------------------------------------------- the supervisor process
def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), fields[0]


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[1] != "Z":
                children.setdefault(st[0], []).append(int(entry))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _kill_all() -> list[int]:
    me = os.getpid()
    killed: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 5.0)):
        pids = descendants(me)
        for pid in pids:
            try:
                os.kill(pid, sig)
                killed.add(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            _reap()
            if not descendants(me):
                return sorted(killed)
            time.sleep(0.1)
    while descendants(me):  # SIGKILLed processes die: wait for the last ones and reap them
        _reap()
        time.sleep(0.1)
    return sorted(killed)


def _serve() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    stopping = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stopping.update(now=True))
    if os.getppid() == 1:  # the test died before the death signal was armed
        stopping["now"] = True
    sel = selectors.DefaultSelector()
    sel.register(sys.stdin, selectors.EVENT_READ)
    reply = None
    try:
        while not stopping["now"]:
            _reap()
            if not sel.select(timeout=0.5):
                continue
            line = sys.stdin.readline()
            if not line:
                break  # EOF: the test closed its end, or died
            req = json.loads(line)
            if req["cmd"] == "start":
                with open(req["log"], "ab") as log:
                    p = subprocess.Popen(req["argv"], env=req["env"], cwd=req.get("cwd"), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
                print(json.dumps({"pid": p.pid}), flush=True)
            elif req["cmd"] == "descendants":
                print(json.dumps({"pids": descendants(os.getpid())}), flush=True)
            elif req["cmd"] == "stop":
                reply = True
                break
    finally:
        killed = _kill_all()
        if reply:
            print(json.dumps({"killed": killed}), flush=True)


# ---------------------------------------------------------------------------------------- the test's side
class Supervisor:
    """Starts the supervisor process; `start()` runs a command under it; `stop()` (or leaving the `with` block)
    ends every process it started and everything they started."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.seen: set[int] = set()
        """Every descendant pid `descendants()` ever reported: what must be gone after stop()."""

    def _ask(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"process supervisor exited (rc={self.proc.poll()}) on {req['cmd']}")
        return json.loads(line)

    def start(self, name: str, argv: list[str], env: dict, cwd: str, log: str) -> int:
        pid = self._ask({"cmd": "start", "name": name, "argv": argv, "env": env, "cwd": cwd, "log": log})["pid"]
        self.seen.add(pid)
        return pid

    def descendants(self) -> list[int]:
        pids = self._ask({"cmd": "descendants"})["pids"]
        self.seen.update(pids)
        return pids

    def stop(self) -> list[int]:
        if self.proc.poll() is not None:
            return []
        try:
            killed = self._ask({"cmd": "stop"})["killed"]
        except (BrokenPipeError, RuntimeError):
            killed = []
        self.proc.wait(timeout=60)
        return killed

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def alive(pids) -> list[int]:
    """Those of `pids` still running (zombies count as gone)."""
    return [p for p in pids if (st := _stat(p)) is not None and st[1] != "Z"]


if __name__ == "__main__":
    _serve()
