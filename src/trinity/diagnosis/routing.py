"""Q1: why the evaluation's episodes end where they do — the saved head's model and role distributions at every
evaluation transcript, over every node of the rebuilt trees, the Verifier's verdicts and the Thinker's suggestions
per member, and how the training and evaluation episodes ended (walked through the trees under the run's rule,
with their rewards recomputed and the evaluation's paths replayed by the loop)."""
from __future__ import annotations

import json
from collections import Counter, defaultdict

import numpy as np

from trinity.coordinator.episode import episode_rng
from trinity.coordinator.head import softmax
from trinity.coordinator.roles import Role, Turn, coordinator_text, latest_answer, parse_thinker
from trinity.coordinator.rollout import ENDINGS
from trinity.diagnosis.stored_run import fmt
from trinity.store import text_key
from trinity.verdict import parse_verdict


def eval_states(run):
    """(row, conversation turn, prefix length, key, state or None, pick) for every pick of every eval
    episode of the coordinator, in order."""
    out = []
    for r in run.eval_rows:
        if r["method"] != "trinity":
            continue
        task = run.tasks[r["task_id"]]
        by_turn = defaultdict(list)
        for t in r["turns"]:
            by_turn[t["conversation_turn"]].append(Turn(t["model"], Role(t["role"]), t["text"], t["ok"],
                                                        verdict=t["verdict"]))
        answers = ()
        pick_i = 0
        n_conv = len(task.prompt) if task.grader == "judge" else 1
        for k in range(1, n_conv + 1):
            tk = task if k == 1 else task.follow_up(k, answers)
            turns = tuple(by_turn.get(k, []))
            # picks of this conversation turn: its turns, plus, in a run made before the Verifier was masked
            # with no answer, the Verifier pick that ended it there (the row's verifier_first)
            n_picks, nxt = len(turns), pick_i + len(turns)
            if (r["verifier_first"] and nxt < len(r["path"]) and r["path"][nxt][1] == "verifier"
                    and latest_answer(turns) is None and (not turns or run.rule.ending(turns) is None)):
                n_picks += 1
            for j in range(n_picks):
                pre = turns[:j]
                key = text_key(coordinator_text(tk, pre))
                v = run.all_states.get(key)
                out.append((r, k, j, key, None if v is None else np.asarray(v, np.float64),
                            r["path"][pick_i + j], latest_answer(pre) is not None))
            pick_i += n_picks
            answers += (run.rule.answer(turns) or "",)
    return out


