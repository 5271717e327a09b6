"""The sandbox's ordinary behaviour: output, stdin, exit codes, limits, environment, parallel runs,
the clear error where bubblewrap cannot run, the weak mode, and the unprivileged (user namespace)
mode. Hostile programs are in test_sandbox_hostile.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trinity.grading.sandbox import api as sbmod  # the availability probe and its cache live here
from trinity.grading.sandbox import Sandbox, SandboxJob, SandboxUnavailable, seccomp_filter

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def sb() -> Sandbox:
    s = Sandbox(timeout_s=20, max_output_bytes=256 * 1024)
    s.mode()  # fails the module's tests clearly when bubblewrap is missing
    return s


def test_prints_and_exits_zero(sb):
    r = sb.run("print('hello'); import sys; print('err', file=sys.stderr)")
    assert r.ok and r.exit_code == 0
    assert r.stdout == "hello\n" and r.stderr == "err\n"
    assert not r.timed_out and r.killed_reason is None and r.wall_s > 0


def test_stdin_is_fed(sb):
    data = "".join(f"{i}\n" for i in range(20000))  # larger than a pipe buffer
    r = sb.run("import sys; xs = [int(l) for l in sys.stdin]; print(len(xs), sum(xs))", stdin=data)
    assert r.ok, r.stderr
    assert r.stdout.split() == ["20000", str(sum(range(20000)))]


def test_exit_codes_and_exceptions(sb):
    assert sb.run("import sys; sys.exit(7)").exit_code == 7
    r = sb.run("raise ValueError('boom')")
    assert r.exit_code == 1 and "ValueError: boom" in r.stderr and not r.ok
    r = sb.run("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert r.exit_code == -11 and r.killed_reason == "signal SIGSEGV"


def test_wall_clock_timeout(sb):
    r = sb.run("import time; print('start', flush=True); time.sleep(60)", timeout_s=1.0)
    assert r.timed_out and r.killed_reason == "timeout" and not r.ok
    assert r.stdout == "start\n"
    assert r.wall_s < 10


def test_cpu_limit():
    r = Sandbox(timeout_s=30, cpu_s=1).run("while True: pass")
    assert r.killed_reason == "cpu_limit" and not r.timed_out


def test_output_is_capped():
    r = Sandbox(timeout_s=20, max_output_bytes=10_000).run("import sys\nwhile True: sys.stdout.write('x' * 4096)")
    assert r.killed_reason == "output_limit" and r.stdout_truncated
    assert len(r.stdout) == 10_000


def test_file_size_limit():
    r = Sandbox(max_file_mb=1).run("open('big', 'wb').write(b'x' * (4 << 20))")
    assert r.exit_code != 0 and "File too large" in r.stderr


def test_workdir_home_tmp_are_writable_and_files_arrive(sb):
    code = textwrap.dedent("""
        import os
        print(os.getcwd(), os.environ["HOME"])
        open("a.txt", "w").write("1")
        open(os.path.expanduser("~/b.txt"), "w").write("2")
        open("/tmp/c.txt", "w").write("3")
        print(open("data/input.txt").read())
    """)
    r = sb.run(code, files={"data/input.txt": "payload"})
    assert r.ok, r.stderr
    assert r.stdout.split() == ["/sandbox", "/sandbox", "payload"]


def test_project_interpreter_and_packages_available(sb):
    r = sb.run("import sys, numpy; print(sys.executable); print(numpy.arange(4).sum())")
    assert r.ok, r.stderr
    assert r.stdout.split()[-1] == "6"


def test_environment_is_scrubbed(sb, monkeypatch):
    monkeypatch.setenv("TRINITY_SECRET_FOR_TEST", "hunter2")
    r = sb.run("import os, json; print(json.dumps(dict(os.environ)))")
    env = json.loads(r.stdout)
    assert "TRINITY_SECRET_FOR_TEST" not in env and "hunter2" not in r.stdout
    assert env["HOME"] == "/sandbox" and env["TMPDIR"] == "/tmp"


def test_extra_env_and_ro_binds(tmp_path):
    (tmp_path / "seed.txt").write_text("seeded")
    s = Sandbox(env=(("MY_SETTING", "42"),), ro_binds=((str(tmp_path / "seed.txt"), "/tmp/cache/seed.txt"),))
    r = s.run("import os; print(os.environ['MY_SETTING'], open('/tmp/cache/seed.txt').read());"
              "open('/tmp/cache/new', 'w').write('w')")  # the seeded directory stays writable
    assert r.ok, r.stderr
    assert r.stdout.split() == ["42", "seeded"]


def test_run_many_keeps_order(sb):
    jobs = [SandboxJob(code=f"print({i} * {i})") for i in range(6)] + ["print('plain string job')"]
    results = sb.run_many(jobs, workers=2)
    assert [r.stdout.strip() for r in results] == [str(i * i) for i in range(6)] + ["plain string job"]
    assert all(r.ok for r in results)


def test_seccomp_filter_is_well_formed():
    f = seccomp_filter()
    if f is None:
        pytest.skip("seccomp filter is written for x86-64 only")
    assert len(f) % 8 == 0 and 10 < len(f) // 8 < 256


def test_missing_bubblewrap_raises_clear_error(monkeypatch):
    monkeypatch.setattr(sbmod, "_probe_cache", {})
    real_which = shutil.which
    monkeypatch.setattr(sbmod.shutil, "which", lambda name, *a, **k: None if name == "bwrap" else real_which(name))
    monkeypatch.delenv("TRINITY_SANDBOX_WEAK", raising=False)
    with pytest.raises(SandboxUnavailable, match="install bubblewrap"):
        Sandbox().run("print(1)")
    # Opting into the weak mode runs the code anyway (rlimits, scrubbed env, temp cwd).
    r = Sandbox(allow_weak=True, timeout_s=20).run("import os; print('weak', os.getcwd() != '/sandbox')")
    assert r.ok and r.stdout.split() == ["weak", "True"], r.stderr
    monkeypatch.setenv("TRINITY_SANDBOX_WEAK", "1")
    assert Sandbox().mode() == "weak"
    r = Sandbox(timeout_s=1).run("import time; time.sleep(30)")
    assert r.timed_out
    # A daemon that left the process group is found by the run's token and killed.
    mark = f"weak-daemon-{os.getpid()}-{time.time_ns()}"
    r = Sandbox(timeout_s=5, env=(("TEST_MARK", mark),)).run(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nelse:\n    time.sleep(0.3)")
    assert r.ok, r.stderr
    time.sleep(0.3)
    assert _live_processes_with(mark) == []


def _live_processes_with(text: str) -> list[int]:
    found = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and text.encode() in Path(f"/proc/{d}/environ").read_bytes():
                if Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(d))
        except OSError:
            pass
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="the weak mode isolates the network only as root")
def test_weak_mode_as_root_has_no_network(monkeypatch):
    monkeypatch.setattr(sbmod, "_probe_cache", {sys.executable: (False, "forced for the test")})
    r = Sandbox(allow_weak=True).run(
        "import socket\ntry:\n socket.create_connection(('127.0.0.1', 9), timeout=2)\nexcept OSError as e:\n"
        " print('blocked', e.errno)\nprint(sorted(n for _, n in socket.if_nameindex()))")
    assert r.ok, r.stderr
    assert r.stdout.splitlines()[-1] == "['lo']"


@pytest.fixture
def world_readable_src():
    """A copy of the package that another uid can import: the checkout itself may sit in a 0700 directory
    (a clone made under `mktemp -d`)."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="trinity-src-", dir="/tmp"))  # /tmp: traversable by any uid
    try:
        d.chmod(0o755)
        shutil.copytree(SRC / "trinity", d / "trinity", ignore=shutil.ignore_patterns("__pycache__"))
        for p in [d, *d.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="needs root to switch to an unprivileged user, and /usr/bin/python3")
