#!/usr/bin/env python3
"""Every prerequisite of `make setup` / `make run` / `make test`, checked in seconds, before anything is installed
or built: the Makefile runs this first (`make preflight`), so a missing prerequisite is reported in seconds, not
after the ~13 min llama.cpp build. Each problem is one line that names its fix; exit 1 when there is any.

Standard library only, any Python 3.7+: it runs before the project's venv exists (with whatever `python3` is on
PATH; the interpreters it checks are others).

Checked:
- Python 3.11 (the project's; PYTHON, else python3.11 / pyenv / uv / /usr/bin) that can make a venv with pip
  (Debian/Ubuntu split that into python3.11-venv), and an existing .venv being 3.11;
- with --sandbox (goals that grade BigCodeBench): Python 3.10 that can make a venv (PYTHON310, else the same places);
- system tools: bubblewrap, util-linux's prlimit (and setpriv as root), git; when llama.cpp is not built yet for
  this CPU, cmake and C/C++ compilers that really compile a program. Missing ones that scripts/setup_system.sh
  installs (root with apt-get) are a note, not a problem;
- that bwrap really starts a sandbox with the namespaces trinity.grading.sandbox asks for (where unprivileged
  namespaces are blocked, it does not: the first MBPP grade would fail, deep into evolve);
- free disk space per filesystem, for what is not there yet (sizes measured on a finished setup, below);
- the benchmark data, resolved as the code resolves it (see `data_roots`).

Usage (the Makefile passes the flags its goals need):
    python3 scripts/preflight.py [--sandbox] [--pipeline] [--tests] [--python P] [--python310 P]
    python3 scripts/preflight.py --which-python 3.11|3.10 [--python P] [--python310 P]   # print the interpreter
    python3 scripts/preflight.py --system-only   # tools, compilers and bwrap (after setup_system.sh installed some)
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 1024 ** 3
LLAMA_CPP_VERSION = "0.3.36"  # the Makefile's LLAMA_CPP_VERSION (it passes its own with --llama-version)

# Sizes of a finished setup, measured with `du` on this project's 2-core machine (Dec 2026), rounded up:
#   .venv 4.1 GiB (1.9 of it the GGUF parts of the model packages), ~/.cache/trinity/models 2.4 GiB (the assembled
#   GGUFs 1.8, the encoder's transformers copy 0.5), ~/.cache/trinity/sandbox-venv 2.5 GiB, the llama.cpp caches 0.1 GiB (sdist 77 MB, wheel 23 MB, server
#   15 MB). Not measurable here (every wheel came from a local directory): pip's download cache, taken as 1 GiB per
#   venv built; llama.cpp's build trees in TMPDIR while they compile, 1.5 GiB; the pipeline's own outputs (data/:
#   19 MB after `make run`, the store and W&B's offline runs growing with every run), 1 GiB.
VENV_GIB = 4.5
MODELS_GIB = 2.5
SANDBOX_GIB = 2.8
LLAMA_CACHE_GIB = 0.2
PIP_CACHE_GIB = 1.0
BUILD_TMP_GIB = 1.5
OUTPUTS_GIB = 1.0

# system commands -> the Debian package scripts/setup_system.sh installs them from
APT_PACKAGES = {"bwrap": "bubblewrap", "prlimit": "util-linux", "setpriv": "util-linux", "git": "git",
                "cmake": "cmake", "cc": "gcc", "c++": "g++", "tar": "tar", "flock": "util-linux"}
# a benchmark name in params.yaml -> its directory under the benchmark root (trinity.data.loaders)
BENCHMARK_DIRS = {"bigcodebench_hard": "bigcodebench"}


class Report:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.facts: list[str] = []

    def problem(self, line: str) -> None:
        self.problems.append(" ".join(line.split()))

    def note(self, line: str) -> None:
        self.notes.append(" ".join(line.split()))


def _run(argv: list[str], timeout: float = 20, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout, **kw)


def _last_line(text: str) -> str:
    """The line of a tool's stderr that says what went wrong: its first error, else its last line."""
    lines = [ln.strip() for ln in (text or "").strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["no output"])[0 if errors else -1][:300]


# ------------------------------------------------------------------------------------------------------------
# Python interpreters

