"""Diagnose a finished Trinity pipeline run from its artifacts alone (read-only; no LLM, no encoder load).

    .venv/bin/python scripts/diagnose_run.py [--root .] [--heads 200]

Opens the checkpoint, the store (read-only), the root states, the eval episodes, the evolve history and the
pickled optimiser state, rebuilds every task's rollout tree from the stored responses (each edge is the request
the episode loop sends, looked up in the store under the pool's own key: `RolloutTrees.request`), and prints:

  Q1  per eval transcript state: model/role probabilities, argmax, margin; how often the role argmax is the
      Verifier once an answer exists; Verifier ACCEPT rates per pool member; Thinker suggested_role overrides.
  Q2  hidden-state geometry (norms, common mean, cosines, massive dimensions) and the decomposition of the
      head's logits into W·mean(h) and W·(h − mean).
  Q3  how far from uniform the saved head's softmaxes are; exact expected accuracy/reward of the sampled policy
      vs the argmax policy (enumerating every path through the stored trees, with the unexplored mass reported);
      how far the CMA mean moved.
  Q4  fitness noise per generation from the training episodes, and the exact (tree-enumerated) fitness spread
      of candidates drawn around the CMA mean: signal vs noise; tasks per generation needed.
  Q5  other checks (reward-reconstruction, truncated answers, judge/verifier-first handling, duplicate runs).

Nothing is written anywhere. States missing from the store are counted and skipped. Single episodes (the eval
paths, the saved-fitness episodes) are replayed by trinity's own loop (`play_episodes`) on a pool that answers
from the store only and an encoder that only reads stored states; rewards are `shaped_reward`'s. The trees are
rebuilt with *this checkout's* role prompts and pool keys: run it at the commit that produced the run (its code
version is in data/checkpoints/coordinator.json); after a prompt change, stored replies no longer match and are
reported as unmapped.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=".", help="project root (holds params.yaml, data/, src/)")
    ap.add_argument("--heads", type=int, default=200, help="random candidates drawn around the CMA mean (Q4)")
    ap.add_argument("--no-grade", action="store_true", help="do not grade unlabelled math/choice answers")
    args = ap.parse_args(argv)
    root = Path(args.root).resolve()
    t_start = time.time()
    D = Diagnosis(root, grade_unlabelled=not args.no_grade)
    D.q1()
    D.q2()
    D.q3()
    D.q4(args.heads)
    D.q5()
    print(f"\n[done in {time.time() - t_start:.1f}s]")
    return 0


def _fmt(v, nd=3):
    return "[" + ", ".join(f"{x:.{nd}f}" for x in v) + "]"


class Unexplored(Exception):
    """A replayed episode asked a request the store has no reply to (the run never asked it)."""


class MissingState(Exception):
    """A replayed episode reached a transcript whose hidden state is not in the store."""


class StoredPool:
    """The run's pool as the diagnosis plays it: the same request keys (`Pool.key`), every reply from the store;
    a request never asked raises Unexplored (nothing is called)."""

    def __init__(self, pool):
        self.pool, self.store, self.names = pool, pool.store, pool.names

    def __len__(self) -> int:
        return len(self.pool)

    def signature(self):
        return self.pool.signature()

    def key(self, idx, messages, role=None) -> str:
        return self.pool.key(idx, messages, role)

    async def complete_many(self, requests):
        replies = [self.store.get_response(r[2]) for r in requests]
        if any(r is None for r in replies):
            raise Unexplored
        return replies


class StoredStatesOnly:
    """An encoder that encodes nothing: `StateCache` finds every state in the store, or MissingState."""

    def __init__(self, encoder_id: str, dim: int):
        self.encoder_id, self.dim = encoder_id, dim

    def encode(self, texts):
        raise MissingState


class Node:
    """A transcript of a task's rollout tree, as rebuilt from the store: its turns, the key and (mapped) state
    the head reads, the cost of its calls, and the role a Thinker's last turn forces (`roles.forced_role`)."""

    __slots__ = ("task", "turns", "key", "answer", "state", "children", "forced", "terminal", "cost_usd")

    def __init__(self, task, turns, key, answer):
        self.task, self.turns, self.key, self.answer = task, turns, key, answer
        self.state = None
        self.children = {}  # (model index, Role) -> child Node, or None when no stored reply
        self.forced = None
        self.terminal = False
        self.cost_usd = 0.0


