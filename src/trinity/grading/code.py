"""Grade a model's code answer by running the benchmark's tests in the sandbox.

`grade_code(task, completion_text)` → 1.0 (all tests pass) or 0.0. `grade_code_detail` says why.

How each benchmark is run (dispatch on `task.source`, else on `metadata["test_format"]`):

* humaneval — the function prompt, then the model's code, then the `check` code, then
  `check(<entry_point>)`. A model that answers with the whole function redefines the prompt's stub
  (the prompt's imports and helper functions stay); one that answers with the body only continues
  the prompt, as in the original harness.
* mbpp — the model's code, then the setup code and the assert lines.
* livecodebench — "stdin" problems: the program runs once per test case with the input on stdin, and
  its stdout must match the expected output line by line (whitespace-trimmed; tokens compared as
  decimals when the text differs), as LiveCodeBench's runner does. "functional" problems:
  `Solution().<fn_name>(*args)` per case with JSON-decoded arguments; a tuple counts as a list. Both
  get LiveCodeBench's import prelude.
* bigcodebench, bigcodebench_hard — the task's `code_prompt` with a `pass` body, then the model's
  code (BigCodeBench's "calibrated" setting), then the unittest `TestCases` class, executed as the
  module `__test__`, stdout/stderr swallowed and stdin closed, in a fresh temporary directory, with
  the interpreter of the sandbox venv (scripts/setup_sandbox_env.sh). Pass iff every test passes.

Trust: the verdict is never "the process exited 0". The host sends a random nonce and the test
data on stdin; the harness reads them before any model code runs and prints the nonce only after
the tests passed, then leaves with os._exit(0). A program that exits early (sys.exit(0),
os._exit(0), killing its parent), prints a fake marker, or reads the tests from a file therefore
fails. (The model's code runs in the same process as the harness, so code written on purpose to
search the harness's memory for the nonce could still forge a pass; nothing in benchmarks or
ordinary model output does that.)
"""
from __future__ import annotations

import ast
import json
import re
import secrets
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from pathlib import Path
from typing import Any

from trinity.grading.sandbox import Sandbox, SandboxResult, SandboxUnavailable, sandbox_python
from trinity.records import Task

PASS_MARKER = "TRINITY-TESTS-PASSED"

# LiveCodeBench prepends this to every program (lcb_runner/evaluation/testing_util.py).
LCB_PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)

# BigCodeBench: its own evaluation allows 240 s per task (some canonical solutions wait on timeouts).
TIMEOUTS_S = {"humaneval": 10.0, "mbpp": 10.0, "livecodebench": 6.0, "bigcodebench": 240.0}


@dataclass(frozen=True)
class CodeVerdict:
    """passed, and a one-line reason when not (or a note when passed)."""

    passed: bool
    reason: str = ""
    wall_s: float = 0.0

    @property
    def score(self) -> float:
        return 1.0 if self.passed else 0.0


def grade_code(task: Task, completion_text: str | None, *, sandbox: Sandbox | None = None) -> float:
    """1.0 when the code in `completion_text` passes all of `task`'s tests, else 0.0."""
    return grade_code_detail(task, completion_text, sandbox=sandbox).score


def grade_code_detail(task: Task, completion_text: str | None, *, sandbox: Sandbox | None = None) -> CodeVerdict:
    """The verdict with its reason. Raises SandboxUnavailable when the sandbox cannot run (a missing
    sandbox is a setup error, not a wrong answer)."""
    if not completion_text:
        return CodeVerdict(False, "no answer")
    kind = code_kind(task)
    entry = task.metadata.get("entry_point")
    if kind == "livecodebench" and task.metadata.get("testtype") == "functional":
        entry = "Solution"
    code = extract_code(completion_text, entry_point=entry)
    if not code.strip():
        return CodeVerdict(False, "no code in the answer")
    sb = sandbox or default_sandbox(kind)
    if kind == "humaneval":
        return _run_harness(sb, "humaneval", {
            "solution": _with_prefix(task.metadata.get("function_prompt", ""), code, entry, needs_pass=False),
            "tests": task.tests or "", "entry_point": entry})
    if kind == "mbpp":
        return _run_harness(sb, "assert", {"solution": code, "tests": task.tests or ""})
    if kind == "bigcodebench":
        return _run_harness(sb, "unittest", {
            "solution": _with_prefix(task.metadata.get("code_prompt", ""), code, entry, needs_pass=True),
            "tests": task.tests or ""})
    if kind == "livecodebench":
        tests = json.loads(task.tests or "[]")
        if not tests:
            return CodeVerdict(False, "task has no tests")
        if task.metadata.get("testtype") == "functional":
            return _run_harness(sb, "functional", {
                "solution": LCB_PRELUDE + "\n" + code, "fn_name": task.metadata.get("fn_name"),
                "cases": [[t["input"], t["output"]] for t in tests]},
                timeout_s=min(120.0, sb.timeout_s * len(tests)))
        return _grade_stdio(sb, LCB_PRELUDE + "\n" + code, tests)
    raise ValueError(f"no code grader for source {task.source!r} (test_format {task.metadata.get('test_format')!r})")