def _probe_python(exe: str) -> tuple[str, tuple[int, ...]] | None:
    """(the real interpreter behind exe, its version), or None when it does not run (a pyenv shim of a version
    not selected, a broken link)."""
    try:
        r = _run([exe, "-c", "import sys; print(sys.executable); print(*sys.version_info[:3])"], timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = r.stdout.split("\n")
    if r.returncode != 0 or len(lines) < 2:
        return None
    try:
        return lines[0].strip() or exe, tuple(int(x) for x in lines[1].split())
    except ValueError:
        return None


def _venv_problem(exe: str, version: str) -> str | None:
    """Why `exe -m venv` would not give a venv with pip (None: it would). A real venv, without pip (fast), and
    ensurepip's bundled pip, which is what Debian/Ubuntu leave out without pythonX.Y-venv."""
    with tempfile.TemporaryDirectory(prefix="trinity-preflight-") as d:
        try:
            r = _run([exe, "-m", "venv", "--without-pip", os.path.join(d, "v")], timeout=30)
            if r.returncode == 0:
                r = _run([exe, "-c", "import ensurepip; ensurepip.version()"], timeout=15)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"cannot make a venv ({e})"
    if r.returncode != 0:
        return f"cannot make a venv with pip ({_last_line(r.stderr)}): apt-get install python{version}-venv " \
               f"(Debian/Ubuntu), or use a python.org/pyenv/uv build of Python {version}"
    return None


def _candidates(version: str) -> list[str]:
    home = Path.home()
    # pyenv's and uv's own locations, where their settings move them (PYENV_ROOT, UV_PYTHON_INSTALL_DIR)
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or home / ".pyenv")
    uv_pythons = Path(os.environ.get("UV_PYTHON_INSTALL_DIR") or home / ".local" / "share" / "uv" / "python")
    found = [f"python{version}"]
    found += sorted(glob.glob(str(pyenv_root / "versions" / f"{version}.*" / "bin" / f"python{version}")),
                    key=_natural, reverse=True)
    found += sorted(glob.glob(str(uv_pythons / f"cpython-{version}.*" / "bin" / f"python{version}")),
                    key=_natural, reverse=True)
    found += [f"/usr/local/bin/python{version}", f"/usr/bin/python{version}", "python3"]
    return found


