"""Math answers: pull the final answer out of a model's reply and compare it with the reference.

Extraction (`final_answer_candidates`), in order of preference: the \\boxed{...} (or \\fbox{...}); the last
explicit statement ("the answer is X", "Final answer: X", "Answer: X"); the last number in the text. Text
before a closing </think> is ignored when something follows it. A hedge is not an answer: several boxes,
or a statement or final sentence that offers alternatives ("12 or 13", "either 12 or 13", "12, or maybe
13", "12, maybe 13"), name several candidates, and a reply is right only if every candidate equals the
reference. Where the reference is one number, a candidate that lists several numbers ("\\boxed{12, 13}",
"Answer: 12 and 13") is a hedge too; "\\boxed{1,000}" is one number.

Comparison depends on `task.metadata["answer_type"]`:
* "integer" (AIME): both sides as integers — "073", "73", "73.0" and "\\boxed{073}" are all 73.
* "number"  (GSM8K): exact rational comparison after dropping "$", thousands commas, "%" and units.
* "latex"   (MATH-500, the default): plain numbers compare exactly; anything else goes through
  math-verify (`parse` + `verify`), which understands LaTeX, sets, intervals, equations, etc.

math-verify can take unbounded time on adversarial input (10^{10^{10}}, 10^8!, (x+1)^{100000}). In the
main thread its own signal-based timeouts apply. signal.alarm does not work off the main thread, so
there the comparison runs in a helper process that is killed when it overruns.
"""
from __future__ import annotations

import atexit
import json
import os
import re
import select
import subprocess
import sys
import threading
from fractions import Fraction

from trinity.grading.reply import after_think
from trinity.records import Task

DEFAULT_TIMEOUT_S = 5
"""Seconds math-verify may spend on one parse or one comparison (signal.alarm: whole seconds)."""
MAX_ANSWER_CHARS = 1000
"""Longer extracted answers are treated as wrong: no reference answer is anywhere near this long."""
MAX_CANDIDATES = 8
"""A reply naming more different final answers than this is wrong without comparing any of them."""

# ---------------------------------------------------------------------------------------------------
# Extraction


def _balanced(text: str, start: int) -> str | None:
    """Content of the brace group opening at text[start] == '{', or None if it never closes."""
    depth = 0
    for i in range(start, len(text)):
        c = text[i]
        if c == "{" and text[i - 1: i] != "\\":
            depth += 1
        elif c == "}" and text[i - 1: i] != "\\":
            depth -= 1
            if depth == 0:
                return text[start + 1: i]
    return None


_BOXED = re.compile(r"\\(?:boxed|fbox)(?:\s*(?P<brace>\{)|\s+(?P<bare>[^\s${}]+))")


def boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...} / \\fbox{...} (balanced braces; also "\\boxed 5"), in order."""
    found = []
    for m in _BOXED.finditer(text):
        if m.group("brace"):
            inner = _balanced(text, m.start("brace"))
            if inner is not None:
                found.append(inner)
        else:
            found.append(m.group("bare").strip())
    return found


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (balanced braces; also "\\boxed 5")."""
    found = boxed_contents(text)
    return found[-1] if found else None


_STATEMENT = re.compile(
    r"(?i:final\s+answer|the\s+answer|answer)\s*(?:is|:|=|would\s+be|should\s+be)\s*:?\s*(?P<ans>[^\n]+)"
)
_NUMBER = re.compile(r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*\d+)?")

_HEDGE_OPENER = r"(?:or|maybe|perhaps|possibly|alternatively)\b"
_SENTENCE_BREAK = re.compile(rf"(?:(?<=\.)[ \t]+|[ \t]*\n\s*)(?=\S)(?!{_HEDGE_OPENER})", re.I)
"""Where a sentence or line ends — unless the next one opens with a hedge ("12. Or maybe 13")."""
_ALTERNATIVE = re.compile(
    r"\\(?:text|mbox|mathrm)\{\s*or\s*\}"  # LaTeX "12 \text{ or } 13"
    r"|(?<![A-Za-z\\])or(?![A-Za-z])(?!\s+(?:more|less|fewer|greater|higher|lower|so|equal|not|else|otherwise)\b)"
    r"|(?<=[.!?;])\s+(?=(?:maybe|perhaps|possibly|alternatively)\b)"  # "13. Maybe 12."
    # "12, maybe 13", "12 (perhaps 13)", "12 - possibly 13", "$12$ maybe $13$": a hedge word right after a value
    # or a comma, introducing another value (not "12, maybe more", "12, perhaps surprisingly")
    r"|(?<!\s)(?:\s*+[,(]|\s++[-\u2013\u2014]|(?<=[\d$}])\s++)\s*+"
    r"(?=(?:maybe|perhaps|possibly|probably)\s+[-+$\\(.{\d])",
    re.I)
