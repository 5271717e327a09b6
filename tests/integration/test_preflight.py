"""scripts/preflight.py, what `make` runs before it installs or builds anything: on this machine it passes; each
missing prerequisite, made missing for real (a namespace-blocking seccomp filter, a masked ensurepip or header
directory, a tiny disk, absent data), fails it with one line that names the fix. It runs on the base interpreter in
isolated mode without site-packages (-I -S): the standard library only, as before the venv exists."""
import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

PROJECT = Path(__file__).resolve().parents[2]
SCRIPT = PROJECT / "scripts" / "preflight.py"
HOST = [sys._base_executable, "-I", "-S"]  # a Python outside the venv, no site-packages at all

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is the harness of this case")


def _load():
    spec = importlib.util.spec_from_file_location("preflight", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


preflight = _load()


def run(*args, wrap=(), env=None, fds=()):
    """The preflight as `make` runs it (optionally inside `bwrap --dev-bind / /` with extra mounts)."""
    cmd = ([*("bwrap", "--dev-bind", "/", "/"), *wrap, "--"] if wrap else []) + [*HOST, str(SCRIPT), *args]
    e = {k: v for k, v in os.environ.items() if k not in ("TRINITY_SANDBOX_WEAK", "PYTHON", "PYTHON310")}
    e.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300, pass_fds=fds)