def test_unprivileged_user_mode(world_readable_src):
    """As a normal user bubblewrap runs in a user namespace: same isolation, uid 1000 inside."""
    prog = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(world_readable_src)!r})
        from trinity.grading.sandbox import Sandbox
        sb = Sandbox(python="/usr/bin/python3", timeout_s=2)
        code = ("import os, socket; print(os.getuid(), os.getcwd(), sorted(os.listdir('/')), "
                "os.path.exists('/work'), [n for _, n in socket.if_nameindex()]); open('x', 'w').write('1')")
        a = sb.run(code)
        b = sb.run("import time; time.sleep(30)")
        c = sb.run("import os; os.fork() or os.setsid(); import time; time.sleep(1); print(os.getpid())")
        print(json.dumps([a.ok, a.stdout, a.stderr, b.killed_reason, c.ok]))
    """)
    out = subprocess.run(
        ["setpriv", "--reuid=4242", "--regid=4242", "--clear-groups", "--", "/usr/bin/python3", "-c", prog],
        capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}, cwd="/",
    )
    if "bubblewrap cannot run here" in out.stderr:
        pytest.skip("unprivileged user namespaces are not available here")
    assert out.returncode == 0, out.stderr
    ok, stdout, stderr, killed, forked_ok = json.loads(out.stdout.strip().splitlines()[-1])
    assert ok, stderr
    uid, cwd, *rest = stdout.split(" ", 2)
    assert uid == "1000" and cwd == "/sandbox"
    assert "'work'" not in rest[0] and "False" in rest[0] and "['lo']" in rest[0]
    assert killed == "timeout" and forked_ok