class Diagnosis:
    def __init__(self, root: Path, grade_unlabelled: bool = True):
        from trinity.config import load_settings
        from trinity.coordinator.episode import RolloutTrees
        from trinity.coordinator.policy import Policy, role_caps
        from trinity.pool.runtime import build_pool
        from trinity.records import Task
        from trinity.store import Store

        self.root = root
        self.settings = load_settings(root / "params.yaml")
        self.max_turns = self.settings.coordinator.max_turns
        self.rw = self.settings.reward
        policy = Policy.load(root / "data/checkpoints/coordinator")
        policy.check(self.settings)
        self.params, self.meta, self.features = policy.params, policy.meta, policy.features
        self.enc_id = self.meta["encoder"]
        self.names = [p["name"] for p in self.meta["pool"]]
        self.model_index = {p["model_id"]: i for i, p in enumerate(self.meta["pool"])}
        self.L = len(self.names)
        self.d = self.meta["dim"]
        self.W = self.params.reshape(self.L + 3, self.d)
        self.grade_unlabelled = grade_unlabelled

        self.tasks: dict[str, object] = {}
        self.split_of: dict[str, str] = {}
        for split in ("train", "in_distribution", "heldout"):
            p = root / f"data/prepared/{split}.jsonl"
            for line in p.read_text().splitlines():
                if line.strip():
                    t = Task.from_json(json.loads(line))
                    self.tasks[t.id] = t
                    self.split_of[t.id] = split
        self.train = [self.tasks[i] for i in self.meta["train_tasks"]]

        self.store = Store(root / "data/store/trinity.duckdb", read_only=True)
        self.pool = StoredPool(build_pool(self.settings.pool, self.store, role_caps(self.settings)))
        self.memo = RolloutTrees()  # the loop's own request memo: role messages and store keys
        self.states = policy.states(StoredStatesOnly(self.enc_id, self.d), self.store)
        con = self.store.con  # listings the Store API has no call for: every response, state key and episode row
        self.responses = con.execute(
            "SELECT model_id, role, messages, text, ok, completion_tokens, failure, sampling FROM responses").fetchall()
        rows = con.execute("SELECT key FROM states WHERE encoder_id = ?", [self.enc_id]).fetchall()
        self.all_state_keys = [r[0] for r in rows]
        self.all_states = self.store.get_states(self.enc_id, self.all_state_keys)
        self.other_encoder_states = con.execute(
            "SELECT count(*) FROM states WHERE encoder_id <> ?", [self.enc_id]).fetchone()[0]
        import pyarrow.parquet as pq

        rt = pq.read_table(root / "data/encode/root_states.parquet").to_pydict()
        self.root_states = {tid: np.asarray(s, dtype=np.float64) for tid, s in zip(rt["task_id"], rt["state"])}
        self.root_keys = dict(zip(rt["task_id"], rt["key"]))
        self.eval_rows = [json.loads(l) for l in (root / "data/eval/episodes.jsonl").read_text().splitlines() if l.strip()]
        self.history = json.loads((root / "data/evolve/history.json").read_text())
        runs = con.execute("SELECT run_id, count(*), min(generation), max(generation) FROM episodes GROUP BY 1 "
                           "ORDER BY 1").fetchall()
        self.runs = runs
        cv = self.meta.get("code_version", "")
        pick = [r[0] for r in runs if cv and r[0].endswith(cv[:8])]
        self.run_id = pick[0] if pick else (runs[-1][0] if runs else None)
        self.episodes = con.execute(
            "SELECT generation, candidate, task_id, path, reward, correct FROM episodes WHERE run_id = ? "
            "ORDER BY generation, candidate, task_id", [self.run_id]).fetchall() if self.run_id else []
        self._labels: dict[tuple[str, str], float] = {}
        self._nodes: dict[tuple, Node] = {}
        self.missing_states: set[str] = set()
        self._label_from_runs()

    # ------------------------------------------------------------------ trees
    def feat(self, H):
        """What the head reads from raw hidden states H (d,) or (n, d): the checkpoint's feature map, if any."""
        H = np.asarray(H, dtype=np.float64)
        if self.features is None:
            return H
        return np.asarray(self.features(np.atleast_2d(H).astype(np.float32)), dtype=np.float64).reshape(H.shape[:-1] + (-1,))

    def node(self, task, turns=()) -> Node:
        """The node of a transcript (one per task and turns: a Turn's identity includes its model)."""
        from trinity.coordinator.episode import is_outage
        from trinity.coordinator.roles import Role, coordinator_text, forced_role, latest_answer
        from trinity.store import text_key

        k = (task, turns)
        n = self._nodes.get(k)
        if n is not None:
            return n
        key = text_key(coordinator_text(task, turns))
        n = Node(task, turns, key, latest_answer(turns))
        v = self.all_states.get(key)
        if v is not None:
            n.state = self.feat(v)
        last = turns[-1] if turns else None
        if last is not None:
            n.forced = forced_role(last, n.answer)
        n.terminal = last is not None and (len(turns) >= self.max_turns or is_outage(last) or
                                           (last.role is Role.VERIFIER and last.verdict == "ACCEPT"))
        self._nodes[k] = n
        return n

    def child(self, n: Node, m: int, role):
        """The child reached by (model m, role) from n: the loop's request, answered by the store (None: never
        asked)."""
        from trinity.coordinator.roles import turn_of

        ck = (m, role)
        if ck in n.children:
            return n.children[ck]
        resp = self.store.get_response(self.memo.request(self.pool, n.task, n.turns, m, role).key)
        c = None
        if resp is not None:
            c = self.node(n.task, n.turns + (turn_of(self.names[m], role, resp),))
            c.cost_usd = n.cost_usd + resp.cost_usd
        n.children[ck] = c
        return c

    def walk_path(self, task, path):
        """Follow a stored path [[model, role], ...] (forced roles are already in it). Returns (node, status)."""
        from trinity.coordinator.roles import Role

        n = self.node(task)
        for m, r in path:
            role = Role(r)
            if role is Role.VERIFIER and n.answer is None:
                return n, "verifier_first"
            c = self.child(n, int(m), role)
            if c is None:
                return n, "missing"
            n = c
        return n, ("accept" if n.turns and n.turns[-1].verdict == "ACCEPT" else "max_turns" if
                   len(n.turns) >= self.max_turns else "open")

    # ------------------------------------------------------------------ grading
    def _label_from_runs(self):
        for g, c, tid, path, reward, correct in self.episodes:
            t = self.tasks.get(tid)
            if t is None:
                continue
            n, st = self.walk_path(t, json.loads(path))
            if st != "verifier_first" and n.answer is not None:
                self._labels[(tid, n.answer)] = float(correct)
        for r in self.eval_rows:
            t = self.tasks.get(r["task_id"])
            if t is None or t.grader == "judge" or r["score"] is None or r["verifier_first"]:
                continue
            if r["answer"] is not None:
                self._labels[(t.id, r["answer"])] = float(r["score"])

    def label(self, task, answer):
        if answer is None:
            return 0.0
        k = (task.id, answer)
        if k in self._labels:
            return self._labels[k]
        if task.grader in ("math", "choice") and self.grade_unlabelled:
            from trinity.grading import grade

            self._labels[k] = float(grade(task, answer))
            return self._labels[k]
        return None

    def reward(self, n: Node, picks, correct: float) -> float:
        """trinity's shaped reward of an episode that ended at node n after `picks` [(model, Role)...]."""
        from trinity.coordinator.episode import Episode, shaped_reward

        ep = Episode(task=n.task, candidate=0, rng=None, turns=n.turns, picks=list(picks), cost_usd=n.cost_usd,
                     correct=correct)
        return shaped_reward(ep, self.max_turns, self.rw)

    # ------------------------------------------------------------------ policy enumeration
    def expect(self, task, Ws: np.ndarray, deterministic: bool = False):
        """Exact expectations over the sampled policy of K heads Ws (K, L+3, d) on one task, enumerating every
        path through the stored tree. Mass that reaches a never-asked edge, a state not in the store or an
        ungradeable answer is 'unknown'. Returns a dict of (K,) arrays."""
        from trinity.coordinator.head import softmax
        from trinity.coordinator.roles import ROLES, Role

        K = Ws.shape[0]
        z = lambda: np.zeros(K)
        out = {k: z() for k in ("acc", "reward", "unknown", "unknown_grade", "vfirst", "accept", "maxt", "turns",
                                "bonus")}
        lo_r = -self.rw.turn_penalty_weight * ((self.max_turns - 1) / self.max_turns) / 4
        hi_r = 1 + self.rw.diversity_weight * math.log(min(self.L, self.max_turns))

        def leaf(n, p, picks, how):
            out[how] += p
            out["turns"] += p * len(n.turns)
            c = self.label(n.task, n.answer)
            b = self.reward(n, picks, 0.0)
            out["bonus"] += p * b
            if c is None:
                out["unknown_grade"] += p
                return
            out["acc"] += p * c
            out["reward"] += p * (c + b)

        def rec(n, p, picks):
            if n.state is None:
                self.missing_states.add(n.key)
                out["unknown"] += p
                return
            zz = Ws @ n.state  # (K, L+3)
            pm, pr = softmax(zz[:, :self.L]), softmax(zz[:, self.L:])
            if deterministic:
                pm = (pm == pm.max(axis=1, keepdims=True)).astype(float)
                pr = (pr == pr.max(axis=1, keepdims=True)).astype(float)
            for ri, role in enumerate(ROLES):
                if n.forced is not None:
                    if role is not n.forced:
                        continue
                    prr = np.ones(K)
                else:
                    prr = pr[:, ri]
                for m in range(self.L):
                    q = p * pm[:, m] * prr
                    if not q.any():
                        continue
                    ms = picks + ((m, role),)
                    if role is Role.VERIFIER and n.answer is None:
                        out["vfirst"] += q
                        out["turns"] += q * len(n.turns)
                        continue  # reward 0, correct 0
                    c = self.child(n, m, role)
                    if c is None:
                        out["unknown"] += q
                        continue
                    if c.terminal:
                        leaf(c, q, ms, "accept" if c.turns[-1].verdict == "ACCEPT" else "maxt")
                    else:
                        rec(c, q, ms)

        rec(self.node(task), np.ones(K), ())
        out["reward_lo"] = out["reward"] + (out["unknown"] + out["unknown_grade"]) * lo_r
        out["reward_hi"] = out["reward"] + (out["unknown"] + out["unknown_grade"]) * hi_r
        return out

    def play(self, task, W, rng):
        """One episode of head W played by trinity's loop on the stored tree, sampled with `rng` (None: argmax),
        ended at an outage as in training and evaluation. Returns (outcome, correct, reward, path, episode):
        outcome "accept" / "max_turns" / "verifier_first" / "unexplored" (a request the store has no reply to) /
        "missing-state"; correct and reward are None when unknown (an ungradeable answer, or the episode left the
        stored tree); path = [(member name, role)...] of the picks made."""
        from trinity.coordinator.episode import Episode, play_episodes

        ep = Episode(task=task, candidate=0, rng=rng)
        try:
            asyncio.run(play_episodes([ep], [W], self.pool, self.states, self.max_turns, self.rw, self._grade,
                                      trees=self.memo, stop_on_outage=True))
        except (Unexplored, MissingState) as e:
            return ("unexplored" if isinstance(e, Unexplored) else "missing-state"), None, None, self._path(ep), ep
        if ep.verifier_first:
            return "verifier_first", 0.0, 0.0, self._path(ep), ep
        how = "outage" if ep.outage else "accept" if ep.turns[-1].verdict == "ACCEPT" else "max_turns"
        if math.isnan(ep.correct):
            return how, None, None, self._path(ep), ep
        return how, ep.correct, ep.reward, self._path(ep), ep

    def _path(self, ep):
        return [(self.names[m], role.value) for m, role in ep.picks]

    def _grade(self, task, answer) -> float:
        """The loop's grade: a known label (NaN when the answer cannot be graded here)."""
        g = self.label(task, answer)
        return math.nan if g is None else g

    # ------------------------------------------------------------------ Q1
    def eval_states(self):
        """(row, conversation turn, prefix length, key, state or None, pick) for every pick of every eval
        episode of the coordinator, in order."""
        from trinity.coordinator.roles import Role, Turn, coordinator_text, latest_answer
        from trinity.store import text_key

        out = []
        for r in self.eval_rows:
            if r["method"] != "trinity":
                continue
            task = self.tasks[r["task_id"]]
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
                # picks of this conversation turn: its turns, plus the Verifier pick that ended it before any
                # answer (verifier-first) when the turn stopped early without an ACCEPT
                n_picks, nxt = len(turns), pick_i + len(turns)
                if (nxt < len(r["path"]) and r["path"][nxt][1] == "verifier" and latest_answer(turns) is None
                        and len(turns) < self.max_turns and not (turns and turns[-1].verdict == "ACCEPT")):
                    n_picks += 1
                for j in range(n_picks):
                    pre = turns[:j]
                    key = text_key(coordinator_text(tk, pre))
                    v = self.all_states.get(key)
                    out.append((r, k, j, key, None if v is None else np.asarray(v, np.float64),
                                r["path"][pick_i + j], latest_answer(pre) is not None))
                pick_i += n_picks
                ans = latest_answer(turns)
                answers += (ans or "",)
        return out

    def q1(self):
        from trinity.coordinator.head import softmax
        from trinity.coordinator.roles import Role, parse_thinker
        from trinity.verdict import parse_verdict

        W, L = self.W, self.L
        print("=" * 100)
        print("Q1. Why every evaluation episode runs to max_turns")
        print("=" * 100)
        print(f"pool: {self.names}; head ||W||={np.linalg.norm(W):.3f}; max_turns={self.max_turns}; "
              f"store: {len(self.responses)} responses, {len(self.all_state_keys)} states ({self.enc_id[:40]}...), "
              f"{self.other_encoder_states} states of other encoders")
        ev = self.eval_states()
        miss = sum(1 for e in ev if e[4] is None)
        print(f"\n[eval transcript states] {len(ev)} picks by trinity on eval items; states found: {len(ev) - miss}, "
              f"missing in store: {miss} (skipped)")
        print(f"{'task':38s} ct pre ans  P(model) {self.names}        P(role) [th,wo,ve]     argmax          "
              f"margin(model p1-p2 | logit) margin(role)  picked")
        rows = []
        for r, k, j, key, h, pick, has_ans in ev:
            if h is None:
                continue
            zz = W @ self.feat(h)
            pm, pr = softmax(zz[:L]), softmax(zz[L:])
            sm, sr = np.sort(pm)[::-1], np.sort(pr)[::-1]
            zm = np.sort(zz[:L])[::-1]
            am, ar = int(np.argmax(pm)), int(np.argmax(pr))
            rows.append((pm, pr, am, ar, has_ans, r["benchmark"]))
            print(f"{r['task_id'][:38]:38s} {k:2d} {j:3d} {'y' if has_ans else 'n':3s} {_fmt(pm)} {_fmt(pr)} "
                  f"{self.names[am][:10]:10s}/{['th', 'wo', 've'][ar]}  {sm[0] - sm[1]:.4f} | {zm[0] - zm[1]:.4f}"
                  f"          {sr[0] - sr[1]:.4f}   {self.names[int(pick[0])][:10]}/{pick[1][:2]}")
        if rows:
            am = Counter(self.names[x[2]] for x in rows)
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
        self._build_all_trees()
        nodes = [n for n in self._nodes.values() if n.state is not None and not n.terminal]
        Z = np.array([W @ n.state for n in nodes])
        PM, PR = softmax(Z[:, :L]), softmax(Z[:, L:])
        ans = np.array([n.answer is not None for n in nodes])
        argr = PR.argmax(1)
        print(f"\n[all reconstructed non-terminal tree nodes with a stored state: {len(nodes)}]")
        print(f"argmax model counts: {dict(Counter(self.names[i] for i in PM.argmax(1)))}")
        print(f"argmax role counts: {dict(Counter(['thinker', 'worker', 'verifier'][i] for i in argr))}")
        print(f"role argmax = verifier where an answer exists: {int((argr[ans] == 2).sum())}/{int(ans.sum())}; "
              f"where none exists (would end the episode with reward 0): {int((argr[~ans] == 2).sum())}/{int((~ans).sum())}")
        print(f"mean P(verifier | answer exists) = {PR[ans, 2].mean():.3f}; P(model) range "
              f"[{PM.min():.3f}, {PM.max():.3f}], P(role) range [{PR.min():.3f}, {PR.max():.3f}]")
        forced = [n for n in nodes if n.forced is not None]
        print(f"nodes where a Thinker's suggested_role overrides the role pick: {len(forced)}/{len(nodes)} "
              f"({dict(Counter(n.forced.value for n in forced))}); of those, forced Verifier with no answer "
              f"(episode ends, reward 0): {sum(1 for n in forced if n.forced is Role.VERIFIER and n.answer is None)}")

        # verifier verdicts by model
        print("\n[Verifier replies in the store, parsed with trinity.verdict.parse_verdict]")
        by = defaultdict(Counter)
        for mid, role, msgs, text, ok, ct, failure, sampling in self.responses:
            if role != "verifier":
                continue
            name = self.names[self.model_index[mid]] if mid in self.model_index else mid
            if not ok:
                by[name]["failed"] += 1
                continue
            by[name][parse_verdict(text) or "no verdict field"] += 1
        for name in self.names:
            c = by.get(name, Counter())
            n = sum(c.values())
            print(f"  {name:16s} n={n:3d} ACCEPT={c['ACCEPT']:3d} ({c['ACCEPT'] / max(n, 1):.0%})  REJECT="
                  f"{c['REJECT']:3d}  no verdict field={c['no verdict field']:3d}  failed={c['failed']}")
        ev_v = Counter()
        for r in self.eval_rows:
            for t in r["turns"]:
                if t["role"] == "verifier":
                    ev_v[(r["method"] if r["method"] in ("trinity", "random-routing") else "other", t["model"],
                          t["verdict"])] += 1
        print(f"  eval episodes' verifier turns (method, model, verdict): {dict(ev_v)}")

        # thinker suggested roles
        print("\n[Thinker replies in the store: parsed suggested_role]")
        th = defaultdict(Counter)
        for mid, role, msgs, text, ok, ct, failure, sampling in self.responses:
            if role != "thinker" or not ok:
                continue
            name = self.names[self.model_index[mid]] if mid in self.model_index else mid
            s, r = parse_thinker(text)
            th[name][r.value if r else "none"] += 1
        for name in self.names:
            print(f"  {name:16s} {dict(th.get(name, {}))}")
        self._episode_endings()

    def _build_all_trees(self):
        """Expand every stored edge of every task tree (train, eval, MT-Bench follow-ups from the eval rows)."""
        if getattr(self, "_built", False):
            return
        from trinity.coordinator.roles import ROLES, Role, Turn, latest_answer

        roots = [self.node(t) for t in self.tasks.values()]
        for r in self.eval_rows:  # MT-Bench second turns: history = the method's own first answer
            t = self.tasks.get(r["task_id"])
            if t is None or t.grader != "judge" or len(t.prompt) < 2:
                continue
            first = tuple(Turn(x["model"], Role(x["role"]), x["text"], x["ok"]) for x in r["turns"]
                          if x["conversation_turn"] == 1)
            roots.append(self.node(t.follow_up(2, (latest_answer(first) or "",))))
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n.terminal:
                continue
            for role in ROLES:
                if role is Role.VERIFIER and n.answer is None:
                    continue
                for m in range(self.L):
                    c = self.child(n, m, role)
                    if c is not None:
                        stack.append(c)
        self._built = True
        keys = {n.key for n in self._nodes.values()}
        self.unmapped_states = [k for k in self.all_state_keys if k not in keys]
        print(f"\n[trees] {len(roots)} roots, {len(self._nodes)} nodes rebuilt from stored replies; store states "
              f"mapped to a node: {len(self.all_state_keys) - len(self.unmapped_states)}/{len(self.all_state_keys)}")
        used = set()
        for n in self._nodes.values():
            for (m, role), c in n.children.items():
                if c is not None:
                    used.add((m, role.value))
        non_terminal = [n for n in self._nodes.values() if not n.terminal]
        print(f"non-terminal nodes without a stored state: {sum(1 for n in non_terminal if n.state is None)}/"
              f"{len(non_terminal)}")

    def _episode_endings(self):
        print("\n[training episodes: how they ended (paths walked through the rebuilt trees)]")
        from trinity.coordinator.roles import Role

        end = defaultdict(Counter)
        recon = []
        forced_n = Counter()
        for g, c, tid, path, reward, correct in self.episodes:
            t = self.tasks[tid]
            p = json.loads(path)
            n, st = self.walk_path(t, p)
            end[g][st] += 1
            if st in ("accept", "max_turns"):
                r = self.reward(n, [(int(m), Role(r_)) for m, r_ in p], float(correct))
                recon.append(abs(r - reward))
            elif st == "verifier_first":
                recon.append(abs(reward - 0.0))
            # forced picks along the path
            node = self.node(t)
            for m, r_ in p:
                if node.forced is not None:
                    forced_n[(node.forced.value, "no answer" if node.answer is None else "answer")] += 1
                role = Role(r_)
                if role is Role.VERIFIER and node.answer is None:
                    break
                node = self.child(node, int(m), role)
                if node is None:
                    break
        for g in sorted(end):
            print(f"  gen {g}: {dict(end[g])}")
        rew_by = defaultdict(list)
        for g, c, tid, path, reward, correct in self.episodes:
            rew_by[self.walk_path(self.tasks[tid], json.loads(path))[1]].append(reward)
        print(f"  mean shaped reward by ending: { {k: (len(v), round(float(np.mean(v)), 3)) for k, v in rew_by.items()} }"
              f" -> picking a Verifier is what the fitness punishes most (verifier-first = 0, ACCEPT cuts the "
              f"diversity bonus short)")
        for g, c, tid, path, reward, correct in self.episodes:
            if correct > 0:
                print(f"  correct training episode: gen {g} cand {c} {tid} path "
                      f"{[(self.names[int(m)], r) for m, r in json.loads(path)]} reward {reward:.3f}")
        if recon:
            print(f"  reward recomputed from (correct, path) vs stored: max |diff| = {max(recon):.2e} over "
                  f"{len(recon)} episodes (checks the tree reconstruction and the reward formula)")
        print(f"  role picks overridden by a Thinker's suggested_role: {dict(forced_n)}")
        # eval
        ends = Counter()
        for r in self.eval_rows:
            if r["method"] in ("trinity", "random-routing"):
                n_t = len(r["turns"])
                acc = any(t["verdict"] == "ACCEPT" for t in r["turns"])
                ends[(r["method"], "verifier_first" if r["verifier_first"] else "accept" if acc else
                      f"{n_t} turns")] += 1
        print(f"  eval episode endings: {dict(ends)}")
        # reconstruction checks: the saved head's argmax path and the zero head's seeded draws reproduce eval paths
        from trinity.coordinator.episode import episode_rng

        ok_a = ok_r = n_a = n_r = 0
        for r in self.eval_rows:
            t = self.tasks.get(r["task_id"])
            if t is None or t.grader == "judge":
                continue
            want = [(self.names[int(m)], role) for m, role in r["path"]]
            if r["method"] == "trinity":
                n_a += 1
                ok_a += self.play(t, self.W, None)[3] == want
            elif r["method"] == "random-routing":
                n_r += 1
                rng = episode_rng(self.settings.evaluate.random_routing_seed, "random", t.id)
                ok_r += self.play(t, np.zeros_like(self.W), rng)[3] == want
        print(f"  reconstruction check: saved head's argmax path == eval trinity path on {ok_a}/{n_a} items; "
              f"zero head replayed with the eval seeds == random-routing path on {ok_r}/{n_r} items")

    # ------------------------------------------------------------------ Q2
    def q2(self):
        print("\n" + "=" * 100)
        print("Q2. Hidden-state geometry and what the head's logits are made of")
        print("=" * 100)
        keys = list(self.all_states)
        H = np.array([self.all_states[k] for k in keys], dtype=np.float64)
        task_of = {}
        for n in self._nodes.values():
            task_of.setdefault(n.key, n.task)
        norms = np.linalg.norm(H, axis=1)
        mu = H.mean(0)
        C = H - mu
        print(f"states: {len(H)} (all stored, this encoder); root states (parquet): {len(self.root_states)}")
        print(f"||h||: mean {norms.mean():.2f}, min {norms.min():.2f}, max {norms.max():.2f}; ||mean(h)|| = "
              f"{np.linalg.norm(mu):.2f}; ||h - mean||: mean {np.linalg.norm(C, axis=1).mean():.2f}")
        frac = (np.linalg.norm(mu) ** 2) / (norms ** 2).mean()
        print(f"fraction of E||h||^2 in the common mean: {frac:.3f}  (E||h-mean||^2 / E||h||^2 = {1 - frac:.3f})")
        A = np.abs(H)
        med = np.median(A, axis=1)
        top = np.sort(A, axis=1)[:, ::-1]
        print(f"per state: top-1 |h_i| / median |h_i| = {np.median(top[:, 0] / med):.1f} (median over states); "
              f"top-5 |h_i| = {_fmt(np.median(top[:, :5], axis=0), 1)}; median |h_i| = {np.median(med):.3f}")
        dims = np.argsort(-np.abs(mu))[:6]
        print(f"largest |mean| dims: {[(int(i), round(float(mu[i]), 2)) for i in dims]}; their share of ||mean||^2: "
              f"{(mu[dims] ** 2).sum() / (mu ** 2).sum():.3f}; share of E||h||^2: "
              f"{(H[:, dims] ** 2).sum() / (H ** 2).sum():.3f}")
        top1 = int(np.argmax(np.abs(mu)))
        print(f"share of E||h−mean||² (the task/turn-specific part) in dim {top1} alone: "
              f"{(C[:, top1] ** 2).sum() / (C ** 2).sum():.3f}; in the 6 largest-mean dims: "
              f"{(C[:, dims] ** 2).sum() / (C ** 2).sum():.3f}")
        from trinity.coordinator.roles import coordinator_text

        tails = sorted((float(self.all_states[n.key][top1]), coordinator_text(n.task, n.turns)[-14:])
                       for n in self._nodes.values() if n.state is not None)
        print(f"  dim {top1} vs the transcript's last characters (the feature is the penultimate token's state): "
              f"lowest {[(round(v, 1), t) for v, t in tails[:3]]}; highest {[(round(v, 1), t) for v, t in tails[-3:]]}")
        sd = C.std(0)
        print(f"per-dim std across states: median {np.median(sd):.3f}, max {sd.max():.3f} (dim {int(sd.argmax())}); "
              f"|mean_i|/std_i for the top |mean| dim: {abs(mu[dims[0]]) / max(sd[dims[0]], 1e-12):.1f}")

        def cos(X):
            Xn = X / np.linalg.norm(X, axis=1, keepdims=True)
            return Xn @ Xn.T

        # roots: one state per task
        rid = list(self.root_states)
        R = np.array([self.root_states[i] for i in rid])
        src = [self.tasks[i].source if i in self.tasks else i.split("/")[0] for i in rid]
        Cr = cos(R)
        Crc = cos(R - mu)
        iu = np.triu_indices(len(R), 1)
        same = np.array([src[a] == src[b] for a, b in zip(*iu)])
        print(f"root states ({len(R)} tasks): cosine between different tasks: mean {Cr[iu].mean():.3f}, min "
              f"{Cr[iu].min():.3f}; same benchmark {Cr[iu][same].mean():.3f} vs different benchmark "
              f"{Cr[iu][~same].mean():.3f}")
        print(f"  after subtracting the all-states mean: mean {Crc[iu].mean():.3f}; same benchmark "
              f"{Crc[iu][same].mean():.3f} vs different {Crc[iu][~same].mean():.3f}")
        # all states of different tasks
        tk = [task_of.get(k) for k in keys]
        ids = [t.id if t is not None else None for t in tk]
        Ca = cos(H)
        ia = np.triu_indices(len(H), 1)
        diff = np.array([ids[a] is not None and ids[b] is not None and ids[a] != ids[b] for a, b in zip(*ia)])
        samet = np.array([ids[a] is not None and ids[a] == ids[b] for a, b in zip(*ia)])
        print(f"all stored states: cosine, different tasks: mean {Ca[ia][diff].mean():.3f} (min {Ca[ia][diff].min():.3f}); "
              f"same task (different turns): mean {Ca[ia][samet].mean():.3f}")
        # decomposition of the saved head's logits
        W, L = self.W, self.L
        common = W @ mu
        dev = C @ W.T  # (n, L+3)

        def centred(z, lo, hi):
            return z[..., lo:hi] - z[..., lo:hi].mean(-1, keepdims=True)

        cm, cr = centred(common, 0, L), centred(common, L, L + 3)
        dm, dr = centred(dev, 0, L), centred(dev, L, L + 3)
        print("\nsaved head: z = W·mean(h) + W·(h − mean)  (logits centred within the model / role groups, since "
              "softmax ignores a shared shift)")
        print(f"  model logits: W·mean = {_fmt(cm)}  (spread {np.ptp(cm):.3f}); W·(h−mean): std across states per "
              f"logit = {_fmt(dm.std(0))}, mean |.| = {np.abs(dm).mean():.3f}")
        print(f"  role  logits: W·mean = {_fmt(cr)}  (spread {np.ptp(cr):.3f}); W·(h−mean): std across states per "
              f"logit = {_fmt(dr.std(0))}, mean |.| = {np.abs(dr).mean():.3f}")
        full = C + mu
        am_full = (full @ W.T)[:, :L].argmax(1)
        ar_full = (full @ W.T)[:, L:].argmax(1)
        print(f"  states whose model argmax equals that of W·mean alone: {(am_full == cm.argmax()).mean():.0%}; "
              f"role argmax: {(ar_full == cr.argmax()).mean():.0%}")
        print(f"  share of the logit variation (mean square, centred) from the common part: model "
              f"{(cm ** 2).sum() / ((cm ** 2).sum() + (dm ** 2).sum(1).mean()):.2f}, role "
              f"{(cr ** 2).sum() / ((cr ** 2).sum() + (dr ** 2).sum(1).mean()):.2f}")
        # the massive dims' share in the logits
        Wd = W[:, dims]
        print(f"  share of W·mean (per logit, centred model group) carried by the {len(dims)} largest-mean dims: "
              f"{_fmt(centred(Wd @ mu[dims], 0, L))} of {_fmt(cm)}")
        # what a fresh candidate (x0=0, sigma0) sees
        s0 = self.settings.evolve.sigma0
        print(f"\na fresh candidate W ~ N(0, sigma0^2={s0}^2): logit std = sigma0·||h|| ≈ {s0 * norms.mean():.3f}, of "
              f"which common sigma0·||mean|| ≈ {s0 * np.linalg.norm(mu):.3f} and task-specific sigma0·||h−mean|| ≈ "
              f"{s0 * np.linalg.norm(C, axis=1).mean():.3f}")
        # separability: can a linear head tell benchmarks apart? centred, standardised root states
        Rs = (R - R.mean(0)) / (R.std(0) + 1e-6)
        print(f"  root states standardised per dim (train+eval roots' mean/std): ||h_std|| ≈ "
              f"{np.linalg.norm(Rs, axis=1).mean():.1f}; cosine between tasks: same benchmark "
              f"{cos(Rs)[iu][same].mean():.3f} vs different {cos(Rs)[iu][~same].mean():.3f}")
        self._H, self._mu = H, mu

    # ------------------------------------------------------------------ Q3
    def q3(self):
        from trinity.coordinator.head import softmax

        print("\n" + "=" * 100)
        print("Q3. Sampled vs argmax policy; how far the CMA mean moved")
        print("=" * 100)
        W, L = self.W, self.L
        nodes = [n for n in self._nodes.values() if n.state is not None and not n.terminal]
        Z = np.array([W @ n.state for n in nodes])
        PM, PR = softmax(Z[:, :L]), softmax(Z[:, L:])
        print(f"max softmax prob per state ({len(nodes)} states): model mean {PM.max(1).mean():.3f} (uniform "
              f"{1 / L:.3f}, max {PM.max():.3f}); role mean {PR.max(1).mean():.3f} (uniform 0.333, max {PR.max():.3f})")
        print(f"mean prob per model: { {self.names[i]: round(float(PM[:, i].mean()), 3) for i in range(L)} }; "
              f"per role: {dict(zip(['thinker', 'worker', 'verifier'], np.round(PR.mean(0), 3).tolist()))}")
        Ws = np.stack([W, np.zeros_like(W)])
        tasks = [t for t in self.tasks.values() if t.grader != "judge"]
        print("\nexact expectations by enumerating every path through the stored trees (unknown = mass reaching a "
              "never-asked edge / a missing state / an ungradeable answer)")
        print(f"{'task':40s} {'split':8s} {'saved head: E[acc] E[reward] unknown':38s} {'zero head (uniform)':24s} "
              f"argmax path -> outcome (correct)")
        agg = defaultdict(list)
        for t in tasks:
            e = self.expect(t, Ws)
            how, c, _, path, _ = self.play(t, W, None)
            unk = e["unknown"] + e["unknown_grade"]
            sp = self.split_of[t.id][:8]
            print(f"{t.id[:40]:40s} {sp:8s} {e['acc'][0]:.3f}  {e['reward'][0]:.3f}  {unk[0]:.3f}"
                  f"                 {e['acc'][1]:.3f} {e['reward'][1]:.3f} {unk[1]:.3f}   "
                  f"{'>'.join(m[:8] + '/' + r[:2] for m, r in path)} -> {how} ({c})")
            agg[sp].append((e, c))
        for sp, xs in agg.items():
            acc = np.mean([x[0]["acc"] for x in xs], axis=0)
            unk = np.mean([x[0]["unknown"] + x[0]["unknown_grade"] for x in xs], axis=0)
            rew = np.mean([x[0]["reward"] for x in xs], axis=0)
            bonus = np.mean([x[0]["bonus"] for x in xs], axis=0)
            vf = np.mean([x[0]["vfirst"] for x in xs], axis=0)
            acc_end = np.mean([x[0]["accept"] for x in xs], axis=0)
            turns = np.mean([x[0]["turns"] for x in xs], axis=0)
            am = [x[1] for x in xs]
            print(f"  {sp:8s} sampled saved head: E[acc] in [{acc[0]:.3f}, {acc[0] + unk[0]:.3f}] (given known: "
                  f"{acc[0] / max(1 - unk[0], 1e-9):.3f}), E[reward] known-part "
                  f"{rew[0]:.3f}, E[bonus-penalty] {bonus[0]:.3f}, P(verifier-first)={vf[0]:.3f}, P(ACCEPT ends)="
                  f"{acc_end[0]:.3f}, E[turns]≥{turns[0]:.2f}, unknown {unk[0]:.3f} | zero head: E[acc] in "
                  f"[{acc[1]:.3f}, {acc[1] + unk[1]:.3f}], P(vfirst)={vf[1]:.3f} | argmax: correct "
                  f"{sum(x for x in am if x is not None):.0f}/{len(am)} (unknown {sum(x is None for x in am)})")
        # the saved-fitness episodes of the final generation, replayed with their own streams
        from trinity.coordinator.episode import episode_rng, shaped_reward
        from trinity.evolve.loop import saved_fitness_episodes

        scoring = saved_fitness_episodes(self.settings, self.train)
        res = [self.play(t, self.W, episode_rng(self.settings.evolve.seed, "saved-fitness", k, t.id))
               for t, k in scoring]
        left = sum(x[0] in ("unexplored", "missing-state") for x in res)
        ungraded = [i for i, x in enumerate(res) if x[1] is None and x[0] not in ("unexplored", "missing-state")]
        if not left:
            # an ungraded (code) answer: its reward is the bonus alone if wrong; assume wrong, then check the sums
            rew0 = []
            for x in res:
                if x[2] is not None:
                    rew0.append(x[2])
                else:
                    x[4].correct = 0.0
                    rew0.append(shaped_reward(x[4], self.max_turns, self.rw))
            acc0 = np.mean([x[1] or 0.0 for x in res])
            print(f"\nsaved-fitness episodes of the final mean replayed ({len(res)} sampled episodes, the run's own "
                  f"streams; {len(ungraded)} code answers ungradeable here, taken as wrong): fitness {np.mean(rew0):.4f}, "
                  f"accuracy {acc0:.3f} (checkpoint: {self.meta.get('saved_fitness', float('nan')):.4f}, "
                  f"{self.meta.get('saved_accuracy', float('nan')):.3f})")
            print(f"  SE of that 16-episode figure from its own episodes: std/sqrt(n) = "
                  f"{np.std(rew0, ddof=1) / math.sqrt(len(rew0)):.3f}; one correct episode more or less moves it by "
                  f"{1 / len(rew0):.3f} (history: saved_accuracy {[round(h['saved_accuracy'], 3) for h in self.history]})")
        else:
            print(f"\nsaved-fitness replay: {left}/{len(res)} episodes leave the stored tree")
        for (t, k), x in zip(scoring, res):
            if x[1]:
                print(f"  correct: {t.id} sample {k}: {x[3]} -> {x[0]}")
        ends = Counter(x[0] for x in res)
        print(f"  endings: {dict(ends)}; argmax on the same 8 training tasks: see the table above (0 known correct)")
        # is the mean's preference along mean(h) larger than a random vector's?
        mh = self._mu / np.linalg.norm(self._mu)
        zs = [(W[i] @ mh) / (np.linalg.norm(W[i]) / math.sqrt(self.d)) for i in range(L + 3)]
        print(f"  saved head rows projected on mean(h)/||mean(h)||, in units of a random row's std "
              f"(||W_i||/sqrt(d)): {_fmt(zs, 2)}  (models {self.names}, roles [th, wo, ve])")

        # movement of the mean
        from trinity.evolve.loop import load_run_state

        st = load_run_state(self.root / "data/store/evolve_state.pkl")
        es = st.optimizer.es
        mean = np.asarray(es.mean, dtype=np.float64)
        n = mean.size
        sig = float(es.sigma)
        s0 = self.settings.evolve.sigma0
        mueff = float(es.sp.weights.mueff)
        gens = int(st.generation)
        rw = s0 * math.sqrt(n / mueff) * math.sqrt(gens)
        sv = getattr(es, "sigma_vec", None)
        scal = np.asarray(getattr(sv, "scaling", np.ones(n)) if sv is not None else np.ones(n), dtype=float)
        D = np.asarray(getattr(es, "D", np.ones(n)), dtype=float) * (scal if scal.size == n else 1)
        print(f"\nCMA state after {gens} generations: ||mean|| = {np.linalg.norm(mean):.3f} (= saved head: "
              f"{np.allclose(mean, self.params)}); sigma = {sig:.4f} (sigma0 {s0}); sigma·sqrt(n) = "
              f"{sig * math.sqrt(n):.3f}; one sample's distance sigma0·sqrt(n) = {s0 * math.sqrt(n):.3f}")
        print(f"  pure-noise random walk of the mean (no fitness signal): sigma0·sqrt(n/mueff)·sqrt(gens) = "
              f"{s0:.2f}·sqrt({n}/{mueff:.2f})·sqrt({gens}) = {rw:.3f}  -> observed/random-walk = "
              f"{np.linalg.norm(mean) / rw:.2f}")
        print(f"  diagonal scaling (sqrt of the covariance diagonal): min {D.min():.4f}, max {D.max():.4f} "
              f"(unadapted = 1)")
        mu = self._mu
        Wm = mean.reshape(L + 3, self.d)
        print(f"  mean head: logit std over states from its task-specific part: "
              f"{((self._H - mu) @ Wm.T).std(0).mean():.3f}; |W·mean(h)| per logit: {_fmt(Wm @ mu)}")
        self.cma_mean, self.cma_sigma = mean, sig

    # ------------------------------------------------------------------ Q4
    def q4(self, n_heads: int):
        print("\n" + "=" * 100)
        print("Q4. Fitness noise")
        print("=" * 100)
        print(f"episodes table runs: {[(r[0], r[1]) for r in self.runs]}; analysing {self.run_id}")
        by_g = defaultdict(list)
        for g, c, tid, path, reward, correct in self.episodes:
            by_g[g].append((c, tid, reward, correct, path))
        pooled_within = []
        rows = []
        for g in sorted(by_g):
            eps = by_g[g]
            tids = sorted({e[1] for e in eps})
            cands = sorted({e[0] for e in eps})
            R = np.array([[next(e[2] for e in eps if e[0] == c and e[1] == t) for t in tids] for c in cands])
            Cc = np.array([[next(e[3] for e in eps if e[0] == c and e[1] == t) for t in tids] for c in cands])
            fit = R.mean(1)
            fit_c = Cc.mean(1)
            bonus = (R - Cc).mean(1)
            within = R.var(0, ddof=1)  # per task, across candidates
            pooled_within += list(within)
            pooled_solved = getattr(self, "_pooled_solved", [])
            pooled_solved += [v for j, v in enumerate(within) if Cc[:, j].max() > 0]
            self._pooled_solved = pooled_solved
            has_c = (Cc > 0).any(1)
            mu_sel = len(cands) // 2
            top = np.argsort(-fit)[:mu_sel]
            med = np.median(fit)
            above = fit - med
            single = [i for i in range(len(cands)) if abs(above[i]) > 0.25 and (Cc[i] > 0).sum() == 1]
            print(f"gen {g}: tasks {tids}; {len(cands)} candidates")
            print(f"  fitness mean {fit.mean():.3f}, std across candidates {fit.std(ddof=1):.3f} (min {fit.min():.3f}, "
                  f"max {fit.max():.3f}); correctness part std {fit_c.std(ddof=1):.3f}, bonus−penalty part std "
                  f"{bonus.std(ddof=1):.3f}")
            print(f"  correct rate per task across candidates: "
                  f"{ {t[:30]: round(float(Cc[:, j].mean()), 3) for j, t in enumerate(tids)} }")
            print(f"  per-task reward std across candidates: {_fmt(np.sqrt(within))}")
            print(f"  candidates with a correct episode: {int(has_c.sum())}; of the top {mu_sel} (CMA's parents): "
                  f"{int(has_c[top].sum())}; candidates > 0.25 from the median because of exactly one correct "
                  f"episode: {len(single)}/{len(cands)}; the best candidate's fitness {fit.max():.3f} = correct "
                  f"{fit_c[np.argmax(fit)]:.3f} + bonus {bonus[np.argmax(fit)]:.3f}")
            if R.shape[1] == 2:
                r_ = np.corrcoef(R[:, 0], R[:, 1])[0, 1]
                print(f"  correlation across candidates of their rewards on the two tasks: r = {r_:.2f} (pure noise: "
                      f"0 ± {1 / math.sqrt(len(cands) - 1):.2f}); a real fitness difference would make it positive")
            var_c = fit_c.var(ddof=1)
            print(f"  share of candidate fitness variance from correctness: "
                  f"{var_c / max(fit.var(ddof=1), 1e-12):.2f}")
            rows.append((g, tids, fit))
        try:
            from trinity.evolve.loop import load_run_state

            st = load_run_state(self.root / "data/store/evolve_state.pkl")
            w = np.asarray(st.optimizer.es.sp.weights)[: len(cands) // 2]
            print(f"CMA recombination weights of the top {len(w)}: top-1 {w[0]:.3f}, top-2 together {w[:2].sum():.3f} of "
                  f"{w.sum():.3f}: in gens 1-2 the two candidates with one lucky correct episode set ~"
                  f"{w[:2].sum() / w.sum():.0%} of the mean's step")
        except Exception as e:  # noqa: BLE001
            print(f"(optimiser state unreadable: {e})")
        s2 = float(np.mean(pooled_within))
        s = math.sqrt(s2)
        n1 = s2 / 0.1 ** 2
        n2 = 2 * s2 / 0.1 ** 2
        print(f"\nper-episode reward std within a task (pooled over tasks and generations): {s:.3f}")
        print(f"  tasks per candidate for SE(fitness) = 0.1: n ≥ s²/0.01 = {n1:.1f}; to resolve a 0.1 difference "
              f"between two candidates at 1 sigma: n ≥ 2s²/0.01 = {n2:.1f} (at 2 sigma: {4 * n2:.0f}); now: 2")
        if getattr(self, "_pooled_solved", None):
            s2s = float(np.mean(self._pooled_solved))
            print(f"  on tasks some candidate solved (where correctness, the thing to learn, varies): s = "
                  f"{math.sqrt(s2s):.3f} -> 1-sigma 0.1 difference needs n ≥ {2 * s2s / 0.01:.1f} tasks "
                  f"(2 sigma: {8 * s2s / 0.01:.0f})")
        # signal: exact expected fitness of candidates drawn around the CMA mean
        L = self.L
        rng = np.random.default_rng(12345)
        mean = getattr(self, "cma_mean", self.params)
        sig = getattr(self, "cma_sigma", self.settings.evolve.sigma0)
        K = n_heads
        X = mean[None, :] + sig * rng.standard_normal((K, mean.size))
        Ws = X.reshape(K, L + 3, self.d)
        print(f"\nsignal (indicative only: the explored part of the trees; unexplored mass counts 0): {K} candidates ~ "
              f"N(CMA mean, sigma={sig:.4f}²I); exact expected fitness on each generation's tasks")
        for g, tids, fit in rows:
            ex = [self.expect(self.tasks[t], Ws) for t in tids]
            f = np.mean([e["reward"] for e in ex], axis=0)
            unk = np.mean([e["unknown"] + e["unknown_grade"] for e in ex], axis=0)
            b = np.mean([e["bonus"] for e in ex], axis=0)
            print(f"  gen {g}: std of exact E[fitness] across candidates = {f.std():.4f} (bonus part {b.std():.4f}; "
                  f"mean E[fitness] known-part {f.mean():.3f}, unknown mass {unk.mean():.3f}) vs observed std "
                  f"{fit.std(ddof=1):.3f} -> signal share of variance ≈ {f.var() / max(fit.var(ddof=1), 1e-12):.3f}")
        ex = [self.expect(t, Ws) for t in self.train]
        f = np.mean([e["reward"] for e in ex], axis=0)
        unk = np.mean([e["unknown"] + e["unknown_grade"] for e in ex], axis=0)
        print(f"  all {len(self.train)} training tasks: std of exact E[fitness] across candidates {f.std():.4f} "
              f"(unknown mass {unk.mean():.3f})")
        # saved fitness curve vs exact
        ex0 = [self.expect(t, np.zeros((1, L + 3, self.d))) for t in self.train]
        ex1 = [self.expect(t, self.W[None]) for t in self.train]
        f0 = np.mean([e["reward"] for e in ex0])
        f1 = np.mean([e["reward"] for e in ex1])
        u0 = np.mean([e["unknown"] + e["unknown_grade"] for e in ex0])
        u1 = np.mean([e["unknown"] + e["unknown_grade"] for e in ex1])
        hist = [round(h["saved_fitness"], 3) for h in self.history]
        print(f"\nsaved_fitness per generation (16 fixed sampled episodes): {hist}; exact expected fitness on all "
              f"training tasks: zero head (x0) {f0:.3f} (unknown {u0:.3f}) vs saved head {f1:.3f} (unknown {u1:.3f})")

    # ------------------------------------------------------------------ Q5
    def q5(self):
        print("\n" + "=" * 100)
        print("Q5. Other checks")
        print("=" * 100)
        mt = self.settings.pool.members
        cap = {m.name: m.max_tokens for m in mt}
        by = defaultdict(Counter)
        for mid, role, msgs, text, ok, ct, failure, sampling in self.responses:
            if role != "worker" or not ok:
                continue
            name = self.names[self.model_index[mid]] if mid in self.model_index else mid
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
        for name in self.names:
            c = by.get(name, Counter())
            print(f"  {name:16s} n={c['n']:3d} hit max_tokens: {c['at_cap']:3d} ({c['at_cap'] / max(c['n'], 1):.0%}); "
                  f"math with \\boxed: {c['math_boxed']}/{c['math']}; choice with 'Answer:': "
                  f"{c['choice_line']}/{c['choice']}; code with a closed ``` block: {c['code_closed']}/{c['code']}")
        # labelled accuracy per model as Worker at the root
        print("[first-turn Worker accuracy per model, all tasks with a stored root Worker reply and a grade]")
        from trinity.coordinator.roles import Role

        acc = defaultdict(list)
        for t in self.tasks.values():
            if t.grader == "judge":
                continue
            n = self.node(t)
            for m in range(self.L):
                c = self.child(n, m, Role.WORKER)
                if c is None:
                    continue
                g = self.label(t, c.answer)
                if g is not None:
                    acc[self.names[m]].append(g)
        print("  " + "; ".join(f"{k}: {sum(v):.0f}/{len(v)}" for k, v in acc.items()))
        # MT-Bench: verifier-first conversation turns that still get a score
        for r in self.eval_rows:
            if r["benchmark"] == "mt_bench" and r["verifier_first"] and r["score"]:
                js = [(j["turn"], j["score"], j["error"]) for j in r["judge"]]
                print(f"[MT-Bench] {r['method']} on {r['task_id']}: verifier_first=True (a conversation turn had no "
                      f"answer) yet score={r['score']} from judge turns {js}: the answerless turn is dropped as "
                      f"'unparseable' instead of scoring 0")
        jf = Counter()
        for r in self.eval_rows:
            for j in r.get("judge") or []:
                jf["rated" if j["score"] is not None else "no rating"] += 1
        if jf:
            print(f"[MT-Bench judge] judgements: {dict(jf)} (an unrated item is unscored: alone:qwen-coder-1.5b has no "
                  f"held-out average for this reason)")
        dup = [r for r in self.runs]
        if len(dup) > 1:
            print(f"[episodes table] {len(dup)} run_ids hold episodes {[(r[0][-8:], r[1]) for r in dup]}: a reader "
                  f"that does not filter on run_id double-counts")
        print(f"[states] store states for this encoder: {len(self.all_state_keys)}; not mapped to any rebuilt "
              f"transcript: {len(getattr(self, 'unmapped_states', []))}; non-terminal transcripts visited by the "
              f"enumerations whose state is missing: {len(self.missing_states)}")
        # root states parquet vs store
        mism = 0
        for tid, v in self.root_states.items():
            s = self.all_states.get(self.root_keys[tid])
            if s is None or not np.allclose(s, v, atol=1e-5):
                mism += 1
        print(f"[root states] parquet rows {len(self.root_states)}; differing from / missing in the store: {mism}")


if __name__ == "__main__":
    raise SystemExit(main())