"""Where a span offers another candidate: "12 or 13", "12, or maybe 13", "13. Maybe 12", "12, maybe 13"
(not "or more")."""
_HEDGE_WORDS = re.compile(r"^[\s,;]*(?:(?:either|maybe|perhaps|possibly|probably|alternatively)\b[\s,:]*)+", re.I)


def _alternatives(span: str) -> list[str]:
    """A span split where it offers alternatives, each part without its hedge words ("either", "maybe")."""
    parts, start, aside = [], 0, False
    for m in _ALTERNATIVE.finditer(span):
        parts.append((span[start: m.start()], aside))
        start, aside = m.end(), "(" in m.group()
    parts.append((span[start:], aside))
    # "12 (maybe 13)" leaves "13)": drop the ")" that closed that aside (an interval's "[2, 5)" keeps its own)
    return [_HEDGE_WORDS.sub("", re.sub(r"\)\s*[.;,!]?\s*$", "", p) if aside and p.count(")") > p.count("(") else p)
            for p, aside in parts]


def _clean_span(s: str) -> str:
    s = s.strip()
    s = re.sub(r"^\*+|\*+$", "", s).strip()  # markdown bold around the answer
    for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(a):
            j = s.find(b, len(a))
            if j > 0:
                s = s[len(a): j]
                break
    else:
        s = re.split(r"\.\s", s, maxsplit=1)[0]  # "5. Next we check" → "5"
    s = s.strip()
    s = re.sub(r"[\s.;,!*]+$", "", s)  # trailing sentence punctuation
    return s.strip()


def final_answer_candidates(text: str | None) -> list[str]:
    """Every final answer the reply names (strings, still LaTeX), in order; [] if it names none.

    One source decides, in order of preference: the \\boxed{...} (all of them); else the last explicit
    statement ("the answer is X", "Final answer: X", "Answer: X"), read to the end of its sentence; else
    the last number in the text, with the sentence that holds it. Each of these is split where it offers
    alternatives ("12 or 13", "either 12 or 13", "12, or maybe 13", "13. Maybe 12.", "12 \\text{ or } 13"),
    so a hedge yields several candidates. Text before a closing </think> is ignored when something follows.
    """
    if not text:
        return []
    text = after_think(text)
    boxed = [part.strip() for inner in boxed_contents(text) for part in _alternatives(inner)]
    if any(boxed):
        return [b for b in boxed if b]
    for m in reversed(list(_STATEMENT.finditer(text))):
        span = text[m.start("ans"):]
        brk = _SENTENCE_BREAK.search(span)
        parts = [_clean_span(p) for p in _alternatives(span[: brk.start()] if brk else span)]
        if any(parts):
            return [p for p in parts if p]
    numbers = list(_NUMBER.finditer(text))
    if not numbers:
        return []
    last = numbers[-1]
    at = last.end() - len(last.group().lstrip())  # _NUMBER may begin with the blank before "$5"
    start = max((b.end() for b in _SENTENCE_BREAK.finditer(text, 0, at)), default=0)
    brk = _SENTENCE_BREAK.search(text, last.end())
    found = []
    for part in _alternatives(text[start: brk.start() if brk else len(text)]):
        in_part = _NUMBER.findall(part)
        if in_part:
            found.append(in_part[-1].replace("$", "").replace(" ", "").strip())
    return found


def extract_final_answer(text: str | None) -> str | None:
    """The final answer as a string (still LaTeX): the last of `final_answer_candidates`, or None if the
    reply states none. A reply naming several different candidates is graded wrong (see grade_math)."""
    found = final_answer_candidates(text)
    return found[-1] if found else None