def _natural(s: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def find_python(version: str, explicit: str | None, var: str) -> tuple[str | None, str]:
    """(interpreter, "") for Python `version` that can make a venv with pip, or (None, the problem line).
    `explicit` (PYTHON / PYTHON310) is the only one tried when given."""
    want = tuple(int(x) for x in version.split("."))
    fix = (f"install it (`pyenv install {version}`, `uv python install {version}`, or apt-get install "
           f"python{version} python{version}-venv) or name it: make {var}=/path/to/python{version}")
    if explicit:
        probed = _probe_python(explicit)
        if probed is None:
            return None, f"{var}={explicit} does not run: {fix}"
        exe, got = probed
        if got[:2] != want:
            return None, f"{var}={explicit} is Python {'.'.join(map(str, got))}, not {version}: {fix}"
        problem = _venv_problem(exe, version)
        return (None, f"Python {version} at {exe} {problem}") if problem else (exe, "")
    seen: set[str] = set()
    venv_problems: list[str] = []
    for c in _candidates(version):
        if not (os.path.isabs(c) and os.access(c, os.X_OK)) and shutil.which(c) is None:
            continue
        probed = _probe_python(c)
        if probed is None or probed[1][:2] != want or probed[0] in seen:
            continue
        exe = probed[0]
        seen.add(exe)
        problem = _venv_problem(exe, version)
        if problem is None:
            return exe, ""
        venv_problems.append(f"Python {version} at {exe} {problem}")
    if venv_problems:
        return None, venv_problems[0]
    return None, (f"Python {version} not found (python{version} on PATH, pyenv's versions/{version}.* under $PYENV_ROOT or ~/.pyenv, uv's, "
                  f"/usr/bin): {fix}")


def check_pythons(args, rep: Report) -> None:
    exe, problem = find_python("3.11", args.python, "PYTHON")
    if problem:
        rep.problem(problem)
    else:
        rep.facts.append(f"Python 3.11 {exe}")
    venv_python = Path(args.venv) / "bin" / "python"
    if venv_python.exists():
        probed = _probe_python(str(venv_python))
        if probed is None or probed[1][:2] != (3, 11):
            what = "does not run" if probed is None else f"is Python {'.'.join(map(str, probed[1]))}"
            rep.problem(f"the existing venv {args.venv} {what}, not 3.11: make clean-venv, then make setup")
    if args.sandbox:
        exe, problem = find_python("3.10", args.python310, "PYTHON310")
        if problem:
            rep.problem(f"{problem} (BigCodeBench's grading environment, scripts/setup_sandbox_env.sh, pins "
                        "packages built for 3.10 only)")
        else:
            rep.facts.append(f"Python 3.10 {exe}")


# ------------------------------------------------------------------------------------------------------------
# System tools, compilers, bubblewrap

def cpu_key() -> str:
    """The Makefile's CPU_KEY: md5 of /proc/cpuinfo's first `flags` line (with its newline), 12 hex digits."""
    line = ""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        pass
    return hashlib.md5(line.encode()).hexdigest()[:12]


def llama_needs_build(args) -> bool:
    """Whether setup will compile llama.cpp: llama-server is not built for this CPU from this version (the record
    scripts/build_llama_server.sh keeps beside it), or the goals need the in-process binding (`--in-process`: the
    tests, the benches) and its wheel is not cached for this CPU."""
    cache = Path.home() / ".cache" / "trinity"
    key = args.cpu_key or cpu_key()
    server = cache / "llama-server" / f"cpu-{key}" / "llama-server"
    record = server.with_name("llama-server.source")
    try:
        server_built = os.access(server, os.X_OK) and \
            record.read_text().strip() == f"llama-cpp-python=={args.llama_version}"
    except OSError:
        server_built = False
    if not getattr(args, "in_process", False):
        return not server_built
    wheel = glob.glob(str(cache / "wheels" / f"cpu-{key}" / f"llama_cpp_python-{args.llama_version}-*.whl"))
    return not wheel or not server_built


def _installable() -> bool:
    """scripts/setup_system.sh installs missing system packages when it runs as root with apt-get."""
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def check_tools(args, rep: Report, build: bool) -> None:
    need = ["bwrap", "prlimit", "git"] + (["setpriv"] if os.geteuid() == 0 else [])
    if build:
        need += ["cmake", "cc", "c++", "tar", "flock"]
    missing = [c for c in need if shutil.which(c) is None]
    if missing:
        pkgs = sorted({APT_PACKAGES[c] for c in missing})
        if _installable() and not args.system_only:
            rep.note(f"{', '.join(missing)} missing: scripts/setup_system.sh installs {' '.join(pkgs)} with apt-get")
        else:
            rep.problem(f"{', '.join(missing)} not on PATH: apt-get install {' '.join(pkgs)} (or your "
                        "distribution's packages of those names)")
    if build:
        check_compilers(rep)


def check_compilers(rep: Report) -> None:
    """cmake new enough for llama.cpp (3.14; llama-cpp-python's own build fetches a newer one from PyPI when it
    needs one), and C/C++ compilers that build a threaded C++17 program (headers and libstdc++ there)."""
    if shutil.which("cmake"):
        r = _run(["cmake", "--version"], timeout=15)
        m = re.search(r"(\d+)\.(\d+)", r.stdout)
        if r.returncode != 0 or not m or (int(m.group(1)), int(m.group(2))) < (3, 14):
            rep.problem(f"cmake {m.group(0) if m else '(does not run)'} is older than 3.14, which llama.cpp needs: "
                        "install a newer cmake (apt-get install cmake, or pip install cmake)")
    programs = [("cc", "c", "int main(void) { return 0; }\n", [], "gcc"),
                ("c++", "c++", "#include <thread>\n#include <vector>\nint main() { std::vector<std::thread> t; "
                 "return (int) t.size(); }\n", ["-std=c++17", "-pthread"], "g++")]
    with tempfile.TemporaryDirectory(prefix="trinity-preflight-") as d:
        for compiler, lang, src, flags, pkg in programs:
            if shutil.which(compiler) is None:
                continue  # reported with the tools
            try:
                r = _run([compiler, "-x", lang, *flags, "-", "-o", os.path.join(d, lang.replace("+", "p"))],
                         input=src, timeout=60)
                failed = r.returncode != 0
                why = _last_line(r.stderr)
            except (OSError, subprocess.TimeoutExpired) as e:
                failed, why = True, str(e)
            if failed:
                rep.problem(f"the {lang.upper()} compiler `{compiler}` cannot build a program ({why}): "
                            f"apt-get install {pkg} (llama.cpp is compiled at setup)")


def bwrap_probe_argv() -> list[str]:
    """The namespaces and mounts trinity.grading.sandbox.bwrap asks for, around /bin/true: as root, privileged
    bubblewrap (no user namespace) and setpriv's drop to an unprivileged uid; otherwise an unprivileged user
    namespace (--disable-userns needs bubblewrap >= 0.8)."""
    a = ["bwrap"]
    if os.geteuid() == 0:
        a += ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
              "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        a += ["--unshare-all", "--unshare-user", "--disable-userns", "--uid", "1000", "--gid", "1000"]
    a += ["--die-with-parent", "--new-session", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
          "--perms", "1777", "--size", str(1 << 20), "--tmpfs", "/tmp", "--"]
    if os.geteuid() == 0:
        a += ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
              "--bounding-set=-all", "--no-new-privs", "--"]
    return a + ["true"]


