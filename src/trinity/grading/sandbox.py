"""Run untrusted, model-written Python in a bubblewrap sandbox.

Why each layer is there (every one of them is cheap; together they make a run of hostile code
leave the host as it found it):

* **Namespaces** (bubblewrap): a new mount namespace whose root is an empty tmpfs holding only
  read-only binds of the system (/usr, the /lib* and /bin links, a few world-readable /etc files,
  a generated /etc/passwd and /etc/hosts) and of the interpreter that runs the code — its venv and
  base installation, at their own paths (so e.g. /work/main/.venv and /root/.pyenv/versions/3.11.7
  exist inside, and nothing else of /work or /root). A fresh writable tmpfs is cwd and HOME
  (/sandbox); /tmp and /dev/shm are small tmpfs; the root tmpfs and /dev are then remounted
  read-only. New /proc (this run's processes only) and a minimal /dev. New PID, network (loopback
  only: nothing routes out), IPC, UTS and cgroup namespaces.
* **An unprivileged uid**: as a normal user, bubblewrap runs unprivileged in a new user namespace
  (``--unshare-all --disable-userns``, uid 1000 inside). As root, bubblewrap runs privileged —
  without a user namespace, which would only map the sandbox to host root — and the code drops to
  a fresh, otherwise unused uid with ``setpriv``: no capabilities (also none in the bounding set),
  no_new_privs, and a process count (RLIMIT_NPROC) that counts this run alone; the kernel never
  enforces RLIMIT_NPROC for uid 0.
* **seccomp** (x86-64): a deny list of syscalls a test program never needs and that widen the
  kernel surface: new namespaces, mount, keyrings, bpf, perf, io_uring, ptrace, module/kexec/clock
  calls, open_by_handle_at. They fail with EPERM (clone3 with ENOSYS, so libc falls back to clone).
* **rlimits** (``prlimit``): CPU seconds, address space, processes, file size, open files, no core
  dumps. A wall-clock **timeout** SIGKILLs the sandbox's PID-namespace init (through a pidfd),
  which takes every process of the namespace with it (daemons included), then bubblewrap's
  process group.
* **A memory watchdog** sums the resident memory of every process of the run (RLIMIT_AS is per
  process; a fork bomb of big processes is not) and kills the run past ``rss_limit_mb``.
* **Output caps**: each captured stream keeps at most ``max_output_bytes``; past that the run is
  killed (``killed_reason="output_limit"``).
* **A scrubbed environment**: nothing of the host's environment reaches the code (nor bubblewrap's
  own /proc/<pid>/environ), apart from a short allow-list (OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE, which
  some CPUs need for OpenBLAS to compute correctly).

Where bubblewrap cannot run, `Sandbox.run` raises `SandboxUnavailable` (install bubblewrap), unless
the caller opts into the weaker mode (``allow_weak=True`` or env ``TRINITY_SANDBOX_WEAK=1``):
rlimits, a scrubbed environment, a temporary cwd, and a kill of every process still carrying the
run's token in its environment; as root also ``unshare`` of the network, PID, IPC, UTS and mount
namespaces, and the drop to a fresh uid where the interpreter is readable by any uid. Weak mode does
not hide the host's files from the code; use it only for code you would run anyway.

Not covered without cgroups: memory that no process maps (pipe buffers, unmapped memfd pages) is
bounded only by the rlimits (file size × open files × processes), not by ``rss_limit_mb``.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import platform
import secrets
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Sequence

log = logging.getLogger(__name__)

WORKDIR = "/sandbox"  # cwd and HOME inside the sandbox (a fresh tmpfs)
PRIVATE_TMPFS_ROOTS = ("/tmp", "/dev/shm", WORKDIR)  # each a fresh, size-capped tmpfs inside the sandbox


def in_private_tmpfs(path: str) -> bool:
    """Whether `path` lies strictly inside one of the sandbox's own tmpfs mounts (so a host directory at that
    path is hidden inside, and whatever the sandbox writes there never reaches the host)."""
    return any(path.startswith(t + "/") for t in PRIVATE_TMPFS_ROOTS)
MAIN_FILE = "main.py"
_PASSTHROUGH_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`, Fedora: `dnf install bubblewrap`, "
    "Arch: `pacman -S bubblewrap`) and allow user namespaces (as a normal user: sysctl "
    "kernel.unprivileged_userns_clone=1 where that knob exists; in a container: run it with "
    "--privileged or a seccomp/apparmor profile that permits unshare). To run graded code anyway with "
    "rlimits only (no filesystem isolation), pass allow_weak=True or set TRINITY_SANDBOX_WEAK=1."
)


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


@dataclass(frozen=True)
class SandboxJob:
    """One program for `Sandbox.run_many`."""

    code: str
    stdin: str = ""
    timeout_s: float | None = None
    files: Mapping[str, str | bytes] | None = None


def _weak_requested() -> bool:
    return os.environ.get("TRINITY_SANDBOX_WEAK", "").strip().lower() in ("1", "true", "yes", "on")


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
            return _run_bwrap(self, all_files, stdin.encode("utf-8", "surrogateescape"), timeout)
        return _run_weak(self, all_files, stdin.encode("utf-8", "surrogateescape"), timeout)

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
# Interpreter layout and availability


@lru_cache(maxsize=None)
def _python_layout(python: str) -> tuple[tuple[str, ...], str]:
    """(directories to bind read-only, canonical interpreter path) for a Python executable."""
    exe = os.path.abspath(python)
    if not os.path.exists(exe):
        raise SandboxUnavailable(f"sandbox interpreter not found: {exe}")
    out = subprocess.run(
        [exe, "-I", "-c", "import json, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, "
         "sys.base_exec_prefix]))"],
        capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
    )
    if out.returncode != 0:
        raise SandboxUnavailable(f"sandbox interpreter {exe} does not run: {out.stderr.strip()[-500:]}")
    dirs: set[str] = set()
    for p in json.loads(out.stdout):
        dirs.add(os.path.realpath(p))
    # The executable may be a symlink chain (venv/bin/python → base/bin/python3.x): bind every hop.
    hop = exe
    for _ in range(40):
        dirs.add(os.path.realpath(os.path.dirname(hop)))
        if not os.path.islink(hop):
            break
        target = os.readlink(hop)
        hop = target if os.path.isabs(target) else os.path.join(os.path.dirname(hop), target)
    binds = _minimal_cover(d for d in dirs if not _under_system(d))
    # Run it by a path that exists inside (its directory resolved, the name kept: a venv's
    # bin/python must stay the venv's, not its target's).
    return tuple(binds), os.path.join(os.path.realpath(os.path.dirname(exe)), os.path.basename(exe))


def _under_system(path: str) -> bool:
    return path == "/usr" or path.startswith("/usr/")


def _minimal_cover(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in sorted(set(paths), key=len):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in out):
            out.append(p)
    return sorted(out)


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
                r = _run_bwrap(probe, {MAIN_FILE: b"print('ok')\n"}, b"", 60.0)
                res = (True, "") if (r.exit_code == 0 and r.stdout.strip() == "ok") else (
                    False, f"probe run failed (exit {r.exit_code}): {r.stderr.strip()[-800:]}")
            except SandboxUnavailable as e:
                res = (False, str(e))
            except OSError as e:
                res = (False, f"cannot start bwrap: {e}")
        _probe_cache[python] = res
        return res


# ----------------------------------------------------------------------------------------------
# seccomp: a deny list, as a classic BPF program that bubblewrap installs (--seccomp FD)

_AUDIT_ARCH_X86_64 = 0xC000003E
_X86_64_DENY_EPERM = {
    "ptrace": 101, "mount": 165, "umount2": 166, "pivot_root": 155, "swapon": 167, "swapoff": 168,
    "reboot": 169, "acct": 163, "settimeofday": 164, "adjtimex": 159, "clock_settime": 227,
    "clock_adjtime": 305, "init_module": 175, "delete_module": 176, "finit_module": 313,
    "kexec_load": 246, "kexec_file_load": 320, "add_key": 248, "request_key": 249, "keyctl": 250,
    "unshare": 272, "setns": 308, "perf_event_open": 298, "fanotify_init": 300,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "quotactl": 179, "lookup_dcookie": 212, "vhangup": 153,
}
_X86_64_CLONE, _X86_64_CLONE3 = 56, 435
_CLONE_NS_FLAGS = 0x10000000 | 0x00020000 | 0x20000000 | 0x40000000 | 0x08000000 | 0x04000000 | 0x02000000
# CLONE_NEWUSER | NEWNS | NEWPID | NEWNET | NEWIPC | NEWUTS | NEWCGROUP


def seccomp_filter() -> bytes | None:
    """The deny-list filter for this machine, or None where it is not written (non x86-64)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    LD_W_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, KILL = 0x7FFF0000, 0x80000000
    EPERM_RET, ENOSYS_RET = 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    # Assemble with symbolic jump targets, then resolve.
    prog: list[tuple[int, object, object, int]] = []
    prog.append((LD_W_ABS, 0, 0, 4))  # arch
    prog.append((JEQ, 0, "kill", _AUDIT_ARCH_X86_64))
    prog.append((LD_W_ABS, 0, 0, 0))  # syscall nr
    prog.append((JGE, "eperm", 0, 0x40000000))  # x32 ABI
    for nr in sorted(_X86_64_DENY_EPERM.values()):
        prog.append((JEQ, "eperm", 0, nr))
    prog.append((JEQ, "enosys", 0, _X86_64_CLONE3))
    prog.append((JEQ, 0, "allow", _X86_64_CLONE))
    prog.append((LD_W_ABS, 0, 0, 16))  # clone: args[0], low 32 bits (little-endian) = the flags
    prog.append((JSET, "eperm", "allow", _CLONE_NS_FLAGS))
    labels: dict[str, int] = {}  # (classic BPF jumps only forward: the returns come last)
    labels["allow"] = len(prog); prog.append((RET, 0, 0, ALLOW))
    labels["eperm"] = len(prog); prog.append((RET, 0, 0, EPERM_RET))
    labels["enosys"] = len(prog); prog.append((RET, 0, 0, ENOSYS_RET))
    labels["kill"] = len(prog); prog.append((RET, 0, 0, KILL))
    out = bytearray()
    for i, (code, jt, jf, k) in enumerate(prog):
        def off(t: object) -> int:
            if isinstance(t, str):
                d = labels[t] - i - 1
                assert 0 <= d < 256, (t, d)
                return d
            return int(t)  # type: ignore[arg-type]
        out += struct.pack("<HBBI", code, off(jt), off(jf), k)
    return bytes(out)


