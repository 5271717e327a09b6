"""The code version covers every module the result-producing stages import (derived, not listed), and the run
fingerprint names a local member's GGUF by its content, not its path."""
import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trinity import code_version as cv
from trinity.config import PROJECT_ROOT, PoolMember, PoolSettings, Settings
from trinity.coordinator.head import HeadShape, ParamLayout

SRC = PROJECT_ROOT / "src" / "trinity"


def _copy_package(tmp_path) -> Path:
    dst = tmp_path / "trinity"
    shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _sub(path: Path, pattern: str, repl: str) -> None:
    text = path.read_text()
    new, n = re.subn(pattern, repl, text, count=1)
    assert n == 1, f"{path}: {pattern!r} not found"
    path.write_text(new)


# ------------------------------------------------------------------ what is hashed is derived from the imports
def test_a_module_a_stage_starts_to_import_is_hashed_without_editing_any_list(tmp_path):
    pkg = _copy_package(tmp_path)
    (pkg / "shaping.py").write_text("SCALE = 1\n")
    base = cv.raw_code_version(pkg)
    assert pkg / "shaping.py" not in cv.source_files(pkg)  # nothing imports it yet
    (pkg / "shaping.py").write_text("SCALE = 2\n")
    assert cv.raw_code_version(pkg) == base
    _sub(pkg / "stages/evolve.py", r"(\ndef run\(settings: Settings.*:\n)", r"\1    from trinity.shaping import SCALE\n")
    assert pkg / "shaping.py" in cv.source_files(pkg)
    v = cv.raw_code_version(pkg)
    (pkg / "shaping.py").write_text("SCALE = 3\n")
    assert cv.raw_code_version(pkg) not in {base, v}


@pytest.mark.parametrize("rel, pattern, repl", [
    ("pool/runtime.py", r"\bseed=0\b", "seed=1"),  # the sampling seed of every call
    ("coordinator/role_sampling.py", r"Role\.VERIFIER\.value: c\.verifier_max_tokens",
     "Role.VERIFIER.value: c.verifier_max_tokens // 2"),  # role caps
    ("store.py", r'key = \{"model": model_id,', 'key = {"model_id": model_id,'),  # the response-store key
    ("pool/openai_compat.py", r"\Z", "\n_EXTRA_HEADER = 1\n"),  # the HTTP member (edited elsewhere: append)
    ("pool/bundled.py", r'"b179c9523d0e', '"0179c9523d0e'),  # a bundled model's pinned hash
    ("evaluation/run.py", r"\Z", "\n_SHAPES = 1\n"),  # the evaluate stage's scoring
])
def test_code_that_shapes_replies_or_scores_changes_the_version(tmp_path, rel, pattern, repl):
    pkg = _copy_package(tmp_path)
    base = cv.raw_code_version(pkg)
    _sub(pkg / rel, pattern, repl)
    assert cv.raw_code_version(pkg) != base, f"editing {rel} did not change the code version"


def test_runtime_only_and_other_stages_code_do_not_change_the_version(tmp_path):
    pkg = _copy_package(tmp_path)
    base = cv.raw_code_version(pkg)
    for rel in ("ops/tracking.py", "pool/task_runner.py", "evaluation/report/tables.py", "ops/stage_flow.py",
                "cli/__init__.py", "__init__.py"):
        _sub(pkg / rel, r"\Z", "\n_UNUSED = 1\n")
    _sub(pkg / "code_version.py", r"COMPATIBLE_REFACTORS: dict\[str, str\] = \{",  # one declaration more
         'COMPATIBLE_REFACTORS: dict[str, str] = {"0123456789abcdef": "fedcba9876543210", ')
    assert cv.raw_code_version(pkg) == base


