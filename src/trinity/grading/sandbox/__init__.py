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

Modules: `api` (what graders call: `Sandbox`, `SandboxJob`, which mode runs), `bwrap` (the interpreter's
layout, the seccomp filter, the bubblewrap command line), `weak` (the weak mode), `supervision` (stdin, capped
output, wall clock, memory watchdog, killing the run), `common` (the error, the result record, the sandbox's paths).
"""
from trinity.grading.sandbox.api import Sandbox, SandboxJob, default_sandbox_venv, sandbox_python
from trinity.grading.sandbox.bwrap import seccomp_filter
from trinity.grading.sandbox.common import (
    MAIN_FILE, PRIVATE_TMPFS_ROOTS, WORKDIR, SandboxResult, SandboxUnavailable, in_private_tmpfs,
)

__all__ = [
    "MAIN_FILE", "PRIVATE_TMPFS_ROOTS", "WORKDIR", "Sandbox", "SandboxJob", "SandboxResult", "SandboxUnavailable",
    "default_sandbox_venv", "in_private_tmpfs", "sandbox_python", "seccomp_filter",
]
