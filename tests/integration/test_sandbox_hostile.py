"""Hostile programs against the real sandbox.

Each program is graded as the answer to a tiny HumanEval-style task (`add(a, b)`) through
`grade_code`, and each is written so that it would *earn the point if its attack worked*: it
defines a correct `add` only after it got what it was after (a connection, a secret, a host file,
a privilege), or only after it outran a limit. So "graded 0.0" is itself evidence of containment.
Then the host is checked: no process of the run survives (every sandbox process carries a token in
its environment), the test process and a sentinel process are
alive, the listener on the host saw nothing, host files are untouched.

Network attempts stay on this machine: the "external" connect and the DNS lookup run only after
the program has checked that its namespace has no interface but loopback, so no packet can leave.
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from trinity.grading.code import grade_code_detail
from trinity.grading.sandbox import Sandbox, in_private_tmpfs
from trinity.records import Task

PROJECT = Path(__file__).resolve().parents[2]
TOKEN = "TRINITY_HOSTILE_" + secrets.token_hex(6)
FAKE_SECRET = "sk-fake-" + secrets.token_hex(12)

TASK = Task(
    id="hostile/add",
    source="humaneval",
    prompt=("Write add(a, b).",),
    grader="code",
    tests="def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
    metadata={"entry_point": "add", "function_prompt": 'def add(a, b):\n    """Return a + b."""\n',
              "test_format": "humaneval"},
)

ADD = "\ndef add(a, b):\n    return a + b\n"

# Guard used before any non-loopback network attempt: abort unless only "lo" exists.
ONLY_LOOPBACK = textwrap.dedent("""
    import socket as _s
    _ifs = sorted(n for _, n in _s.if_nameindex())
    if _ifs != ["lo"]:
        raise SystemExit("NOT ISOLATED: interfaces %r" % (_ifs,))
""")


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    sb = Sandbox(
        timeout_s=4, memory_mb=512, rss_limit_mb=768, max_procs=32, tmpfs_mb=64, max_file_mb=16,
        max_output_bytes=64 * 1024, env=((TOKEN, "1"),),
    )
    sb.mode()
    return sb


@pytest.fixture(scope="module")
def sentinel():
    """A host process the sandbox must not be able to kill."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield p
    p.kill()
    p.wait()


def _sandbox_leftovers() -> list[str]:
    """Processes of this suite's sandbox runs: every one carries the token in its environment.
    (Not "any process of a sandbox uid": other sandboxes, e.g. a grading run, may be running.)"""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = f.read()
            uid = os.stat(f"/proc/{d}").st_uid
        except OSError:
            continue
        if TOKEN.encode() in env:
            try:
                cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ")[:80]
            except OSError:
                cmd = b"?"
            found.append(f"{d}: uid {uid} {cmd!r}")
    return found


def _wait_no_leftovers(timeout: float = 5.0) -> list[str]:
    end = time.monotonic() + timeout
    left = _sandbox_leftovers()
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = _sandbox_leftovers()
    return left


@pytest.fixture
def host_ok(sentinel):
    """After each hostile run: nothing of it survives, the sentinel and this process are fine."""
    yield
    assert _wait_no_leftovers() == []
    assert sentinel.poll() is None, "the sentinel process was killed"
    assert os.getpid() > 0 and Path("/proc/self").exists()


def grade(sandbox: Sandbox, code: str):
    return grade_code_detail(TASK, f"```python\n{code}\n```", sandbox=sandbox)


class Listener:
    """A TCP (or UDP) server on the host's loopback that records whatever reaches it."""

    def __init__(self, kind=socket.SOCK_STREAM):
        self.sock = socket.socket(socket.AF_INET, kind)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.kind = kind
        self.hits: list[object] = []
        if kind == socket.SOCK_STREAM:
            self.sock.listen(8)
        self.sock.settimeout(0.2)
        self._stop = False
        self._t = threading.Thread(target=self._loop, daemon=True)
        self._t.start()

    def _loop(self):
        while not self._stop:
            try:
                if self.kind == socket.SOCK_STREAM:
                    conn, addr = self.sock.accept()
                    self.hits.append(addr)
                    conn.close()
                else:
                    self.hits.append(self.sock.recvfrom(4096))
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return

    def close(self):
        self._stop = True
        self._t.join(2)
        self.sock.close()