def check_bwrap(rep: Report) -> None:
    if shutil.which("bwrap") is None or (os.geteuid() == 0 and shutil.which("setpriv") is None):
        return  # reported (or to be installed) with the tools
    try:
        r = _run(bwrap_probe_argv(), timeout=20)
        ok, why = r.returncode == 0, _last_line(r.stderr)
    except (OSError, subprocess.TimeoutExpired) as e:
        ok, why = False, str(e)
    if ok:
        rep.facts.append("bwrap starts a sandbox")
        return
    fix = ("allow namespaces (as a normal user: sysctl kernel.unprivileged_userns_clone=1 or "
           "kernel.apparmor_restrict_unprivileged_userns=0 where those exist; in a container: --privileged or a "
           "seccomp/AppArmor profile that permits unshare), or install bubblewrap >= 0.8")
    if os.environ.get("TRINITY_SANDBOX_WEAK") == "1":
        rep.note(f"bwrap cannot start a sandbox here ({why}); TRINITY_SANDBOX_WEAK=1: graded code runs with "
                 "rlimits only, not isolated from this machine's files")
    else:
        rep.problem(f"bwrap cannot start a sandbox here ({why}), so model-written code cannot be graded: {fix}; "
                    "or set TRINITY_SANDBOX_WEAK=1 to grade with rlimits only (no isolation)")


# ------------------------------------------------------------------------------------------------------------
# Disk space

def _existing(p: Path) -> Path:
    p = p.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _mount_point(p: Path) -> Path:
    p = _existing(p)
    dev = p.stat().st_dev
    while p != p.parent and p.parent.stat().st_dev == dev:
        p = p.parent
    return p


def _du_gib(path: Path) -> float:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total / GIB


def disk_needs(args, build: bool) -> list[tuple[Path, str, float]]:
    """(where, what, GiB) for what setup and the goals would still write."""
    cache = Path.home() / ".cache"
    trinity = cache / "trinity"
    pip_cache = Path(os.environ.get("PIP_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME") or cache) / "pip"
    models = Path(os.environ.get("TRINITY_MODEL_CACHE") or trinity / "models")
    sandbox = Path(os.environ.get("TRINITY_SANDBOX_VENV")
                   or Path(os.environ.get("XDG_CACHE_HOME") or cache) / "trinity" / "sandbox-venv")
    tmp = Path(os.environ.get("TMPDIR") or tempfile.gettempdir())
    venv = Path(args.venv)
    needs = []
    if not (venv / ".trinity-setup").exists():
        needs += [(venv, "the project venv", VENV_GIB), (pip_cache, "pip's downloads", PIP_CACHE_GIB)]
    have = _du_gib(models)  # the GGUFs (1.8 GiB) and the encoder's transformers copy (0.5 GiB, at the first encode)
    if have < MODELS_GIB - 0.2:
        needs.append((models, "the embedded models", MODELS_GIB - have))
    if build:
        needs += [(trinity, "llama.cpp's sources and builds", LLAMA_CACHE_GIB),
                  (tmp, "llama.cpp's build trees", BUILD_TMP_GIB)]
    if args.sandbox and not (sandbox / ".trinity-stamp").exists():
        needs += [(sandbox, "the BigCodeBench venv", SANDBOX_GIB), (pip_cache, "pip's downloads", PIP_CACHE_GIB)]
    if args.pipeline or args.tests:
        needs.append((ROOT / "data", "the runs' outputs and store", OUTPUTS_GIB))
    return needs


