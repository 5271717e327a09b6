"""The version of the code that shapes results: part of every resumable run's identity.

A resumed evolution run must be the run that was started: same settings, same tasks, same encoder — and the
same code for everything that turns those into numbers: the role prompts, the episode loop and the reward
(`coordinator/`), the graders (`grading/`), the optimisers (`evolve/`, but for the expansion engine, which
only decides where calls run) and the local members' prompt rendering (`pool/local.py`). `code_version()`
hashes those modules' syntax trees with docstrings dropped, so comments, docstrings and formatting never
start a new run, while any change to what the code does does: edit the turn penalty or a prompt, and DVC's
re-run of `evolve` trains again instead of saving the old parameters as if retrained.

A pure refactor (same behaviour, different code) can be declared compatible on purpose: run
`python -m trinity.code_version` to print the current version, and add

    COMPATIBLE_REFACTORS = {"<new version>": "<the version it is compatible with>", ...}

with a comment saying what was refactored. The declared version is then used in its place (chains are
followed), so the runs of the old code resume. Declaring a behaviour change compatible is a lie the
results will carry: the test suite's reference episodes (tests/test_episode_hotpath.py) are the check.
"""
from __future__ import annotations

import ast
import functools
import hashlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent

RESULT_SHAPING: tuple[str, ...] = ("coordinator", "grading", "evolve", "pool/local.py", "records.py")
"""Modules (files or packages, relative to the trinity package) whose code shapes a run's results."""
RUNTIME_ONLY: tuple[str, ...] = ("evolve/engine.py", "grading/check.py", "evolve/known_answer.py")
"""Inside RESULT_SHAPING but not shaping results: where calls run; the grader self-check command; the scripted
known-answer problem of bench/learnability.py (no pipeline stage imports it)."""

COMPATIBLE_REFACTORS: dict[str, str] = {}
"""Declared-compatible code versions: {new version: version it behaves like}. See the module doc."""


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def source_files(package: Path = PACKAGE) -> list[Path]:
    """The result-shaping source files, in a stable order."""
    files: set[Path] = set()
    for rel in RESULT_SHAPING:
        p = package / rel
        if p.is_dir():
            files.update(p.rglob("*.py"))
        elif p.exists():
            files.add(p)
        else:
            raise FileNotFoundError(f"code_version: result-shaping module {p} is missing (see RESULT_SHAPING)")
    skip = {package / r for r in RUNTIME_ONLY}
    return sorted(f for f in files if f not in skip)


def raw_code_version(package: Path = PACKAGE) -> str:
    """sha256 over (relative path, docstring-free AST dump) of every result-shaping file (16 hex chars)."""
    h = hashlib.sha256()
    for f in source_files(package):
        try:
            tree = ast.parse(f.read_text(), filename=str(f))
        except SyntaxError as e:
            raise SyntaxError(f"code_version: cannot parse {f}: {e}") from None
        h.update(f.relative_to(package).as_posix().encode())
        h.update(b"\0")
        h.update(ast.dump(_strip_docstrings(tree), annotate_fields=False, include_attributes=False).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def resolve_compatible(version: str, declared: dict[str, str] | None = None) -> str:
    """Follow COMPATIBLE_REFACTORS from `version` to the version it was declared to behave like."""
    declared = COMPATIBLE_REFACTORS if declared is None else declared
    seen = [version]
    while version in declared:
        version = declared[version]
        if version in seen:
            raise ValueError(f"COMPATIBLE_REFACTORS has a cycle: {' -> '.join(seen + [version])}")
        seen.append(version)
    return version


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """The version of the result-shaping code that runs in this process (declared refactors resolved)."""
    return resolve_compatible(raw_code_version())


if __name__ == "__main__":
    raw = raw_code_version()
    print(f"code version {code_version()} (raw {raw}; {len(source_files())} result-shaping files)")