# ------------------------------------------------------------------------------------------------
# Resource exhaustion


def test_fork_bomb(sandbox, host_ok):
    code = textwrap.dedent("""
        import os
        n = 0
        while n < 100000:
            try:
                if os.fork() == 0:
                    continue
                n += 1
            except OSError:
                pass
    """) + ADD
    v = grade(sandbox, code)
    assert not v.passed


def test_memory_bomb(sandbox, host_ok):
    code = "chunks = []\nfor _ in range(64):\n    chunks.append(bytearray(b'x' * (256 << 20)))\n" + ADD
    v = grade(sandbox, code)
    assert not v.passed and "MemoryError" in v.reason


def test_memory_spread_over_processes(sandbox, host_ok):
    # 12 processes × 400 MB, each under the per-process address-space limit: the watchdog must act.
    code = textwrap.dedent("""
        import os, time
        kids = []
        for _ in range(12):
            pid = os.fork()
            if pid == 0:
                blob = b"y" * (400 << 20)
                time.sleep(30)
                os._exit(0)
            kids.append(pid)
        for pid in kids:
            os.waitpid(pid, 0)
    """) + ADD
    r = sandbox.run(code, timeout_s=20)
    assert r.killed_reason == "memory_limit" and not r.ok
    assert not grade(sandbox, code).passed


def test_infinite_loop(sandbox, host_ok):
    v = grade(sandbox, "while True:\n    pass\n" + ADD)
    assert not v.passed and "timeout" in v.reason


def test_busy_threads(sandbox, host_ok):
    code = textwrap.dedent("""
        import threading
        def spin():
            while True:
                pass
        for _ in range(16):
            threading.Thread(target=spin, daemon=True).start()
        import time
        time.sleep(60)
    """) + ADD
    v = grade(sandbox, code)
    # Stopped by the CPU/wall limits, or earlier by the address-space limit (thread stacks and
    # malloc arenas): either way it earns nothing.
    assert not v.passed


def test_sleeping_forever_hits_wall_clock(sandbox, host_ok):
    t0 = time.monotonic()
    v = grade(sandbox, "import time\ntime.sleep(3600)\n" + ADD)
    assert not v.passed and "timeout" in v.reason
    assert time.monotonic() - t0 < 15


def test_huge_stdout(sandbox, host_ok):
    # Straight to fd 1, past the harness's swallowed sys.stdout.
    code = "import os\nfor _ in range(100000):\n    os.write(1, b'z' * 65536)\n" + ADD
    v = grade(sandbox, code)
    assert not v.passed and "output_limit" in v.reason
    r = sandbox.run("import os\nwhile True:\n    os.write(1, b'z' * 65536)")
    assert r.killed_reason == "output_limit" and len(r.stdout) <= 64 * 1024


def test_fill_tmp(sandbox, host_ok):
    code = textwrap.dedent("""
        import os
        total = 0
        for i in range(10000):
            with open(f"/tmp/fill{i}", "wb") as f:
                f.write(b"0" * (8 << 20))
            total += 8 << 20
        assert total > (1 << 30)
    """) + ADD
    v = grade(sandbox, code)
    assert not v.passed and ("No space left" in v.reason or "Errno 28" in v.reason)


def test_dev_shm_abuse(sandbox, host_ok):
    code = textwrap.dedent("""
        from multiprocessing import shared_memory
        segs = []
        for i in range(128):   # 1 GB in 8 MB segments: each under the file-size limit, together over /dev/shm's cap
            s = shared_memory.SharedMemory(create=True, size=8 << 20)
            s.buf[:] = b"1" * (8 << 20)
            segs.append(s)
    """) + ADD
    v = grade(sandbox, code)
    assert not v.passed and ("SIGBUS" in v.reason or "No space left" in v.reason), v.reason


def test_many_open_files(sandbox, host_ok):
    code = "fs = [open('/dev/null') for _ in range(100000)]\n" + ADD
    v = grade(sandbox, code)
    assert not v.passed and "Too many open files" in v.reason


def test_big_file(sandbox, host_ok):
    code = "open('big.bin', 'wb').write(b'0' * (64 << 20))\n" + ADD
    assert not grade(sandbox, code).passed


# ------------------------------------------------------------------------------------------------
# Network


