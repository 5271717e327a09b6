"""llama.cpp is compiled once for what the default needs: `make setup` builds llama-server (the default engine) and
not the Python binding, which only `setup-in-process` builds (the tests, the benches, `engine: in-process`); the
server's build script rebuilds a binary only when the sources it records are not the pinned ones."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "scripts" / "build_llama_server.sh"


def dry_run(goal: str) -> str:
    """The commands `make <goal>` would run from nothing (-B: every target out of date; -n: none runs)."""
    r = subprocess.run(["make", "-n", "-B", goal], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MAKEFLAGS": ""})
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_run_compiles_llama_cpp_once_and_the_tests_add_the_binding():
    run = dry_run("run")
    assert "build_llama_server.sh" in run  # the default engine's server
    assert "pip wheel" not in run and "llama_cpp_python" not in run and "llama-cpp-python==" not in run
    test = dry_run("test")
    assert "build_llama_server.sh" in test and "pip wheel" in test  # the tests use the binding too
    assert test.index("build_llama_server.sh") < test.index("pip wheel")  # the sdist the server build fetched
    assert "build_llama_server.sh --sdist" in test  # one download of the sources, written once


def test_the_sources_are_downloaded_without_building_their_build_dependencies(tmp_path):
    """`pip download --no-binary :all:` builds every build dependency of the sdist's metadata step from source
    (scikit-build-core, hatchling, pluggy, ...): minutes on an empty pip cache, seen on a fresh HOME. Only the
    sdist itself is asked for as source; a stand-in pip records what it is asked."""
    args = tmp_path / "args"
    pip = tmp_path / "pip"
    pip.write_text(f'#!/bin/sh\necho "$@" > {args}\nwhile [ "$1" != "-d" ]; do shift; done\n'
                   'touch "$2/llama_cpp_python-0.3.36.tar.gz"\n')
    pip.chmod(0o755)
    r = subprocess.run(["bash", str(BUILD), "--sdist"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HOME": str(tmp_path), "PIP": str(pip)})
    assert r.returncode == 0, r.stderr
    sdist = tmp_path / ".cache/trinity/llama-server/sdist/llama_cpp_python-0.3.36.tar.gz"
    assert r.stdout.strip() == str(sdist) and sdist.exists()
    asked = args.read_text().split()
    assert asked[asked.index("--no-binary") + 1] == "llama-cpp-python", asked
    args.unlink()  # downloaded once: a second call asks pip nothing
    assert subprocess.run(["bash", str(BUILD), "--sdist"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(tmp_path), "PIP": str(pip)}).stdout.strip() == str(sdist)
    assert not args.exists()
    assert "llama-cpp-python" not in (ROOT / "requirements.lock").read_text().replace(
        "llama-cpp-python (0.3.36", "")  # only named in the header: `make setup` does not install it


def cpu_key() -> str:
    with open("/proc/cpuinfo") as f:
        line = next((ln for ln in f if ln.startswith("flags")), "")
    return hashlib.md5(line.encode()).hexdigest()[:12]


@pytest.fixture
def home_with_a_server(tmp_path):
    """A HOME whose cache holds a "built" llama-server for this CPU (a stand-in: the script never runs it)."""
    dest = tmp_path / ".cache" / "trinity" / "llama-server" / f"cpu-{cpu_key()}"
    dest.mkdir(parents=True)
    binary = dest / "llama-server"
    binary.write_text("#!/bin/sh\necho stand-in\n")
    binary.chmod(0o755)
    return tmp_path, binary


def build(home: Path, version: str = "0.3.36"):
    # PIP=false: a build that would start fails at once at the sdist's download (no sdist in this HOME)
    return subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(home), "PIP": "false", "LLAMA_CPP_VERSION": version})


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo")
def test_the_server_is_rebuilt_only_when_its_recorded_sources_are_not_the_pinned_ones(home_with_a_server):
    home, binary = home_with_a_server
    record = binary.with_name("llama-server.source")
    record.write_text("llama-cpp-python==0.3.36\n")
    r = build(home)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(binary) and "already built from llama-cpp-python==0.3.36" in r.stderr

    r = build(home, version="0.3.99")  # the pin moved: the cached binary is not that llama.cpp
    assert r.returncode != 0 and "was built from llama-cpp-python==0.3.36, not llama-cpp-python==0.3.99: " \
        "rebuilding" in r.stderr, r.stderr
    assert r.stdout == ""  # no path handed out for a binary of other sources
    assert binary.read_text().startswith("#!/bin/sh") and record.read_text() == "llama-cpp-python==0.3.36\n"

    record.unlink()  # built before the record existed: its sources are unknown
    r = build(home)
    assert r.returncode != 0 and "unrecorded sources" in r.stderr, r.stderr