# ----------------------------------------------------------------------------------------------
# The bubblewrap command line


def _etc_files(uid: int, gid: int) -> dict[str, bytes]:
    return {
        "/etc/passwd": f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\n"
                       f"sandbox:x:{uid}:{gid}:sandbox:{WORKDIR}:/bin/sh\n"
                       "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n".encode(),
        "/etc/group": f"root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n".encode(),
        "/etc/hostname": b"sandbox\n",
        "/etc/hosts": b"127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "/etc/nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files\n",
    }


# Host /etc entries the programs may legitimately read (all world-readable system configuration).
_ETC_RO = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "timezone", "ssl", "ca-certificates",
           "alternatives", "mime.types", "protocols", "services", "fonts", "os-release", "debian_version",
           "matplotlibrc", "ImageMagick-6", "magic", "magic.mime")


def _bwrap_argv(sb: Sandbox, fds: dict[str, int], etc_fds: dict[str, int], seccomp_fd: int | None,
                info_fd: int, uid: int, as_root: bool) -> list[str]:
    mb = 1 << 20
    binds, exe = _python_layout(sb.interpreter)
    a: list[str] = ["bwrap"]
    if as_root:
        # Privileged bwrap: no user namespace (it would map the sandbox to host root); the code
        # drops to a fresh uid with setpriv below.
        a += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
              "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
              "--cap-add", "CAP_SETPCAP"]  # only for setpriv, which drops them all
    else:
        a += ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", str(uid), "--gid", str(uid)]
    a += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--info-fd", str(info_fd)]
    # Parent directories of the bind targets: created explicitly as 0755 (privileged bwrap would
    # otherwise create them 0700, unreadable for the sandbox uid).
    dests = ["/etc/x"] + [d for d in binds]
    parents = sorted({str(p) for d in dests for p in Path(d).parents if str(p) != "/"}, key=len)
    for p in parents:
        a += ["--perms", "0755", "--dir", p]
    a += ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            a += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            a += ["--ro-bind", top, top]
    for name in _ETC_RO:
        a += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    for dest, fd in etc_fds.items():
        a += ["--perms", "0644", "--ro-bind-data", str(fd), dest]
    under_tmpfs = [d for d in binds if d in PRIVATE_TMPFS_ROOTS or in_private_tmpfs(d)]
    for d in binds:
        if d not in under_tmpfs:
            a += ["--ro-bind", d, d]
    a += ["--proc", "/proc", "--dev", "/dev"]
    size = str(sb.tmpfs_mb * mb)
    a += ["--perms", "1777", "--size", size, "--tmpfs", "/tmp"]
    a += ["--perms", "1777", "--size", size, "--tmpfs", "/dev/shm"]
    a += ["--perms", "1777" if as_root else "0755", "--size", size, "--tmpfs", WORKDIR]
    # Extra read-only binds come after the tmpfs mounts (so they may land in /tmp or the work dir);
    # directories made for them in a tmpfs stay writable (e.g. a cache directory seeded read-only).
    # The interpreter's own directories go here too when they live in /tmp (a project cloned under /tmp):
    # bound before the tmpfs, they would be hidden by it.
    made = {"/", "/tmp", "/dev", "/dev/shm", "/proc", WORKDIR, "/etc", *parents, *binds}
    made -= {p for p in parents if in_private_tmpfs(p)}
    made -= set(under_tmpfs)
    for src, dest in [(d, d) for d in under_tmpfs] + list(sb.ro_binds):
        for p in sorted((str(q) for q in Path(dest).parents), key=len):
            if p not in made:
                a += ["--perms", ("1777" if as_root else "0777") if in_private_tmpfs(p) else "0755", "--dir", p]
                made.add(p)
        a += ["--ro-bind", src, dest]
    for name, fd in fds.items():
        parent = os.path.dirname(name)
        if parent:
            a += ["--perms", "1777" if as_root else "0755", "--dir", f"{WORKDIR}/{parent}"]
        a += ["--perms", "0644", "--file", str(fd), f"{WORKDIR}/{name}"]
    # The root tmpfs (and /etc in it) and /dev's tmpfs: read-only from here on, so that only the
    # size-capped tmpfs mounts (work dir, /tmp, /dev/shm) take writes.
    a += ["--remount-ro", "/", "--remount-ro", "/dev"]
    a += ["--chdir", WORKDIR, "--clearenv"]
    for k, v in sb._inner_env(WORKDIR).items():
        a += ["--setenv", k, v]
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    a.append("--")
    if as_root:
        a += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return a