def test_connect_to_host_loopback_listener(sandbox, host_ok):
    lis = Listener()
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {lis.port}), timeout=2).close()\n" + ADD
        v = grade(sandbox, code)
        assert not v.passed and "Connection refused" in v.reason
        time.sleep(0.3)
        assert lis.hits == []
    finally:
        lis.close()


def test_udp_to_host_loopback(sandbox, host_ok):
    lis = Listener(socket.SOCK_DGRAM)
    try:
        code = f"import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'leak', ('127.0.0.1', {lis.port}))\n"
        r = sandbox.run(code)
        time.sleep(0.3)
        assert lis.hits == [], r.stderr
        assert not grade(sandbox, code + "raise SystemExit(0)\n" + ADD).passed
    finally:
        lis.close()


def test_connect_to_external_ip_is_unreachable(sandbox, host_ok):
    # 192.0.2.1 is TEST-NET-1; the guard makes sure nothing could leave the namespace anyway.
    code = ONLY_LOOPBACK + "import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=2).close()\n" + ADD
    v = grade(sandbox, code)
    assert not v.passed and "NOT ISOLATED" not in v.reason
    assert "unreachable" in v.reason.lower()


def test_dns_lookup_fails(sandbox, host_ok):
    code = ONLY_LOOPBACK + "import socket\nprint(socket.getaddrinfo('pypi.org', 443))\n" + ADD
    v = grade(sandbox, code)
    assert not v.passed and "NOT ISOLATED" not in v.reason and "gaierror" in v.reason


def test_no_unix_socket_to_host(sandbox, host_ok, tmp_path):
    path = tmp_path / "host.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    try:
        code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\n" + ADD
        assert not grade(sandbox, code).passed
    finally:
        srv.close()


# ------------------------------------------------------------------------------------------------
# Filesystem


def test_write_outside_the_sandbox(sandbox, host_ok):
    marker = f"/tmp/{TOKEN}-written"
    proj = PROJECT / f"{TOKEN}-written"
    targets = [f"/etc/{TOKEN}", f"/usr/{TOKEN}", f"/{TOKEN}", f"/root/{TOKEN}", "/proc/sys/kernel/hostname",
               "/proc/sysrq-trigger"]
    # A project under /tmp (a clone in a mktemp dir) shows inside as directories in the sandbox's own /tmp
    # tmpfs, so a write there succeeds but stays inside, like `marker`; only the host-side check applies.
    if not in_private_tmpfs(str(PROJECT)):
        targets.append(str(proj))
    code = textwrap.dedent(f"""
        wrote = []
        for p in {targets!r}:
            try:
                with open(p, "w") as f:
                    f.write("x")
                wrote.append(p)
            except OSError:
                pass
        with open({marker!r}, "w") as f:   # lands in the sandbox's own /tmp
            f.write("inside")
        if wrote:
    """) + textwrap.indent(ADD, "    ")
    assert not grade(sandbox, code).passed
    assert not Path(marker).exists() and not proj.exists()
    assert not Path(f"/etc/{TOKEN}").exists()


def test_read_ssh_keys_and_host_home(sandbox, host_ok):
    code = textwrap.dedent("""
        import os, glob
        found = []
        for p in ["/root/.ssh", os.path.expanduser("~root/.ssh"), "/home", "/root/.bash_history",
                  "/root/.cache", "/etc/shadow", "/etc/ssh"]:
            if os.path.exists(p):
                found.append(p)
        found += glob.glob("/home/*/.ssh/*")
        if found:
    """) + textwrap.indent(ADD, "    ")
    assert not grade(sandbox, code).passed


