"""Grading: `grade(task, answer_text) -> float` dispatches on task.grader.

math and choice are here; code (sandboxed execution) lives in `trinity.grading.code` and the MT-Bench
LLM judge in `trinity.grading.judge`; both are imported only when a task needs them.
"""
from __future__ import annotations

from trinity.records import Task


def grade(task: Task, answer_text: str | None) -> float:
    """Score one answer for one task: 1.0 / 0.0 for math and choice, the code grader's score for code."""
    if task.grader == "math":
        from trinity.grading.math import grade_math

        return grade_math(task, answer_text)
    if task.grader == "choice":
        from trinity.grading.choice import grade_choice

        return grade_choice(task, answer_text)
    if task.grader == "code":
        try:
            from trinity.grading.code import grade_code
        except ModuleNotFoundError as e:
            if e.name != "trinity.grading.code":
                raise
            raise NotImplementedError("code grading needs trinity.grading.code, which is not installed yet") from None
        return float(grade_code(task, answer_text))
    if task.grader == "judge":
        raise NotImplementedError(
            f"task {task.id}: MT-Bench answers are scored by an LLM judge over both turns, not by grade(); "
            "use trinity.grading.judge.MTBenchJudge with a judge model from your pool"
        )
    raise ValueError(f"task {task.id}: unknown grader {task.grader!r}")


def preflight(tasks) -> None:
    """Fail before any model is called when a task could not be graded here: a code benchmark whose sandbox is
    missing (BigCodeBench needs its own venv: scripts/setup_sandbox_env.sh) raises SandboxUnavailable."""
    code_tasks = [t for t in tasks if t.grader == "code"]
    if code_tasks:
        from trinity.grading.code import code_kind, default_sandbox

        for kind in {code_kind(t) for t in code_tasks}:
            default_sandbox(kind)


__all__ = ["grade", "preflight"]
