"""The version of the code that shapes results: part of every resumable run's identity.

A resumed evolution run must be the run that was started: same settings, same tasks, same encoder — and the
same code for everything that turns those into numbers. Which code that is is derived, not listed: the
result-shaping modules are every `trinity` module the stages that produce results can run — the `run` functions of
`trinity/stages/evolve.py` and `trinity/stages/evaluate.py` (ENTRY_POINTS; the flows, `trinity stage` and
`trinity.ops.stage_flow` all run them through `trinity.stages.run_stage`) with the helpers of those modules they
call, then every trinity module those import, transitively. Imports are read statically from the syntax tree: `import
trinity.x`, `from trinity.x import y`, relative imports, imports inside functions, and the `__init__.py` of
every package on the way (it runs on import). A module a stage starts to import is hashed from then on,
without editing any list; the only list is RUNTIME_ONLY, a few modules shown not to shape results (each with
its reason; their own imports are still followed).

`code_version()` hashes those modules' syntax trees with docstrings (every bare string statement) dropped, so
comments, docstrings and
formatting never start a new run, while any change to what the code does does: edit the turn penalty, a
prompt, the sampling seed or the response-store key, and DVC's re-run of `evolve` trains again instead of
saving the old parameters as if retrained. `python -m trinity.code_version` prints the version and the number
of hashed files; `--list` lists them (and the exempt ones, with their reasons).

A pure refactor (same behaviour, different code) can be declared compatible on purpose: run
`python -m trinity.code_version` to print the current version, and add

    COMPATIBLE_REFACTORS = {"<new version>": "<the version it is compatible with>", ...}

with a comment saying what was refactored. The declared version is then used in its place (chains are
followed), so the runs of the old code resume. Declaring a behaviour change compatible is a lie the
results will carry: the test suite's pinned episodes (tests/unit/test_episode_pinned.py) are the check.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent

ENTRY_POINTS: tuple[str, ...] = ("stages.evolve:run", "stages.evaluate:run")
"""Where results are made, as "module:function" relative to the package (a bare "module" means all of it):
the stage functions that train the coordinator and score it. Everything they can import is result-shaping."""

RUNTIME_ONLY: dict[str, str] = {
    "__init__.py": "process settings (OpenMP wait policy) and the package version: timing, not numbers",
    "code_version.py": "this hasher: COMPATIBLE_REFACTORS is declared here, so hashing it would change the "
                       "version a declaration names",
    "pool/task_runner.py": "where never-seen requests are expanded (threads or Dask workers): the same requests, "
                           "the same replies (tests/integration/test_dask_cluster.py compares the two)",
    "redact.py": "removes secrets from error texts and logs; never touches a request, a reply or a score",
}
"""Modules a stage imports that are shown not to shape results: {file relative to the package: why}. Keep it
short; every other module a stage can import is hashed."""

COMPATIBLE_REFACTORS: dict[str, str] = {
    # issue 28 (e.g. 3ade4a1, 6ca2b53, 8259144): Pool.answers_capped added (serving's max_tokens; no stage calls it),
    # config.RUNTIME_ONLY_SETTINGS added (a constant for dvc.yaml's params), and the stages' W&B lineage calls
    # reworked (exact artifact versions; W&B only). No request, reply, key or score changes
    # (tests/unit/test_episode_pinned.py).
    "7ecaa2c28cd37518": "b946c7714f1e17d7",
    # issue 28: the stages' metrics files moved to reports/metrics/<stage>.json (git, not DVC's cache), the store's
    # path may be named explicitly (TRINITY_STORE), and W&B runs record the keys they log (trinity_run.json). Where
    # files are written and what W&B is told; no request, reply, key or score changes
    # (tests/unit/test_episode_pinned.py).
    "062965d3942e7278": "b946c7714f1e17d7",
    # issue 38's review: evolve/validation.py calls episode.is_outage instead of repeating its test, and best_member
    # lets max() keep the first of equals instead of a tie-break key. Same members, scores and selection.
    "9c904284a558f86b": "886d9a3c298f7182",
    # issue 39: the store's writes share one transaction helper so a failed COMMIT (a full disk) raises its own
    # error instead of the ROLLBACK's "no transaction is active", and a state segment whose index rows could not
    # commit is removed. What a successful write stores, and every key, are unchanged (tests/integration/test_store.py).
    "d6f0659fdbaee48e": "9c904284a558f86b",
    # issue 39: llama.cpp compiled once. A llama-server member's key names the server's build from the record beside
    # the binary ("0.3.36", what the binding's version said before) instead of the binding's version, and the
    # in-process engine is refused up front when the binding is not installed. Every key of a built server is
    # unchanged (tests/integration/test_pool_llama_server.py), and so is every request and reply.
    "f431cf20e9fa3c3d": "d6f0659fdbaee48e",
    # issue 40 (structure round two): modules moved and split, nothing rewritten — the pool's member kinds in one
    # table (pool/members.py, with the pool's checks), the sandbox's limits apart from its runners, the training
    # loop apart from its optimisers (evolve/loop.py, optimizer.py, one file per optimiser), the evaluation's records
    # and tables apart from the episodes (evaluation/items.py, summary.py), results.json as pydantic models, env
    # switches read in one place (env.py). Replayed from the store with 0 calls, check_replay: no file differs.
    "8966bb3dea58f922": "f431cf20e9fa3c3d",
    # issue 40: the verdict defined once (trinity/verdict.py: its values, parser, grammar and JSON schema, moved
    # verbatim from roles.py, local.py and openai_wire.py; the grammar text and schema are the same strings).
    "e564999f6df6571c": "8966bb3dea58f922",
    # issue 40, the call path and the rollout tree: the pool knows no role names (coordinator/role_sampling.py asks
    # it for a cap and an output format; the same SamplingParams, so the same keys); the llama-server member holds
    # an HTTP client (pool/openai_client.py) instead of subclassing the OpenAI member; the executor moved into
    # pool/ (task_runner.py, `pool.task_runner`, runtime-only); the step rule of an episode in coordinator/rollout.py
    # (play_episodes asks it what a pick may be and when an episode ends; the same draws); the checkpoint's metadata
    # a typed record (the same JSON). Every key, request body and pinned episode compared old vs new; replayed.
    "cec286eeeace55cf": "e564999f6df6571c",
    # issue 40: the step rule gives a whole turn's role masks at once (`StepRule.role_masks`: the loop's np.tile
    # again, as before the rule moved); the same masks (tests/unit/test_rollout.py, the pinned episodes).
    "56c59a86a85e5c19": "cec286eeeace55cf",
    # issue 40's second read: the loop and the exact path enumerator take their pick distributions from one function
    # (head.pick_probs: the same softmax of the same logits), and settings and checkpoint metadata name their
    # validation errors through one formatter (config.validation_problems). Same draws, keys and scores.
    "ca53125be984e360": "56c59a86a85e5c19",
}
"""Declared-compatible code versions: {new version: version it behaves like}. See the module doc."""

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _is_string_statement(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    """Drop every statement that is a bare string: docstrings of modules, classes and functions, and the attribute
    docstrings under a setting or a constant (a string statement does nothing wherever it stands)."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if isinstance(body, list) and any(_is_string_statement(s) for s in body):
                kept = [s for s in body if not _is_string_statement(s)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
    return tree


def _parse(f: Path) -> ast.Module:
    try:
        return ast.parse(f.read_text(), filename=str(f))
    except SyntaxError as e:
        raise SyntaxError(f"code_version: cannot parse {f}: {e}") from None


def _module_file(package: Path, module: str) -> Path | None:
    """The file of dotted `module` inside `package` (its __init__.py for a package), None if it is no module."""
    parts = module.split(".")
    if parts[0] != package.name:
        return None
    base = package.joinpath(*parts[1:])
    for p in (base / "__init__.py", base.with_suffix(".py") if len(parts) > 1 else None):
        if p is not None and p.is_file():
            return p
    return None


def _imports(nodes: Iterable[ast.AST], module: str, is_package: bool) -> set[str]:
    """Every dotted name the import statements under `nodes` may load (`from a import b`: a and a.b)."""
    out: set[str] = set()
    for root in nodes:
        for n in ast.walk(root):
            if isinstance(n, ast.Import):
                out.update(a.name for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                if n.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[:len(base) - (n.level - 1)]
                    mod = ".".join([*base, *([n.module] if n.module else [])])
                else:
                    mod = n.module or ""
                out.add(mod)
                out.update(f"{mod}.{a.name}" for a in n.names if a.name != "*")
    return out


def _scoped(tree: ast.Module, functions: set[str], module: str) -> list[ast.AST]:
    """The parts of an entry module that its entry functions run: its module-level statements (decorators
    included), the entry functions and, transitively, the module's functions and classes they name."""
    defs = {n.name: n for n in tree.body if isinstance(n, _DEFS)}
    nodes: list[ast.AST] = [n for n in tree.body if not isinstance(n, _DEFS)]
    nodes += [d for n in defs.values() for d in n.decorator_list]
    missing = functions - defs.keys()
    if missing:
        raise ValueError(f"code_version: entry point {module}:{sorted(missing)[0]} does not exist (ENTRY_POINTS)")
    todo, seen = [*functions, *(x.id for n in list(nodes) for x in ast.walk(n) if isinstance(x, ast.Name))], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in defs:
            continue
        seen.add(name)
        nodes.append(defs[name])
        todo += [x.id for x in ast.walk(defs[name]) if isinstance(x, ast.Name)]
    return nodes


def _module_name(package: Path, f: Path) -> str:
    parts = f.relative_to(package).with_suffix("").parts
    return ".".join((package.name, *(parts[:-1] if parts[-1] == "__init__" else parts)))


def imported_files(package: Path = PACKAGE, entries: Iterable[str] = ENTRY_POINTS,
                   stop: Iterable[str] = ()) -> list[Path]:
    """Every file of `package` the entry points can run (see the module doc), exempt ones included. `stop`: files
    (relative to the package) neither included nor followed (tests/integration/test_results_integrity.py's DVC-deps
    check leaves W&B logging out this way)."""
    stopped = {package / rel for rel in stop}
    roots: dict[str, set[str] | None] = {}
    for e in entries:
        mod, _, fn = e.partition(":")
        name = ".".join((package.name, *mod.split("."))) if mod else package.name
        if _module_file(package, name) is None:
            raise FileNotFoundError(f"code_version: entry point {e!r}: no module {name} in {package}")
        if not fn:
            roots[name] = None
        elif roots.get(name, set()) is not None:
            roots.setdefault(name, set()).add(fn)
    seen: set[Path] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        f = _module_file(package, module)
        if f is None or f in seen or f in stopped:
            continue
        seen.add(f)
        module = _module_name(package, f)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # a package's __init__ runs first
        tree = _parse(f)
        nodes = [tree] if roots.get(module) is None else _scoped(tree, roots[module], module)
        todo += [m for m in _imports(nodes, module, f.name == "__init__.py") if m.split(".")[0] == package.name]
    return sorted(seen)


def source_files(package: Path = PACKAGE, entries: Iterable[str] = ENTRY_POINTS,
                 exempt: Mapping[str, str] | Iterable[str] = RUNTIME_ONLY) -> list[Path]:
    """The result-shaping source files, in a stable order: what the entry points import, less the exempt."""
    skip = {package / r for r in exempt}
    for p in skip:
        if not p.is_file():
            raise FileNotFoundError(f"code_version: exempt module {p} is missing (see RUNTIME_ONLY)")
    return [f for f in imported_files(package, entries) if f not in skip]


def raw_code_version(package: Path = PACKAGE, entries: Iterable[str] = ENTRY_POINTS,
                     exempt: Mapping[str, str] | Iterable[str] = RUNTIME_ONLY) -> str:
    """sha256 over (relative path, docstring-free AST dump) of every result-shaping file (16 hex chars)."""
    h = hashlib.sha256()
    for f in source_files(package, entries, exempt):
        h.update(f.relative_to(package).as_posix().encode())
        h.update(b"\0")
        h.update(ast.dump(_strip_docstrings(_parse(f)), annotate_fields=False, include_attributes=False).encode())
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


def run_id(settings, stage: str) -> str:
    """A run's id in the store's episodes table and in W&B: the stage, the settings and the code version, so runs
    of different code never share an id."""
    return f"{stage}-{settings.params_hash()[:12]}-{code_version()[:8]}"


@functools.lru_cache(maxsize=None)
def code_version() -> str:
    """The version of the result-shaping code that runs in this process (declared refactors resolved)."""
    return resolve_compatible(raw_code_version())


if __name__ == "__main__":
    files = source_files()
    print(f"code version {code_version()} (raw {raw_code_version()}; {len(files)} result-shaping files)")
    if "--list" in sys.argv[1:]:
        for f in files:
            print(f"  {f.relative_to(PACKAGE).as_posix()}")
        print("not hashed (RUNTIME_ONLY):")
        for rel, why in RUNTIME_ONLY.items():
            print(f"  {rel}: {why}")
