"""Which answer should an episode return? Regrade stored episodes under every rule (0 LLM calls).

Reads evaluation episodes (data/eval/episodes.jsonl's schema; `--episodes`, repeatable; default: the shipped
reports/evidence/answer_rule_episodes.jsonl, the coordinator's and random routing's episodes of the run committed at 37f6057,
played under the rule `latest` with max_turns 3, so that the rules can disagree),
takes every multi-agent episode (the coordinator's and random routing's: `--methods`) that is graded right or wrong
(judged MT-Bench conversations are left out: their score is a judge's, across conversation turns), rebuilds its
turns and grades the answer each rule of `trinity.coordinator.roles.ANSWER_RULES` returns. Each distinct (item,
answer) is graded once; code runs in the project's sandbox, as in evaluation.

Writes reports/evidence/answer_rule.json and .md (per rule: mean score over all episodes, and over the episodes where the
rules disagree), and prints one JSON line. The rule with the highest mean on the disagreeing episodes is the
data's choice; with few disagreements the table says so and how many there were.

    .venv/bin/python scripts/answer_rule.py [--episodes data/eval/episodes.jsonl ...] [--prepared data/prepared]

Under the rule `first` an episode ends at its first answer, so episodes played under it cannot tell the rules apart:
regrade episodes played under another rule (e.g. `-S coordinator.answer_rule=latest`).
"""
from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _shown(f: Path) -> str:
    """A file as the report names it: relative to the project when inside it."""
    f = f.resolve()
    return str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)


def load_items(prepared: Path) -> dict:
    from trinity.data.splits import load_tasks

    items = {}
    for f in sorted(prepared.glob("*.jsonl")):
        for t in load_tasks(f):
            items[t.id] = t
    return items


def episode_turns(row: dict):
    from trinity.coordinator.roles import Role, make_turn

    return tuple(make_turn(t["model"], Role(t["role"]), t["text"], t["ok"]) for t in row["turns"])


def main(argv=None) -> dict:
    from trinity.coordinator.roles import ANSWER_RULES, returned_answer
    from trinity.grading import grade

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", action="append", type=Path, default=None,
                    help="episodes.jsonl files (default reports/evidence/answer_rule_episodes.jsonl)")
    ap.add_argument("--prepared", type=Path, default=ROOT / "data" / "prepared", help="the items (data/prepared)")
    ap.add_argument("--methods", default="trinity,random-routing", help="comma-separated methods to regrade")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "answer_rule")
    args = ap.parse_args(argv)
    files = args.episodes or [ROOT / "reports" / "answer_rule_episodes.jsonl"]
    methods = set(args.methods.split(","))
    items = load_items(args.prepared)
    grades: dict[tuple[str, str], float] = {}
    rows = []
    for f in files:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["method"] not in methods or r["task_id"] not in items or r.get("error"):
                continue
            task = items[r["task_id"]]
            if task.grader == "judge":
                continue
            turns = episode_turns(r)
            scores = {}
            for rule in ANSWER_RULES:
                a = returned_answer(turns, rule)
                if a is None:
                    scores[rule] = 0.0
                    continue
                if (task.id, a) not in grades:
                    grades[(task.id, a)] = float(grade(task, a))
                scores[rule] = grades[(task.id, a)]
            answers = {returned_answer(turns, rule) for rule in ANSWER_RULES}
            rows.append({"method": r["method"], "task_id": task.id, "benchmark": task.source,
                         "disagree": len(answers) > 1, "scores": scores})
    disagree = [r for r in rows if r["disagree"]]

    def mean(rs, rule):
        return round(sum(r["scores"][rule] for r in rs) / len(rs), 4) if rs else None

    table = {rule: {"all": mean(rows, rule), "disagreeing": mean(disagree, rule)} for rule in ANSWER_RULES}
    best = max(ANSWER_RULES, key=lambda rule: (table[rule]["disagreeing"] or 0.0, rule == "latest"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out = {"bench": "answer_rule", "figure": best, "episodes": len(rows), "disagreeing": len(disagree),
           "grades_computed": len(grades), "llm_calls": 0, "by_rule": table, "commit": commit,
           "files": [_shown(f) for f in files], "methods": sorted(methods), "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    md = ["# Which answer an episode returns: stored episodes regraded under each rule (0 LLM calls)", "",
          f"`scripts/answer_rule.py` at {commit}, episodes of {', '.join(sorted(methods))} from "
          f"{', '.join(out['files'])}: {len(rows)} graded episodes, {len(disagree)} where the rules return "
          "different answers (only those can tell the rules apart).", "",
          "| rule | mean score, all episodes | mean score, where the rules disagree |", "|---|---|---|"]
    md += [f"| {rule} | {table[rule]['all']} | {table[rule]['disagreeing']} |" for rule in ANSWER_RULES]
    md += ["", f"Best where they disagree: **{best}** (a tie goes to `latest`)."]
    if len(disagree) < 20:
        md += ["", f"Only {len(disagree)} disagreeing episodes: weak evidence; each is listed in answer_rule.json."]
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}), flush=True)
    return out


if __name__ == "__main__":
    main()