def _fresh_uid() -> int:
    """An otherwise unused uid for one run (root mode): its RLIMIT_NPROC counts this run alone."""
    while True:
        uid = 0x100000 + secrets.randbelow(0x3FFFFF)
        try:
            import pwd

            pwd.getpwuid(uid)
        except KeyError:
            return uid


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name, 0)
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _run_bwrap(sb: Sandbox, files: dict[str, bytes], stdin: bytes, timeout: float) -> SandboxResult:
    as_root = os.geteuid() == 0
    uid = _fresh_uid() if as_root else 1000
    owned: list[int] = []
    try:
        fds = {name: _memfd("sandbox-file", data) for name, data in files.items()}
        owned += fds.values()
        etc_fds = {dest: _memfd("sandbox-etc", data) for dest, data in _etc_files(uid, uid).items()}
        owned += etc_fds.values()
        filt = seccomp_filter()
        seccomp_fd = _memfd("sandbox-seccomp", filt) if filt is not None else None
        if seccomp_fd is not None:
            owned.append(seccomp_fd)
        info_r, info_w = os.pipe()
        child_fds = tuple(owned) + (info_w,)
        owned.append(info_r)
        argv = _bwrap_argv(sb, fds, etc_fds, seccomp_fd, info_w, uid, as_root)
        exe = _python_layout(sb.interpreter)[1]
        argv += sb._rlimit_args(timeout) + [exe, *sb.python_flags, MAIN_FILE]
        return _supervise(sb, argv, stdin, timeout, pass_fds=child_fds, info_r=info_r, info_w=info_w,
                          bwrap=True)
    finally:
        for fd in owned:
            try:
                os.close(fd)
            except OSError:
                pass