def test_imports_are_followed_statically_everywhere(tmp_path):
    """A tiny package: relative and absolute imports, imports inside functions, helpers the entry calls, a package's
    __init__; what only another stage function imports is not followed, what an exempt module imports is."""
    pkg = tmp_path / "trinity"
    files = {
        "__init__.py": "",
        "stages.py": ("from trinity import top\n"
                      "def _helper():\n    from .sub import deep\n"
                      "def evolve():\n    import trinity.inner\n    return _helper()\n"
                      "def report():\n    from trinity import other_stage\n"),
        "top.py": "X = 1\n", "inner.py": "def f():\n    from . import engine\n",
        "engine.py": "from trinity.via_exempt import y\n", "via_exempt.py": "y = 1\n",
        "sub/__init__.py": "", "sub/deep.py": "from ..leaf import z\nfrom .. import leaf2\n",
        "leaf.py": "z = 1\n", "leaf2.py": "", "other_stage.py": "", "unused.py": "",
    }
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    got = {f.relative_to(pkg).as_posix() for f in cv.source_files(pkg, ("stages:evolve",), {"engine.py": "runtime"})}
    assert got == {"__init__.py", "stages.py", "top.py", "inner.py", "via_exempt.py", "sub/__init__.py",
                   "sub/deep.py", "leaf.py", "leaf2.py"}
    with pytest.raises(ValueError, match="stages:nope"):
        cv.source_files(pkg, ("stages:nope",), {})
    with pytest.raises(FileNotFoundError, match="gone.py"):
        cv.source_files(pkg, ("stages:evolve",), {"gone.py": "stale"})


def test_every_exemption_is_imported_by_a_stage_and_says_why():
    reached = set(cv.imported_files())
    for rel, why in cv.RUNTIME_ONLY.items():
        assert cv.PACKAGE / rel in reached, f"RUNTIME_ONLY {rel}: no stage imports it, drop it from the list"
        assert why.strip()
    hashed = {f.relative_to(cv.PACKAGE).as_posix() for f in cv.source_files()}
    assert {"stages/evolve.py", "stages/evaluate.py", "stages/common.py", "store.py", "pool/runtime.py",
            "pool/openai_compat.py", "pool/local.py", "evaluation/run.py", "coordinator/episode.py",
            "evolve/sep_cma.py"} <= hashed
    assert not hashed & {"evaluation/report/tables.py", "ops/stage_flow.py", "cli/__init__.py", "ops/tracking.py",
                          "code_version.py"}


def test_module_cli_prints_the_version_and_lists_the_files():
    out = subprocess.run([sys.executable, "-m", "trinity.code_version", "--list"], capture_output=True, text=True,
                         check=True, cwd=PROJECT_ROOT).stdout
    assert f"code version {cv.code_version()} " in out and f"; {len(cv.source_files())} result-shaping files)" in out
    assert "\n  pool/runtime.py\n" in out and "\n  pool/task_runner.py: " in out


# ------------------------------------------------------------------ the run fingerprint names a GGUF by content
def _fingerprint(*models: str) -> str:
    from trinity.evolve.loop import run_fingerprint

    s = Settings(pool=PoolSettings(members=[PoolMember(name=f"m{i}", backend="local", model=m)
                                            for i, m in enumerate(models)]))
    return run_fingerprint(s, ParamLayout(HeadShape(len(models), 8)), [], "enc", code="c")


def test_fingerprint_holds_a_user_gguf_content_hash_not_its_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TRINITY_MODEL_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "model.gguf", tmp_path / "b" / "renamed.gguf"
    for p in (a, b):
        p.parent.mkdir()
        p.write_bytes(b"GGUF fake weights")
    assert _fingerprint(str(a)) == _fingerprint(str(b))  # the same file, moved: the same run
    before = _fingerprint(str(a))
    a.write_bytes(b"GGUF other weights")
    st = a.stat()
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert _fingerprint(str(a)) != before  # replaced weights under the same path: a new run
    assert _fingerprint(str(a), "smollm2-135m-instruct") != _fingerprint(str(b), "smollm2-135m-instruct")


def test_fingerprint_of_a_bundled_model_uses_its_pinned_hash(tmp_path, monkeypatch):
    from trinity.pool.bundled import PINNED_SHA256

    monkeypatch.setenv("TRINITY_MODEL_CACHE", str(tmp_path / "cache"))
    same = tmp_path / "smollm2.gguf"
    same.write_bytes(b"not the real file")
    # pretend this is the bundled file: no model is assembled or read
    monkeypatch.setitem(PINNED_SHA256, "smollm2-135m-instruct", hashlib.sha256(same.read_bytes()).hexdigest())
    assert _fingerprint("smollm2-135m-instruct") == _fingerprint(str(same))
    assert _fingerprint("x") != _fingerprint("y")  # no such file: named as written (the pool fails to load it)