def problems(r) -> list[str]:
    """The problem lines: every stderr line but the closing count."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and re.fullmatch(r"preflight: \d+ problem\(s\) found in [\d.]+ s; nothing was installed or built",
                                  lines[-1]), r.stderr
    assert all(ln.startswith("preflight: ") for ln in lines), r.stderr
    return [ln[len("preflight: "):] for ln in lines[:-1]]


def one_problem(r) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    (line,) = problems(r)
    return line


@pytest.fixture(scope="module")
def py311() -> str:
    r = run("--which-python", "3.11")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_this_machine_passes(py311):
    r = run("--tests", "--python", py311)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("preflight: ok in ") and "bwrap starts a sandbox" in r.stdout, r.stdout
    assert f"Python 3.11 {py311}" in r.stdout


def test_which_python_names_a_3_11_interpreter(py311):
    out = subprocess.run([py311, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True)
    assert Path(py311).is_absolute() and out.stdout.strip() == "(3, 11)"


def test_an_interpreter_that_does_not_run_or_is_not_3_11(tmp_path):
    fake = tmp_path / "python3.11"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    line = one_problem(run("--python", str(fake)))
    assert line.startswith(f"PYTHON={fake} does not run:") and "make PYTHON=/path/to/python3.11" in line
    other = run("--which-python", "3.10")
    if other.returncode != 0:
        pytest.skip("no Python 3.10 here to stand in for a wrong version")
    line = one_problem(run("--python", other.stdout.strip()))
    assert re.search(r"is Python 3\.10\.\d+, not 3\.11: install it \(`pyenv install 3\.11`", line), line


@needs_bwrap
def test_a_python_without_venv_support_is_named_with_its_package(py311):
    ensurepip = subprocess.run([py311, "-c", "import ensurepip, os; print(os.path.dirname(ensurepip.__file__))"],
                               capture_output=True, text=True, check=True).stdout.strip()
    line = one_problem(run("--python", py311, wrap=("--tmpfs", ensurepip)))  # as Debian without python3.11-venv
    assert line.startswith(f"Python 3.11 at {py311} cannot make a venv with pip (")
    assert line.endswith("apt-get install python3.11-venv (Debian/Ubuntu), or use a python.org/pyenv/uv build of "
                         "Python 3.11")


def test_an_existing_venv_of_another_python_is_named(tmp_path, py311):
    other = run("--which-python", "3.10")
    if other.returncode != 0:
        pytest.skip("no Python 3.10 here to make a venv of another version")
    subprocess.run([other.stdout.strip(), "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    line = one_problem(run("--python", py311, "--venv", str(tmp_path / "venv")))
    assert re.fullmatch(rf"the existing venv {tmp_path / 'venv'} is Python 3\.10\.\d+, not 3\.11: make clean-venv, "
                        r"then make setup", line), line


@needs_bwrap
def test_bwrap_that_cannot_make_namespaces_fails_unless_weak_grading_is_chosen(tmp_path, py311):
    """Namespaces blocked the way a container's seccomp profile blocks them: the sandbox's own deny-list filter
    (clone/unshare with namespace flags fail with EPERM) around the preflight; bwrap is on PATH and runs."""
    from trinity.grading.sandbox.bwrap import seccomp_filter

    bpf = seccomp_filter()
    if bpf is None:
        pytest.skip("the seccomp filter is written for x86-64 only")
    (tmp_path / "filter.bpf").write_bytes(bpf)
    with open(tmp_path / "filter.bpf", "rb") as f:
        r = run("--python", py311, wrap=("--seccomp", str(f.fileno())), fds=(f.fileno(),))
    line = one_problem(r)
    assert line.startswith("bwrap cannot start a sandbox here (bwrap: ") and "Operation not permitted" in line
    assert "allow namespaces" in line and line.endswith("or set TRINITY_SANDBOX_WEAK=1 to grade with rlimits only "
                                                        "(no isolation)")
    with open(tmp_path / "filter.bpf", "rb") as f:
        weak = run("--python", py311, wrap=("--seccomp", str(f.fileno())), fds=(f.fileno(),),
                   env={"TRINITY_SANDBOX_WEAK": "1"})
    assert weak.returncode == 0, weak.stderr
    assert "preflight: note: bwrap cannot start a sandbox here" in weak.stdout


@needs_bwrap
def test_missing_tools_are_named_with_their_packages(py311):
    """bwrap and apt-get masked (a machine without them, where nothing would install them): a problem; with
    apt-get there and root, a note (scripts/setup_system.sh installs them next)."""
    masks = ("--ro-bind", "/dev/null", shutil.which("bwrap"))
    apt = shutil.which("apt-get")
    line = one_problem(run("--python", py311, wrap=masks + (("--ro-bind", "/dev/null", apt) if apt else ())))
    assert line == "bwrap not on PATH: apt-get install bubblewrap (or your distribution's packages of those names)"
    if apt and os.geteuid() == 0:
        r = run("--python", py311, wrap=masks)
        assert r.returncode == 0, r.stderr
        assert "preflight: note: bwrap missing: scripts/setup_system.sh installs bubblewrap with apt-get" in r.stdout
        assert one_problem(run("--system-only", wrap=masks)).startswith("bwrap not on PATH")


@needs_bwrap
@pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler to break")
def test_a_compiler_that_cannot_build_is_named_when_llama_cpp_is_to_be_built(py311):
    """No C++ headers (/usr/include masked): with llama.cpp not built for this CPU key, the compile fails."""
    masks = ("--tmpfs", "/usr/include")
    line = one_problem(run("--python", py311, "--cpu-key", "not-built-yet", wrap=masks))
    assert line.startswith("the C++ compiler `c++` cannot build a program (") and "thread" in line
    assert line.endswith("apt-get install g++ (llama.cpp is compiled at setup)")
    cached = run("--python", py311, "--cpu-key", preflight.cpu_key(), wrap=masks)
    if not preflight.llama_needs_build(argparse.Namespace(cpu_key=None, llama_version=preflight.LLAMA_CPP_VERSION)):
        assert cached.returncode == 0, cached.stderr  # built already: no compiler needed


@needs_bwrap
def test_a_small_disk_is_reported_with_what_needs_the_space(tmp_path, py311):
    """A fresh HOME and venv location on a 64 MiB filesystem: the venv, models and caches cannot fit."""
    home = tmp_path / "small"
    home.mkdir()
    r = run("--python", py311, "--venv", str(home / "venv"), wrap=("--size", str(64 << 20), "--tmpfs", str(home)),
            env={"HOME": str(home), "TRINITY_MODEL_CACHE": "", "XDG_CACHE_HOME": "", "PIP_CACHE_DIR": ""})
    line = one_problem(r)
    assert re.match(rf"0\.\d GiB free on {home}, about \d+\.\d GiB needed \(the project venv 4\.5 in {home}/venv, ",
                    line), line
    assert "the embedded models 2.5" in line and line.endswith("to a larger disk")


def test_missing_benchmark_data_is_named_where_the_code_looks(tmp_path, py311):
    line = one_problem(run("--python", py311, "--tests", env={"TRINITY_DATA_DIR": str(tmp_path / "none")}))
    assert line == (f"benchmark data: {tmp_path / 'none'} (TRINITY_DATA_DIR) does not exist: set TRINITY_DATA_DIR "
                    "to the benchmark directory")


def test_dvc_reads_data_root_even_when_trinity_data_dir_is_set(tmp_path, py311):
    """`make run`: the code reads TRINITY_DATA_DIR, DVC's dependency is params.yaml's data.root."""
    real = run("--python", py311, "--tests")  # where the tests find the data on this machine
    root = re.search(r"benchmarks (\S+)", real.stdout)
    assert real.returncode == 0 and root, real.stdout + real.stderr
    params = tmp_path / "params.yaml"
    params.write_text("data:\n  root: ../no-such-benchmarks   # here\n  train: {math500: 1}\n")
    line = one_problem(run("--python", py311, "--pipeline", "--params", str(params),
                           env={"TRINITY_DATA_DIR": root.group(1)}))
    assert line.startswith(f"benchmark data: {(PROJECT / '../no-such-benchmarks').resolve()} (params.yaml data.root, "
                           "which DVC depends on even with TRINITY_DATA_DIR set) does not exist: set data.root")


def test_a_data_root_without_the_benchmarks_the_splits_read(tmp_path, py311):
    root = tmp_path / "bench"
    (root / "math500").mkdir(parents=True)
    (root / "SOURCES.md").write_text("staged benchmarks\n")
    params = tmp_path / "params.yaml"
    params.write_text(f"data:\n  root: {root}\n  train: {{math500: 1, mbpp: 2}}\n  heldout:\n"
                      "    bigcodebench_hard: 2\n    gsm8k: 0\n")
    line = one_problem(run("--python", py311, "--params", str(params)))
    assert line.startswith(f"benchmark data: {root} (params.yaml data.root) lacks bigcodebench, mbpp/, which "
                           "params.yaml's splits read:")


def test_params_data_section_is_read_as_yaml_reads_it():
    """The preflight's own reading of params.yaml (no PyYAML before the venv) against PyYAML's, on the real file."""
    text = (PROJECT / "params.yaml").read_text()
    assert preflight.parse_data_section(text) == yaml.safe_load(text)["data"]


def test_cpu_key_is_the_makefiles():
    shell = subprocess.run("grep -m1 '^flags' /proc/cpuinfo | md5sum | cut -c1-12", shell=True, capture_output=True,
                           text=True, check=True).stdout.strip()
    assert preflight.cpu_key() == shell


def test_make_runs_the_preflight_before_installing_or_building():
    """`make -n -B setup` (nothing executed): the preflight first, then setup_system.sh, then the venv."""
    out = subprocess.run(["make", "-n", "-B", "setup"], cwd=PROJECT, capture_output=True, text=True, check=True).stdout
    steps = [i for i, ln in enumerate(out.splitlines()) if "scripts/preflight.py" in ln and "--which-python" not in ln]
    first = out.splitlines()
    system = next(i for i, ln in enumerate(first) if "scripts/setup_system.sh" in ln)
    venv = next(i for i, ln in enumerate(first) if "-m venv" in ln)
    assert steps and steps[0] < system < venv, out[:2000]
    default = subprocess.run(["make", "-n", "-B"], cwd=PROJECT, capture_output=True, text=True, check=True).stdout
    assert "scripts/setup_system.sh" in default  # `make` alone is still `make setup`
    run_flags = subprocess.run(["make", "-n", "-B", "run"], cwd=PROJECT, capture_output=True, text=True,
                               check=True).stdout
    assert re.search(r"scripts/preflight\.py .*--sandbox --pipeline", run_flags), run_flags[:2000]


def test_pyenv_and_uv_pythons_are_found_where_their_settings_put_them(tmp_path, monkeypatch):
    """PYENV_ROOT and UV_PYTHON_INSTALL_DIR move pyenv's and uv's interpreters out of HOME (a shared pyenv, a CI
    image): the preflight looks there, not only under ~/.pyenv and ~/.local/share/uv."""
    pyenv = tmp_path / "shared-pyenv" / "versions" / "3.10.13" / "bin" / "python3.10"
    uv = tmp_path / "uv-pythons" / "cpython-3.10.14-linux-x86_64-gnu" / "bin" / "python3.10"
    for exe in (pyenv, uv):
        exe.parent.mkdir(parents=True)
        exe.write_text("#!/bin/sh\n")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "shared-pyenv"))
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp_path / "uv-pythons"))
    found = preflight._candidates("3.10")
    assert str(pyenv) in found and str(uv) in found
    monkeypatch.delenv("PYENV_ROOT")
    monkeypatch.delenv("UV_PYTHON_INSTALL_DIR")
    assert str(pyenv) not in preflight._candidates("3.10")  # without them: HOME's own places only