# ---------------------------------------------------------------------------------------------------
# Comparison

_UNITS = re.compile(r"\s*(?:\\(?:text|mbox|mathrm)\{[^{}]*\}|[a-zA-Z ]+)$")


def as_number(s: str, allow_units: bool = False) -> Fraction | None:
    """A plain number ("1,234.50", "$18", "-3/4", "\\frac{3}{4}", "45%", "073") as a Fraction, else None.
    `allow_units` also drops trailing words ("12 dollars", "5 \\text{cm}") — only for answers known to be
    numbers (GSM8K, AIME), since in general LaTeX "5x" is not 5."""
    s = s.strip()
    s = re.sub(r"\\[!,;: ]|\\\$|\\%|\$|\{,\}", "", s).replace("\u2212", "-").strip()
    if allow_units:
        s = _UNITS.sub("", s).strip()
    s = s.rstrip("%").strip()
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if len(s) > 100:
        return None
    m = re.fullmatch(r"(-?)(\d+(?:\.\d*)?|\.\d+)(?:\s*/\s*(\d+))?", s)
    if not m:
        frac = re.fullmatch(r"(-?)\\[dt]?frac\{(\d+)\}\{(\d+)\}", s)
        if not frac or int(frac.group(3)) == 0:
            return None
        v = Fraction(int(frac.group(2)), int(frac.group(3)))
        return -v if frac.group(1) else v
    num = Fraction(m.group(2))
    if m.group(3) is not None:
        if int(m.group(3)) == 0:
            return None
        num /= int(m.group(3))
    return -num if m.group(1) else num


def _math_verify_equal(gold: str, pred: str, timeout_s: int | None) -> bool:
    """math-verify comparison of a reference and an extracted answer (both LaTeX-ish strings)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    cfg = [LatexExtractionConfig(), ExprExtractionConfig()]
    g = parse(f"${gold}$", extraction_config=cfg, parsing_timeout=timeout_s)
    if not g:
        g = parse(f"\\boxed{{{gold}}}", extraction_config=cfg, parsing_timeout=timeout_s)
    if not g:
        return False
    for candidate in (f"\\boxed{{{pred}}}", f"${pred}$"):
        p = parse(candidate, extraction_config=cfg, parsing_timeout=timeout_s)
        if p and verify(g, p, timeout_seconds=timeout_s):
            return True
    return False


def _serve() -> None:
    """Helper-process loop: one JSON request per stdin line → one JSON bool per stdout line. It runs in
    that process's main thread, so math-verify's signal-based timeouts work there."""
    for line in sys.stdin:
        try:
            req = json.loads(line)
            ok = _math_verify_equal(req["gold"], req["pred"], req["timeout_s"])
        except Exception:
            ok = False
        sys.stdout.write(json.dumps(bool(ok)) + "\n")
        sys.stdout.flush()


class _VerifyProcess:
    """A helper process for math-verify calls made off the main thread, killed and restarted when a call
    overruns. A plain subprocess (not multiprocessing), so callers need no `if __name__ == "__main__"` guard."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [env.get("PYTHONPATH", "")])
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "from trinity.grading.math import _serve; _serve()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
        )

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait(timeout=5)
            for f in (proc.stdin, proc.stdout):
                try:
                    f.close()
                except OSError:
                    pass

    def equal(self, gold: str, pred: str, timeout_s: int, hard_timeout_s: float) -> bool:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self.stop()
                self._start()
            proc = self._proc
            try:
                proc.stdin.write(json.dumps({"gold": gold, "pred": pred, "timeout_s": timeout_s}) + "\n")
                proc.stdin.flush()
                # The first call also pays for the interpreter start and the sympy import.
                ready, _, _ = select.select([proc.stdout], [], [], hard_timeout_s)
                if ready:
                    line = proc.stdout.readline()
                    if line:
                        return json.loads(line) is True
            except (OSError, ValueError):
                pass
            self.stop()  # overran or died: never leave a half-answered request in the pipe
            return False


_VERIFY_PROCESS = _VerifyProcess()
atexit.register(_VERIFY_PROCESS.stop)