def q1(run):
    W, L = run.W, run.L
    print("=" * 100)
    print("Q1. Why evaluation episodes end where they do")
    print("=" * 100)
    print(f"pool: {run.names}; head ||W||={np.linalg.norm(W):.3f}; max_turns={run.max_turns}; "
          f"store: {len(run.responses)} responses, {len(run.all_state_keys)} states ({run.enc_id[:40]}...), "
          f"{run.other_encoder_states} states of other encoders")
    ev = eval_states(run)
    miss = sum(1 for e in ev if e[4] is None)
    print(f"\n[eval transcript states] {len(ev)} picks by trinity on eval items; states found: {len(ev) - miss}, "
          f"missing in store: {miss} (skipped)")
    print(f"{'task':38s} ct pre ans  P(model) {run.names}        P(role) [th,wo,ve]     argmax          "
          f"margin(model p1-p2 | logit) margin(role)  picked")
    rows = []
    for r, k, j, key, h, pick, has_ans in ev:
        if h is None:
            continue
        zz = W @ run.feat(h)
        pm, pr = softmax(zz[:L]), softmax(zz[L:])
        sm, sr = np.sort(pm)[::-1], np.sort(pr)[::-1]
        zm = np.sort(zz[:L])[::-1]
        am, ar = int(np.argmax(pm)), int(np.argmax(pr))
        rows.append((pm, pr, am, ar, has_ans, r["benchmark"]))
        print(f"{r['task_id'][:38]:38s} {k:2d} {j:3d} {'y' if has_ans else 'n':3s} {fmt(pm)} {fmt(pr)} "
              f"{run.names[am][:10]:10s}/{['th', 'wo', 've'][ar]}  {sm[0] - sm[1]:.4f} | {zm[0] - zm[1]:.4f}"
              f"          {sr[0] - sr[1]:.4f}   {run.names[int(pick[0])][:10]}/{pick[1][:2]}")
    if rows:
        am = Counter(run.names[x[2]] for x in rows)
        ar = Counter(["thinker", "worker", "verifier"][x[3]] for x in rows)
        print(f"argmax model counts: {dict(am)}; argmax role counts: {dict(ar)}")
        pv = np.array([x[1][2] for x in rows])
        print(f"P(verifier) over eval states: mean {pv.mean():.3f}, max {pv.max():.3f}; "
              f"P(model) max over states {max(x[0].max() for x in rows):.3f}")
        wa = [x for x in rows if x[4]]
        print(f"eval states with an answer: {len(wa)}; role argmax = verifier on {sum(x[3] == 2 for x in wa)}")
        over = [(e[0]["task_id"], e[1], e[2], e[5][1]) for e, x in zip([e for e in ev if e[4] is not None], rows)
                if e[5][1] != ["thinker", "worker", "verifier"][x[3]]]
        print(f"eval picks whose role differs from the head's argmax (= a Thinker's suggested_role override): "
              f"{len(over)}/{len(rows)}: {over}")
    # all stored tree nodes
    trees_summary(run, run.build_all_trees())
    nodes = [n for n in run.nodes.values() if n.state is not None and not n.terminal]
    Z = np.array([W @ n.state for n in nodes])
    PM, PR = softmax(Z[:, :L]), softmax(Z[:, L:])
    ans = np.array([n.answer is not None for n in nodes])
    argr = PR.argmax(1)
    print(f"\n[all reconstructed non-terminal tree nodes with a stored state: {len(nodes)}]")
    print(f"argmax model counts: {dict(Counter(run.names[i] for i in PM.argmax(1)))}")
    print(f"argmax role counts: {dict(Counter(['thinker', 'worker', 'verifier'][i] for i in argr))}")
    print(f"role argmax = verifier where an answer exists: {int((argr[ans] == 2).sum())}/{int(ans.sum())}; "
          f"where none exists (masked: the pick is among the other roles): {int((argr[~ans] == 2).sum())}/"
          f"{int((~ans).sum())}")
    p_verifier = f"{PR[ans, 2].mean():.3f}" if ans.any() else "n/a (no such node: an answer ends the episode)"
    print(f"mean P(verifier | answer exists) = {p_verifier}; P(model) range "
          f"[{PM.min():.3f}, {PM.max():.3f}], P(role) range [{PR.min():.3f}, {PR.max():.3f}]")
    forced = [n for n in nodes if n.forced is not None]
    print(f"nodes where a Thinker's suggested_role overrides the role pick: {len(forced)}/{len(nodes)} "
          f"({dict(Counter(n.forced.value for n in forced))})")

    # verifier verdicts by model
    print("\n[Verifier replies in the store, parsed with trinity.verdict.parse_verdict]")
    by = defaultdict(Counter)
    for mid, role, msgs, text, ok, ct, failure, sampling in run.responses:
        if role != "verifier":
            continue
        name = run.member(mid)
        if not ok:
            by[name]["failed"] += 1
            continue
        by[name][parse_verdict(text) or "no verdict field"] += 1
    for name in run.names:
        c = by.get(name, Counter())
        n = sum(c.values())
        print(f"  {name:16s} n={n:3d} ACCEPT={c['ACCEPT']:3d} ({c['ACCEPT'] / max(n, 1):.0%})  REJECT="
              f"{c['REJECT']:3d}  no verdict field={c['no verdict field']:3d}  failed={c['failed']}")
    ev_v = Counter()
    for r in run.eval_rows:
        for t in r["turns"]:
            if t["role"] == "verifier":
                ev_v[(r["method"] if r["method"] in ("trinity", "random-routing") else "other", t["model"],
                      t["verdict"])] += 1
    print(f"  eval episodes' verifier turns (method, model, verdict): {dict(ev_v)}")

    # thinker suggested roles
    print("\n[Thinker replies in the store: parsed suggested_role]")
    th = defaultdict(Counter)
    for mid, role, msgs, text, ok, ct, failure, sampling in run.responses:
        if role != "thinker" or not ok:
            continue
        name = run.member(mid)
        s, r = parse_thinker(text)
        th[name][r.value if r else "none"] += 1
    for name in run.names:
        print(f"  {name:16s} {dict(th.get(name, {}))}")
    episode_endings(run)


