"""The full sandbox: the interpreter's layout (what to bind), the seccomp filter, the bubblewrap command line,
and one run under bubblewrap."""
from __future__ import annotations

import errno
import json
import os
import platform
import secrets
import struct
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from trinity.grading.sandbox.common import (
    MAIN_FILE, PRIVATE_TMPFS_ROOTS, WORKDIR, SandboxResult, SandboxUnavailable, in_private_tmpfs,
)
from trinity.grading.sandbox.limits import SandboxLimits
from trinity.grading.sandbox.supervision import supervise


# ----------------------------------------------------------------------------------------------
# Interpreter layout


@lru_cache(maxsize=None)
def python_layout(python: str) -> tuple[tuple[str, ...], str]:
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


def _bwrap_argv(sb: SandboxLimits, fds: dict[str, int], etc_fds: dict[str, int], seccomp_fd: int | None,
                info_fd: int, uid: int, as_root: bool) -> list[str]:
    mb = 1 << 20
    binds, exe = python_layout(sb.interpreter)
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
    for k, v in sb.inner_env(WORKDIR).items():
        a += ["--setenv", k, v]
    if seccomp_fd is not None:
        a += ["--seccomp", str(seccomp_fd)]
    a.append("--")
    if as_root:
        a += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return a


def fresh_uid() -> int:
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


def run_bwrap(sb: SandboxLimits, files: dict[str, bytes], stdin: bytes, timeout: float) -> SandboxResult:
    as_root = os.geteuid() == 0
    uid = fresh_uid() if as_root else 1000
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
        exe = python_layout(sb.interpreter)[1]
        argv += sb.rlimit_args(timeout) + [exe, *sb.python_flags, MAIN_FILE]
        return supervise(sb, argv, stdin, timeout, pass_fds=child_fds, info_r=info_r, info_w=info_w,
                         bwrap=True)
    finally:
        for fd in owned:
            try:
                os.close(fd)
            except OSError:
                pass
