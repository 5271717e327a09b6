"""Q5: other checks of a run — Worker replies cut at max_tokens or missing their answer format, each member's
first-turn accuracy as Worker, MT-Bench turns and judge ratings, episodes of several runs in one table, stored
states no rebuilt transcript reaches, and the root states file against the store."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np

from trinity.coordinator.roles import Role
from trinity.diagnosis.stored_run import StoredRun, banner


def q5(run: StoredRun) -> None:
    banner("Q5. Other checks")
    mt = run.settings.pool.members
    cap = {m.name: m.max_tokens for m in mt}
    by = defaultdict(Counter)
    for mid, role, msgs, text, ok, ct, failure, sampling in run.responses:
        if role != "worker" or not ok:
            continue
        name = run.member(mid)
        mx = json.loads(sampling).get("max_tokens", cap.get(name))
        by[name]["n"] += 1
        by[name]["at_cap"] += int(ct is not None and mx is not None and ct >= mx)
        m = json.loads(msgs)
        body = m[-1][1]
        if "\\boxed{}" in body:
            by[name]["math"] += 1
            by[name]["math_boxed"] += int("\\boxed" in text)
        if "Answer: X" in body:
            by[name]["choice"] += 1
            by[name]["choice_line"] += int("answer:" in text.lower())
        if "```python" in body:
            by[name]["code"] += 1
            by[name]["code_closed"] += int(text.count("```") >= 2)
    print("[Worker replies: truncation at max_tokens and answer format present]")
    for name in run.names:
        c = by.get(name, Counter())
        print(f"  {name:16s} n={c['n']:3d} hit max_tokens: {c['at_cap']:3d} ({c['at_cap'] / max(c['n'], 1):.0%}); "
              f"math with \\boxed: {c['math_boxed']}/{c['math']}; choice with 'Answer:': "
              f"{c['choice_line']}/{c['choice']}; code with a closed ``` block: {c['code_closed']}/{c['code']}")
    # labelled accuracy per model as Worker at the root
    print("[first-turn Worker accuracy per model, all tasks with a stored root Worker reply and a grade]")
    acc = defaultdict(list)
    for t in run.tasks.values():
        if t.grader == "judge":
            continue
        n = run.node(t)
        for m in range(run.L):
            c = run.child(n, m, Role.WORKER)
            if c is None:
                continue
            g = run.label(t, run.rule.answer(c.turns))
            if g is not None:
                acc[run.names[m]].append(g)
    print("  " + "; ".join(f"{k}: {sum(v):.0f}/{len(v)}" for k, v in acc.items()))
    # MT-Bench: verifier-first conversation turns that still get a score
    for r in run.eval_rows:
        if r["benchmark"] == "mt_bench" and r["verifier_first"] and r["score"]:
            js = [(j["turn"], j["score"], j["error"]) for j in r["judge"]]
            print(f"[MT-Bench] {r['method']} on {r['task_id']}: verifier_first=True (a conversation turn had no "
                  f"answer) yet score={r['score']} from judge turns {js}: the answerless turn is dropped as "
                  f"'unparseable' instead of scoring 0")
    jf = Counter()
    for r in run.eval_rows:
        for j in r.get("judge") or []:
            jf["rated" if j["score"] is not None else "no rating"] += 1
    if jf:
        print(f"[MT-Bench judge] judgements: {dict(jf)} (an unrated item is unscored: alone:qwen-coder-1.5b has no "
              f"held-out average for this reason)")
    dup = [r for r in run.runs]
    if len(dup) > 1:
        print(f"[episodes table] {len(dup)} run_ids hold episodes {[(r[0][-8:], r[1]) for r in dup]}: a reader "
              f"that does not filter on run_id double-counts")
    print(f"[states] store states for this encoder: {len(run.all_state_keys)}; not mapped to any rebuilt "
          f"transcript: {len(run.unmapped_states)}; non-terminal transcripts visited by the "
          f"enumerations whose state is missing: {len(run.missing_states)}")
    # root states parquet vs store
    mism = 0
    for tid, v in run.root_states.items():
        s = run.all_states.get(run.root_keys[tid])
        if s is None or not np.allclose(s, v, atol=1e-5):
            mism += 1
    print(f"[root states] parquet rows {len(run.root_states)}; differing from / missing in the store: {mism}")