def test_read_planted_host_file(sandbox, host_ok, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text(FAKE_SECRET)
    secret.chmod(0o644)
    code = f"data = open({str(secret)!r}).read()\n" + ADD
    v = grade(sandbox, code)
    assert not v.passed and "No such file" in v.reason and FAKE_SECRET not in v.reason


def test_read_project_tree_and_store(sandbox, host_ok):
    code = textwrap.dedent(f"""
        import os
        seen = []
        for p in [{str(PROJECT / "data")!r}, {str(PROJECT / "pyproject.toml")!r}, {str(PROJECT / "src")!r},
                  {str(PROJECT / ".git")!r}, "/work/shared", {str(PROJECT.parent)!r} + "/shared"]:
            if os.path.exists(p):
                seen.append(p)
        if seen:
    """) + textwrap.indent(ADD, "    ")
    assert not grade(sandbox, code).passed


def test_env_secret_of_parent(sandbox, host_ok, monkeypatch):
    monkeypatch.setenv("TRINITY_API_KEY", FAKE_SECRET)
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_SECRET)
    code = textwrap.dedent(f"""
        import os, glob
        blob = repr(dict(os.environ))
        for p in glob.glob("/proc/*/environ"):
            try:
                blob += open(p, "rb").read().decode("latin-1")
            except OSError:
                pass
        print(blob)
        if {FAKE_SECRET!r} in blob:
    """) + textwrap.indent(ADD, "    ")
    v = grade(sandbox, code)
    assert not v.passed and FAKE_SECRET not in v.reason
    r = sandbox.run(code)
    assert FAKE_SECRET not in r.stdout + r.stderr


def test_host_proc_is_invisible(sandbox, host_ok):
    me = os.getpid()
    code = textwrap.dedent(f"""
        import os
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        cmdlines = b""
        for p in pids:
            try:
                cmdlines += open(f"/proc/{{p}}/cmdline", "rb").read()
            except OSError:
                pass
        if {me} in pids or b"pytest" in cmdlines or len(pids) > 20:
    """) + textwrap.indent(ADD, "    ")
    assert not grade(sandbox, code).passed