def trees_summary(run, roots) -> None:
    """How much of the store the rebuilt trees account for."""
    print(f"\n[trees] {len(roots)} roots, {len(run.nodes)} nodes rebuilt from stored replies; store states "
          f"mapped to a node: {len(run.all_state_keys) - len(run.unmapped_states)}/{len(run.all_state_keys)}")
    non_terminal = [n for n in run.nodes.values() if not n.terminal]
    print(f"non-terminal nodes without a stored state: {sum(1 for n in non_terminal if n.state is None)}/"
          f"{len(non_terminal)}")



def episode_endings(run):
    print("\n[training episodes: how they ended (paths walked through the rebuilt trees)]")
    end = defaultdict(Counter)
    recon = []
    forced_n = Counter()
    for g, c, tid, path, reward, correct in run.episodes:
        t = run.tasks[tid]
        p = json.loads(path)
        n, st = run.walk_path(t, p)
        end[g][st] += 1
        if st in ENDINGS:
            r = run.reward(t, n.turns, [(int(m), Role(r_)) for m, r_ in p], float(correct), run.cost(t, n.turns))
            recon.append(abs(r - reward))
        # forced picks along the path
        node = run.node(t)
        for m, r_ in p:
            if node.forced is not None:
                forced_n[(node.forced.value, "no answer" if node.answer is None else "answer")] += 1
            role = Role(r_)
            if role not in run.pickable(node):
                break
            node = run.child(node, int(m), role)
            if node is None:
                break
    for g in sorted(end):
        print(f"  gen {g}: {dict(end[g])}")
    rew_by = defaultdict(list)
    for g, c, tid, path, reward, correct in run.episodes:
        rew_by[run.walk_path(run.tasks[tid], json.loads(path))[1]].append(reward)
    print(f"  mean shaped reward by ending: { {k: (len(v), round(float(np.mean(v)), 3)) for k, v in rew_by.items()} }"
          f" (ACCEPT cuts the diversity bonus short)")
    for g, c, tid, path, reward, correct in run.episodes:
        if correct > 0:
            print(f"  correct training episode: gen {g} cand {c} {tid} path "
                  f"{[(run.names[int(m)], r) for m, r in json.loads(path)]} reward {reward:.3f}")
    if recon:
        print(f"  reward recomputed from (correct, path) vs stored: max |diff| = {max(recon):.2e} over "
              f"{len(recon)} episodes (checks the tree reconstruction and the reward formula)")
    print(f"  role picks overridden by a Thinker's suggested_role: {dict(forced_n)}")
    # eval
    ends = Counter()
    for r in run.eval_rows:
        if r["method"] in ("trinity", "random-routing"):
            n_t = len(r["turns"])
            acc = any(t["verdict"] == "ACCEPT" for t in r["turns"])
            ends[(r["method"], "verifier_first" if r["verifier_first"] else "accept" if acc else
                  f"{n_t} turns")] += 1
    print(f"  eval episode endings: {dict(ends)}")
    # reconstruction checks: the saved head's argmax path and the zero head's seeded draws reproduce eval paths
    ok_a = ok_r = n_a = n_r = 0
    for r in run.eval_rows:
        t = run.tasks.get(r["task_id"])
        if t is None or t.grader == "judge":
            continue
        want = [(run.names[int(m)], role) for m, role in r["path"]]
        if r["method"] == "trinity":
            n_a += 1
            ok_a += run.play(t, run.W, None)[3] == want
        elif r["method"] == "random-routing":
            n_r += 1
            rng = episode_rng(run.settings.evaluate.random_routing_seed, "random", t.id)
            ok_r += run.play(t, np.zeros_like(run.W), rng)[3] == want
    print(f"  reconstruction check: saved head's argmax path == eval trinity path on {ok_a}/{n_a} items; "
          f"zero head replayed with the eval seeds == random-routing path on {ok_r}/{n_r} items")