def code_kind(task: Task) -> str:
    src = task.source
    if src in ("humaneval", "mbpp", "livecodebench"):
        return src
    if src.startswith("bigcodebench"):
        return "bigcodebench"
    fmt = task.metadata.get("test_format")
    return {"humaneval": "humaneval", "assert": "mbpp", "io": "livecodebench", "unittest": "bigcodebench"}.get(
        fmt, src)


# ----------------------------------------------------------------------------------------------
# Sandboxes per benchmark


@lru_cache(maxsize=None)
def default_sandbox(kind: str) -> Sandbox:
    """The sandbox a benchmark's code runs in (BigCodeBench: the sandbox venv with its libraries)."""
    if kind == "bigcodebench":
        py = sandbox_python()
        if py is None:
            raise SandboxUnavailable(
                "the BigCodeBench sandbox venv is missing: run scripts/setup_sandbox_env.sh "
                "(or set TRINITY_SANDBOX_VENV to a venv built by it)")
        venv = Path(py).parent.parent
        env = [("TZ", "UTC"), ("TF_ENABLE_ONEDNN_OPTS", "0"), ("MPLCONFIGDIR", "/tmp/mplconfig")]
        # matplotlib's font list, built once by the setup script: saves ~1 s per program.
        binds = [(str(f), f"/tmp/mplconfig/{f.name}") for f in sorted(venv.glob("share/trinity/mplconfig/fontlist-*.json"))]
        if (venv / "nltk_data").is_dir():  # only where the setup could download it (needs internet)
            env.append(("NLTK_DATA", str(venv / "nltk_data")))
        return Sandbox(
            python=py, timeout_s=TIMEOUTS_S["bigcodebench"], memory_mb=16384, rss_limit_mb=4096,
            max_procs=512, tmpfs_mb=1024, max_file_mb=512, max_open_files=1024,
            env=tuple(env), ro_binds=tuple(binds),
        )
    return Sandbox(timeout_s=TIMEOUTS_S.get(kind, 10.0))


# ----------------------------------------------------------------------------------------------
# Code extraction

_FENCE_LINE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)[^\n]*$", re.M)
_PY_LANGS = {"python", "py", "python3", "py3", "python 3", "pycon", "ipython"}


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code of a model's answer: the fenced Python block that defines `entry_point` (the last
    such), else the longest Python block; unlabelled blocks count when no block is labelled Python;
    an unclosed final fence (a cut-off answer) counts as closed; no fences → the text itself.
    Reasoning in <think>…</think> is dropped first."""
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    blocks: list[tuple[str, str]] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _FENCE_LINE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m.group(1), m.group(2).strip().lower()
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            m2 = _FENCE_LINE.match(lines[j])
            if m2 and m2.group(1)[0] == fence[0] and len(m2.group(1)) >= len(fence) and not m2.group(2):
                break
            body.append(lines[j])
            j += 1
        blocks.append((lang, "\n".join(body).strip("\n")))
        i = j + 1
    if not blocks:
        return text.strip("\n")
    py = [b for lang, b in blocks if lang in _PY_LANGS]
    if not py:
        py = [b for lang, b in blocks if lang == ""]
    if not py:
        return ""
    if entry_point:
        pat = re.compile(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(entry_point)}\b", re.M)
        defining = [b for b in py if pat.search(b)]
        if defining:
            return defining[-1]
    return max(py, key=len)


def _defines(code: str, name: str | None) -> bool | None:
    """Whether `code` parses and defines `name` at top level (None when it does not parse)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return None
    if not name:
        return True
    return any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
               for n in tree.body)


def _with_prefix(prefix: str, code: str, entry: str | None, *, needs_pass: bool) -> str:
    """prefix (imports + stub) then the model's whole program; or prefix + body (continuation)."""
    if not prefix:
        return code
    if _defines(code, entry):
        stub = prefix.rstrip("\n") + ("\n    pass\n" if needs_pass else "\n")
        return stub + "\n\n" + code
    return prefix + code  # the answer continues the prompt (a function body)


# ----------------------------------------------------------------------------------------------
# Running: the in-sandbox harness and the host-side verdict