def test_symlink_escapes(sandbox, host_ok):
    # Only the interpreter's own directories are bound (read-only, at their host paths); no link
    # leads to anything else of the host.
    code = textwrap.dedent(f"""
        import os
        os.symlink("/root", "r")
        os.symlink("/proc/1/root", "p1")
        os.symlink("../../../../../../../..{PROJECT}", "proj")
        leaked = []
        for p in ["r/.ssh", "r/.cache", "r/.bash_history", "p1/root/.ssh", "p1/etc/shadow", "proj/data", "proj/src",
                  "proj/pyproject.toml", "proj/.git", "/proc/self/root{PROJECT}/data", "/proc/1/root/etc/shadow",
                  "/proc/1/cwd/data", "/proc/self/cwd/../../root/.ssh"]:
            if os.path.lexists(p):
                try:
                    os.listdir(p) if os.path.isdir(p) else open(p).read()
                    leaked.append(p)
                except OSError:
                    pass
        print(leaked)
        if leaked:
    """) + textwrap.indent(ADD, "    ")
    assert not grade(sandbox, code).passed
    r = sandbox.run(code)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr
    # What of /root and the project directory exists inside at all: the interpreter's path, nothing else.
    r = sandbox.run(f"import os\nprint(os.listdir('/root'), os.listdir({str(PROJECT)!r}) "
                    f"if os.path.isdir({str(PROJECT)!r}) else [])")
    root_names, proj_names = r.stdout.strip().split("] [")
    # /root holds only the first step of the interpreter's own paths (pyenv's, the venv's: the checkout may lie under
    # /root, e.g. a CI clone in /root/<dir>), each bound read-only at its host path
    interpreter = {Path(d).resolve() for d in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    steps = {d.relative_to("/root").parts[0] for d in interpreter if d.is_relative_to("/root") and d != Path("/root")}
    assert set(eval(root_names + "]")) <= {".pyenv", ".cache", ".local"} | steps
    assert set(eval("[" + proj_names)) <= {".venv", "venv"}


# ------------------------------------------------------------------------------------------------
# Processes, privileges, the kernel


def test_kill_parent(sandbox, host_ok):
    code = textwrap.dedent("""
        import os, signal
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(os.getppid(), sig)
            except OSError:
                pass
        import time
        time.sleep(0.5)
    """)
    assert not grade(sandbox, code).passed  # no add(): the run itself must just fail
    assert not grade(sandbox, code + "raise SystemExit(0)\n" + ADD).passed


def test_kill_everything(sandbox, host_ok):
    code = "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n" + ADD
    grade(sandbox, code)  # may pass or fail: it only killed its own namespace
    r = sandbox.run("import subprocess\nsubprocess.run(['kill', '-9', '-1'])\n")
    assert r.exit_code is not None  # returned; the host fixture checks the sentinel and this process


def test_daemon_outliving_the_timeout(sandbox, host_ok):
    code = textwrap.dedent("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                for fd in (0, 1, 2):
                    os.close(fd)
                while True:
                    time.sleep(1)
            os._exit(0)
        time.sleep(60)
    """)
    t0 = time.monotonic()
    v = grade(sandbox, code)
    assert not v.passed and time.monotonic() - t0 < 15
    # And a daemon left behind by a program that exits normally:
    r = sandbox.run(code.replace("time.sleep(60)", "print('parent done')"))
    assert r.ok and r.stdout.strip() == "parent done"


def test_ctypes_namespaces_mount_and_friends(sandbox, host_ok):
    code = textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        got = []
        if libc.unshare(0x10000000) == 0:                     # CLONE_NEWUSER
            got.append("userns")
        if libc.unshare(0x00020000) == 0:                     # CLONE_NEWNS
            got.append("mountns")
        if libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0:
            got.append("mount")
        if libc.syscall(250, 0, 0, 0, 0, 0) >= 0:             # keyctl
            got.append("keyctl")
        if libc.syscall(321, 0, 0, 0) >= 0:                   # bpf
            got.append("bpf")
        if libc.syscall(101, 16, 1, 0, 0) == 0:               # ptrace(PTRACE_ATTACH, 1)
            got.append("ptrace")
        if libc.syscall(425, 8, 0) >= 0:                      # io_uring_setup
            got.append("io_uring")
        print(got)
        if got:
    """) + textwrap.indent(ADD, "    ")
    v = grade(sandbox, code)
    assert not v.passed
    r = sandbox.run(code)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_privilege_escalation(sandbox, host_ok):
    code = textwrap.dedent("""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        ok = []
        for name, f in (("setuid", lambda: os.setuid(0)), ("setgid", lambda: os.setgid(0)),
                        ("chroot", lambda: os.chroot("/tmp")), ("nice", lambda: os.nice(-10)),
                        ("setgroups", lambda: os.setgroups([0]))):
            try:
                f()
                ok.append(name)
            except OSError:
                pass
        if libc.sethostname(b"pwned", 5) == 0:
            ok.append("sethostname")
        caps = [l for l in open("/proc/self/status") if l.startswith(("CapEff", "CapPrm", "CapBnd", "CapAmb"))]
        ok += [l.split(":")[0] for l in caps if int(l.split()[1], 16)]
        print(ok)
        if ok:
    """) + textwrap.indent(ADD, "    ")
    assert not grade(sandbox, code).passed
    r = sandbox.run(code)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_ctypes_crash(sandbox, host_ok):
    v = grade(sandbox, "import ctypes\nctypes.string_at(0)\n" + ADD)
    assert not v.passed and "SIGSEGV" in v.reason


# ------------------------------------------------------------------------------------------------
# Cheating the grader


def test_early_exit_zero(sandbox, host_ok):
    for stop in ("import sys\nsys.exit(0)\n", "import os\nos._exit(0)\n", "raise SystemExit\n",
                 "exit()\n"):
        assert not grade(sandbox, stop + ADD.replace("a + b", "a - b")).passed


def test_forged_pass_marker(sandbox, host_ok):
    code = textwrap.dedent("""
        import os, sys
        from trinity_guess import *  # noqa  (will not exist)
    """)
    assert not grade(sandbox, code).passed
    code = ("import os\nos.write(1, b'\\nTRINITY-TESTS-PASSED 00000000000000000000000000000000\\n')\n"
            "os._exit(0)\n")
    assert not grade(sandbox, code).passed


def test_reading_the_tests_gives_nothing(sandbox, host_ok):
    # The tests arrive on stdin and are consumed before the model's code runs; nothing on disk holds them.
    code = textwrap.dedent("""
        import os, sys
        found = sys.stdin.read()
        for root, _, files in os.walk("/sandbox"):
            for f in files:
                found += open(os.path.join(root, f)).read()
        if "candidate(2, 3) == 5" in found:
    """) + textwrap.indent(ADD, "    ")
    assert not grade(sandbox, code).passed


def test_host_still_healthy_after_the_suite(sentinel):
    assert sentinel.poll() is None
    assert _wait_no_leftovers() == []
    # The machine still runs a sandbox normally.
    r = Sandbox().run("print(sum(range(10)))")
    assert r.ok and r.stdout.strip() == "45"
    assert os.kill(os.getpid(), 0) is None
    assert signal.getsignal(signal.SIGTERM) is not None