def _run_weak(sb: Sandbox, files: dict[str, bytes], stdin: bytes, timeout: float) -> SandboxResult:
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
            if shutil.which("setpriv") and all(_world_usable(d) for d in _python_layout(exe)[0] + (exe,)):
                uid = _fresh_uid()
                argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--"]
            else:
                log.warning("weak sandbox: %s is not usable by an unprivileged uid; the code runs as root", exe)
        else:
            # RLIMIT_NPROC counts every process of this uid: leave room for the ones already running.
            extra_nproc = _count_own_processes()
        env = sb._inner_env(workdir)
        # Without a PID namespace a daemon can leave the process group; the run's token in the
        # environment finds it afterwards (unless the code scrubs its own environment: weak mode).
        token = secrets.token_hex(16)
        env["TRINITY_SANDBOX_RUN"] = token
        argv += sb._rlimit_args(timeout, extra_nproc) + [exe, *sb.python_flags, MAIN_FILE]
        try:
            return _supervise(sb, argv, stdin, timeout, pass_fds=(), info_r=None, info_w=None, bwrap=False,
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


# ----------------------------------------------------------------------------------------------
# Supervision: feed stdin, capture capped output, enforce the wall clock and the memory watchdog


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


def _supervise(sb: Sandbox, argv: list[str], stdin: bytes, timeout: float, *, pass_fds: tuple[int, ...],
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