def check_disk(args, rep: Report, build: bool) -> None:
    per_fs: dict[Path, list[tuple[Path, str, float]]] = {}
    for where, what, gib in disk_needs(args, build):
        per_fs.setdefault(_mount_point(where), []).append((where, what, gib))
    for mount, items in per_fs.items():
        st = os.statvfs(_existing(items[0][0]))
        free = st.f_bavail * st.f_frsize / GIB
        need = sum(g for _, _, g in items)
        if free < need:
            parts = ", ".join(f"{what} {g:.1f} in {where}" for where, what, g in items)
            rep.problem(f"{free:.1f} GiB free on {mount}, about {need:.1f} GiB needed ({parts}): free space there, "
                        "or move them (HOME, TRINITY_MODEL_CACHE, TRINITY_SANDBOX_VENV, TMPDIR) to a larger disk")
        else:
            rep.facts.append(f"{free:.0f} GiB free on {mount} (needs {need:.1f})")


# ------------------------------------------------------------------------------------------------------------
# Benchmark data

def _strip_comment(s: str) -> str:
    out, quote = [], None
    for i, ch in enumerate(s):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or s[i - 1] in " \t"):
            break
        out.append(ch)
    return "".join(out).rstrip()


def _scalar(s: str):
    s = s.strip()
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    return s


def _flow_map(s: str) -> dict:
    body = s.strip()[1:-1].strip()
    out = {}
    for item in filter(None, (x.strip() for x in body.split(","))):
        k, _, v = item.partition(":")
        out[_scalar(k)] = _scalar(v)
    return out


def parse_data_section(text: str) -> dict:
    """params.yaml's `data:` section: scalars, flow maps ({a: 1}) and one level of block maps. PyYAML is not
    assumed (this runs before the venv); trinity.config validates the whole file when the pipeline starts."""
    lines = text.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if re.fullmatch(r"data:\s*(#.*)?", ln))
    except StopIteration:
        return {}
    data: dict = {}
    current: str | None = None
    child_indent = None
    for raw in lines[start + 1:]:
        line = _strip_comment(raw)
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            break
        if child_indent is None:
            child_indent = indent
        key, _, value = line.strip().partition(":")
        if indent == child_indent:
            value = value.strip()
            current = key.strip()
            data[current] = _flow_map(value) if value.startswith("{") else ({} if not value else _scalar(value))
        elif indent > child_indent and current is not None and isinstance(data.get(current), dict):
            data[current][_scalar(key)] = _scalar(value)
    return data


def data_roots(args) -> list[tuple[Path, str, str]]:
    """(directory, where it comes from, the fix) for each place the goals read the benchmarks from, resolved as
    they resolve it: the code (trinity.config.DataSettings.resolved_root: TRINITY_DATA_DIR, else params.yaml's
    data.root, relative to the project root); with --pipeline also DVC (dvc.yaml's ${data.root}: params.yaml only,
    TRINITY_DATA_DIR does not change it); with --tests tests/conftest.py (TRINITY_DATA_DIR, else
    ../shared/benchmarks)."""
    params = Path(args.params)
    data = parse_data_section(params.read_text()) if params.is_file() else {}
    root = str(data.get("root") or "../shared/benchmarks")
    env = os.environ.get("TRINITY_DATA_DIR")

    def resolve(p: str) -> Path:
        q = Path(p).expanduser()
        return q if q.is_absolute() else (ROOT / q).resolve()

    fix_params = f"set data.root in {params.name} (or put the benchmarks there)"
    roots = [(resolve(env), "TRINITY_DATA_DIR", "set TRINITY_DATA_DIR to the benchmark directory")] if env else \
        [(resolve(root), f"{params.name} data.root", fix_params + ", or set TRINITY_DATA_DIR")]
    if args.pipeline and env:
        roots.append((resolve(root), f"{params.name} data.root, which DVC depends on even with TRINITY_DATA_DIR set",
                      fix_params))
    if args.tests:
        roots.append((resolve(env or "../shared/benchmarks"),
                      "the tests' TRINITY_DATA_DIR, else ../shared/benchmarks",
                      "set TRINITY_DATA_DIR to the benchmark directory"))
    seen, out = set(), []
    for r in roots:
        if r[0] not in seen:
            seen.add(r[0])
            out.append(r)
    return out