_HARNESS = r'''
import os, sys, io, json, types, traceback, builtins

def _summary(trace):
    """The exception line of a formatted traceback, plus a little of its message."""
    import re
    lines = trace.strip().splitlines() or ["?"]
    pat = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Warning|Failure|Interrupt)\b")
    at = max((i for i, l in enumerate(lines) if pat.match(l)), default=len(lines) - 1)
    rest = [l.strip() for l in lines[at + 1:] if l.strip() and set(l.strip()) != {"*"}]
    return " ".join([lines[at].strip()] + rest[:2])[:300]


def _main():
    raw = sys.stdin.buffer.readline()
    payload = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    nonce = raw.decode().strip()
    sys.stdin = io.StringIO("")
    out_fd = os.dup(1)
    mode = payload["mode"]

    class _Sink(io.StringIO):
        def write(self, s):
            return len(s)

    def source(name, text):
        import linecache
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)  # lines in tracebacks
        return compile(text, name, "exec")

    def passed():
        os.write(out_fd, ("\n%s %s\n" % (payload["marker"], nonce)).encode())
        os._exit(0)

    def fail(msg):
        sys.__stderr__.write(msg.rstrip() + "\n")
        sys.__stderr__.flush()
        os._exit(1)

    try:
        if mode in ("humaneval", "assert", "functional"):
            ns = {"__name__": "__solution__", "__builtins__": builtins}
            sys.stdout = _Sink()
            sys.stderr = _Sink()
            exec(source("solution.py", payload["solution"]), ns)
            if mode == "humaneval":
                exec(source("tests.py", payload["tests"]), ns)
                ns["check"](ns[payload["entry_point"]])
            elif mode == "assert":
                exec(source("tests.py", payload["tests"]), ns)
            else:
                if "Solution" not in ns:
                    fail("no class Solution defined")
                method = getattr(ns["Solution"](), payload["fn_name"])
                for k, (inp, out) in enumerate(payload["cases"]):
                    args = [json.loads(line) for line in inp.split("\n")]
                    got = method(*args)
                    if isinstance(got, tuple):
                        got = list(got)
                    want = json.loads(out)
                    if got != want:
                        fail("wrong answer on case %d: got %.200r, want %.200r" % (k, got, want))
            passed()
        elif mode == "unittest":
            import tempfile, unittest
            os.chdir(tempfile.mkdtemp())
            mod = types.ModuleType("__test__")
            mod.__dict__.update({"__builtins__": builtins, "__file__": "__test__.py", "__package__": None,
                                 "__doc__": None, "sys": sys, "os": os, "environ": os.environ})
            builtins.exit = None
            builtins.quit = None
            sys.stdout = _Sink()
            sys.stderr = _Sink()
            exec(source("__test__.py", payload["solution"] + "\n" + payload["tests"]), mod.__dict__)
            sys.modules["__test__"] = mod
            suite = unittest.TestLoader().loadTestsFromTestCase(mod.TestCases)
            result = unittest.TestResult()
            suite.run(result)
            issues = result.failures + result.errors
            if issues:
                fail("; ".join("%s: %s" % (t.id().split(".")[-1], _summary(tr)) for t, tr in issues))
            passed()
        else:
            fail("unknown harness mode %r" % (mode,))
    except BaseException as e:
        tb = traceback.format_exception(type(e), e, e.__traceback__)
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != __file__]
        where = ("%s:%s %s | " % (frames[-1].filename, frames[-1].lineno, (frames[-1].line or "")[:120])
                 if frames else "")
        fail(where + _summary("".join(tb)))

_main()
'''


def _run_harness(sb: Sandbox, mode: str, payload: dict[str, Any], timeout_s: float | None = None) -> CodeVerdict:
    nonce = secrets.token_hex(16)
    body = dict(payload, mode=mode, marker=PASS_MARKER)
    stdin = nonce + "\n" + json.dumps(body)
    r = sb.run(_HARNESS, stdin=stdin, timeout_s=timeout_s)
    return _verdict(r, nonce)


def _verdict(r: SandboxResult, nonce: str) -> CodeVerdict:
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    if r.ok and lines and lines[-1].strip() == f"{PASS_MARKER} {nonce}":
        return CodeVerdict(True, "", r.wall_s)
    return CodeVerdict(False, _reason(r), r.wall_s)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _reason(r: SandboxResult) -> str:
    if r.killed_reason:
        return f"killed: {r.killed_reason} after {r.wall_s:.1f}s"
    err = [ln for ln in _ANSI.sub("", r.stderr).strip().splitlines() if ln.strip()]
    tail = " | ".join(err[-2:]) if err else ""
    if r.exit_code == 0:
        return "exited before the tests finished" + (f": {tail}" if tail else "")
    return (tail or f"exit code {r.exit_code}")[:600]


def _stdout_matches(got: str, want: str) -> bool:
    g = [ln.strip() for ln in got.strip().split("\n")]
    w = [ln.strip() for ln in want.strip().split("\n")]
    if len(g) != len(w):
        return False
    for a, b in zip(g, w):
        if a == b:
            continue
        try:
            if [Decimal(x) for x in a.split()] != [Decimal(x) for x in b.split()]:
                return False
        except (InvalidOperation, ValueError):
            return False
    return True


def _grade_stdio(sb: Sandbox, program: str, tests: list[dict[str, str]]) -> CodeVerdict:
    wall = 0.0
    for k, t in enumerate(tests):
        r = sb.run(program, stdin=t["input"])
        wall += r.wall_s
        if not r.ok:
            return CodeVerdict(False, f"case {k}: {_reason(r)}", wall)
        if r.stdout_truncated or not _stdout_matches(r.stdout, t["output"]):
            return CodeVerdict(False, f"case {k}: wrong output {r.stdout[:120]!r}, want {t['output'][:120]!r}", wall)
    return CodeVerdict(True, "", wall)