_LIST_SEP = re.compile(
    r",(?!\d{3}(?!\d))|;|&|\\(?:text|mbox|mathrm)\{\s*and\s*\}|(?<![A-Za-z\\])and(?![A-Za-z])", re.I)
"""Where a list of values splits: "12, 13", "12; 13", "12 and 13" — not at the thousands comma of "1,000"."""


def listed_numbers(candidate: str, numeric: bool = False) -> set[Fraction]:
    """The distinct numbers one candidate lists: "12, 13" and "x = 12 and y = 13" → {12, 13}. A single number
    ("1,000", "1{,}000", "\\frac{1}{2}", "18 dollars" when `numeric`) is a list of one; items that are not
    numbers ("12, which is 3 dozen") count for nothing."""
    whole = as_number(candidate, allow_units=numeric)
    if whole is not None:
        return {whole}
    values = set()
    for item in _LIST_SEP.split(candidate):
        v = as_number(_HEDGE_WORDS.sub("", item.rsplit("=", 1)[-1]), allow_units=numeric)
        if v is not None:
            values.add(v)
    return values


def math_equal(gold: str, pred: str, answer_type: str = "latex", timeout_s: int = DEFAULT_TIMEOUT_S) -> bool:
    """Is the extracted answer `pred` equal to the reference `gold`?"""
    pred = pred.strip()
    if not pred or len(pred) > MAX_ANSWER_CHARS:
        return False
    numeric = answer_type in ("integer", "number")
    if numeric and as_number(pred, allow_units=True) is None and "\\" not in pred:
        numbers = _NUMBER.findall(pred)  # "she makes 18 dollars a day" → 18
        if numbers:
            pred = numbers[-1].replace("$", "").replace(" ", "")
    g_num, p_num = as_number(gold, numeric), as_number(pred, numeric)
    if answer_type == "integer":
        if g_num is not None and p_num is not None:
            return p_num.denominator == 1 and p_num == g_num
    elif g_num is not None and p_num is not None:
        return g_num == p_num
    elif answer_type == "number" and g_num is not None and re.fullmatch(r"[\d\s.,$%/-]+", pred):
        return False  # both look numeric but one did not parse: not equal
    if threading.current_thread() is threading.main_thread():
        try:
            return _math_verify_equal(gold, pred, timeout_s)
        except Exception:
            return False
    # Up to 2 parses per side and 4 comparisons, each bounded by timeout_s, plus the helper's start-up.
    return _VERIFY_PROCESS.equal(gold, pred, timeout_s, hard_timeout_s=8 * timeout_s + 30)


def grade_math(task: Task, answer_text: str | None, timeout_s: int = DEFAULT_TIMEOUT_S) -> float:
    """1.0 if the reply's final answer equals task.answer, else 0.0. No answer found counts as wrong, and so
    does a hedge: every candidate the reply names must equal the reference ("\\boxed{1/2} ... \\boxed{0.5}"
    is one answer; "12 or 13" is none, and so is "\\boxed{12, 13}" when the reference is one number). The one
    exception: a reference that lists several values ("1,-2") is matched by a reply naming exactly those values
    as alternatives ("x = 1 or x = -2")."""
    if task.answer is None:
        raise ValueError(f"task {task.id}: a math task needs a reference answer")
    found = final_answer_candidates(answer_text)
    distinct = list({re.sub(r"\s+", "", c): c for c in found}.values())
    if not distinct or len(distinct) > MAX_CANDIDATES:
        return 0.0
    answer_type = task.metadata.get("answer_type", "latex")
    numeric = answer_type in ("integer", "number")
    if as_number(task.answer, allow_units=numeric) is not None and any(
            len(listed_numbers(c, numeric)) > 1 for c in distinct):
        return 0.0  # the reference is one number; "\\boxed{12, 13}" or "Answer: 12 and 13" names two
    if all(math_equal(task.answer, c, answer_type, timeout_s) for c in distinct):
        return 1.0
    if len(distinct) > 1 and answer_type == "latex" and "," in task.answer and as_number(task.answer) is None:
        return 1.0 if math_equal(task.answer, ", ".join(distinct), answer_type, timeout_s) else 0.0
    return 0.0