def check_data(args, rep: Report) -> None:
    params = Path(args.params)
    data = parse_data_section(params.read_text()) if params.is_file() else {}
    user = data.get("user_benchmarks") if isinstance(data.get("user_benchmarks"), dict) else {}
    names = set()
    for split in ("train", "in_distribution", "validation", "heldout"):
        if isinstance(data.get(split), dict):
            names |= {str(k) for k, v in data[split].items() if v != 0}
    for i, (root, origin, fix) in enumerate(data_roots(args)):
        if not (root / "SOURCES.md").is_file():
            what = "does not exist" if not root.exists() else "has no SOURCES.md (the staged benchmarks' index)"
            rep.problem(f"benchmark data: {root} ({origin}) {what}: {fix}")
            continue
        if i == 0:  # the directories the configured splits read (the code's root)
            missing = sorted(d for d in {BENCHMARK_DIRS.get(n, n) for n in names - set(user)}
                             if not (root / d).is_dir())
            if missing:
                rep.problem(f"benchmark data: {root} ({origin}) lacks {', '.join(missing)}/, which {params.name}'s "
                            f"splits read: {fix}")
        rep.facts.append(f"benchmarks {root}")
    for name, path in user.items():
        p = Path(str(path)).expanduser()
        p = p if p.is_absolute() else ROOT / p
        if not p.is_file():
            rep.problem(f"benchmark data: data.user_benchmarks.{name} ({p}) does not exist: write it "
                        "(docs/user_benchmarks.md) or remove it from params.yaml")


# ------------------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sandbox", action="store_true", help="goals that build/use BigCodeBench's grading venv")
    ap.add_argument("--pipeline", action="store_true", help="goals that run `dvc repro` / `dvc exp run`")
    ap.add_argument("--tests", action="store_true", help="goals that run the tests")
    ap.add_argument("--in-process", action="store_true",
                    help="goals that build llama.cpp's Python binding (setup-in-process: the tests, the benches)")
    ap.add_argument("--system-only", action="store_true", help="tools, compilers, bwrap only; nothing installable")
    ap.add_argument("--python", default=os.environ.get("PYTHON") or None, help="the Python 3.11 to use")
    ap.add_argument("--python310", default=os.environ.get("PYTHON310") or None, help="the Python 3.10 to use")
    ap.add_argument("--which-python", choices=["3.11", "3.10"], help="print that interpreter's path and exit")
    ap.add_argument("--venv", default=str(ROOT / ".venv"))
    ap.add_argument("--params", default=str(ROOT / "params.yaml"))
    ap.add_argument("--cpu-key", default=None, help="the Makefile's CPU_KEY (default: computed the same way)")
    ap.add_argument("--llama-version", default=LLAMA_CPP_VERSION)
    args = ap.parse_args(argv)

    if args.which_python:
        explicit, var = (args.python, "PYTHON") if args.which_python == "3.11" else (args.python310, "PYTHON310")
        exe, problem = find_python(args.which_python, explicit, var)
        if problem:
            print(f"preflight: {problem}", file=sys.stderr)
            return 1
        print(exe)
        return 0

    t0 = time.monotonic()
    rep = Report()
    build = llama_needs_build(args)
    if not args.system_only:
        check_pythons(args, rep)
    check_tools(args, rep, build)
    check_bwrap(rep)
    if not args.system_only:
        check_disk(args, rep, build)
        check_data(args, rep)
    took = time.monotonic() - t0
    for line in rep.notes:
        print(f"preflight: note: {line}")
    if rep.problems:
        for line in rep.problems:
            print(f"preflight: {line}", file=sys.stderr)
        print(f"preflight: {len(rep.problems)} problem(s) found in {took:.1f} s; nothing was installed or built",
              file=sys.stderr)
        return 1
    print(f"preflight: ok in {took:.1f} s: " + "; ".join(
        rep.facts + (["llama.cpp to be compiled for this CPU"] if build else [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
