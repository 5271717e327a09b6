"""A finished run as its files hold it, and its rollout trees rebuilt from the store (read-only).

`StoredRun` opens the checkpoint, the store (read-only), the prepared tasks, the root states, the evaluation's
episodes and the evolve history. A node of a task's tree (`Node`) is a transcript; its children are the stored
replies to the loop's own requests (`RolloutTrees.request`, the run's pool and role sampling); what may be picked
there and whether a path ends is `rollout.StepRule` with the run's `coordinator` settings and the training loops'
`stop_on_outage`. `expect` gives exact expectations under heads (`rollout.enumerate_paths`), `play` replays one
episode with the loop itself (`play_episodes`) on `StoredPool`, which answers from the store and calls nothing.

Grades: an answer a run graded (a training episode, an evaluation row) keeps that grade (`label`); an ungraded
math or choice answer is graded here (unless --no-grade); an ungraded code or judge answer is unknown.
"""
from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import numpy as np

from trinity.coordinator.episode import Episode, RolloutTrees, play_episodes, shaped_reward
from trinity.coordinator.roles import ROLES, Role, Turn, coordinator_text, latest_answer, turn_of
from trinity.coordinator.rollout import ENDINGS, StepRule, enumerate_paths
from trinity.store import text_key


def fmt(v, nd=3) -> str:
    """A vector as one short line."""
    return "[" + ", ".join(f"{x:.{nd}f}" for x in v) + "]"


def banner(title: str) -> None:
    print("\n" + "=" * 100)
    print(title)
    print("=" * 100)


class Unexplored(Exception):
    """A replayed episode asked a request the store has no reply to (the run never asked it)."""


class MissingState(Exception):
    """A replayed episode reached a transcript whose hidden state is not in the store."""


class StoredPool:
    """The run's pool as the diagnosis plays it: the same requests and keys (`Pool.request`), every reply from the
    store; a request never asked raises Unexplored (nothing is called)."""

    def __init__(self, pool):
        self.pool, self.store, self.names = pool, pool.store, pool.names

    def __len__(self) -> int:
        return len(self.pool)

    def signature(self, asks):
        return self.pool.signature(asks)

    def request(self, idx, messages, ask, label=None):
        return self.pool.request(idx, messages, ask, label)

    async def complete_many(self, requests):
        replies = [self.store.get_response(r.key) for r in requests]
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
    """A transcript of a task's rollout tree, as rebuilt from the store: its turns, the key and (mapped) state the
    head reads, what its last call cost, the role its last turn forces and why the episode ends there (the run's
    `StepRule`)."""

    __slots__ = ("task", "turns", "key", "answer", "state", "children", "forced", "ending", "call_cost")

    def __init__(self, task, turns, key, answer):
        self.task, self.turns, self.key, self.answer = task, turns, key, answer
        self.state = None
        self.children = {}  # (model index, Role) -> child Node, or None when no stored reply
        self.forced: Role | None = None
        self.ending: str | None = None
        self.call_cost = 0.0

    @property
    def terminal(self) -> bool:
        return self.ending is not None


class StoredRun:
    def __init__(self, root: Path, grade_unlabelled: bool = True):
        import pyarrow.parquet as pq

        from trinity.config import load_settings
        from trinity.coordinator.policy import Policy
        from trinity.coordinator.role_sampling import RoleSampling
        from trinity.coordinator.roles import allowed_roles
        from trinity.data.splits import load_tasks
        from trinity.pool.runtime import build_pool
        from trinity.records import Task
        from trinity.stages.paths import SPLIT_FILES, Paths
        from trinity.store import Store

        self.root = root
        paths = Paths(root)
        self.settings = load_settings(root / "params.yaml")
        co = self.settings.coordinator
        self.max_turns = co.max_turns
        self.rule = StepRule(co.max_turns, allowed_roles(co), co.answer_rule, stop_on_outage=True)
        self.rw = self.settings.reward
        policy = Policy.load(paths.checkpoint)
        policy.check(self.settings)
        self.params, self.meta, self.features = policy.params, policy.meta, policy.features
        self.enc_id = self.meta.encoder
        self.names = [p.name for p in self.meta.pool]
        self.model_index = {p.model_id: i for i, p in enumerate(self.meta.pool)}
        self.L = len(self.names)
        self.d = self.meta.dim
        self.W = self.params.reshape(self.L + 3, self.d)
        self.grade_unlabelled = grade_unlabelled

        self.tasks: dict[str, Task] = {}
        self.split_of: dict[str, str] = {}
        for split in ("train", "in_distribution", "heldout"):
            for t in load_tasks(paths.prepared / SPLIT_FILES[split]):
                self.tasks[t.id] = t
                self.split_of[t.id] = split
        self.train = [self.tasks[i] for i in self.meta.train_tasks]

        self.store = Store(paths.store, read_only=True)
        self.pool = StoredPool(build_pool(self.settings.pool, self.store))
        self.role_sampling = RoleSampling.of(self.settings)  # what each role asked in the run
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
        rt = pq.read_table(paths.encoded / "root_states.parquet").to_pydict()
        self.root_states = {tid: np.asarray(s, dtype=np.float64) for tid, s in zip(rt["task_id"], rt["state"])}
        self.root_keys = dict(zip(rt["task_id"], rt["key"]))
        self.eval_rows = [json.loads(x) for x in (paths.eval_dir / "episodes.jsonl").read_text().splitlines()
                          if x.strip()]
        self.history = json.loads((paths.evolve_dir / "history.json").read_text())
        self.runs = con.execute("SELECT run_id, count(*), min(generation), max(generation) FROM episodes GROUP BY 1 "
                                "ORDER BY 1").fetchall()
        cv = self.meta.code_version or ""
        mine = [r[0] for r in self.runs if cv and r[0].endswith(cv[:8])]
        self.run_id = mine[0] if mine else (self.runs[-1][0] if self.runs else None)
        self.episodes = con.execute(
            "SELECT generation, candidate, task_id, path, reward, correct FROM episodes WHERE run_id = ? "
            "ORDER BY generation, candidate, task_id", [self.run_id]).fetchall() if self.run_id else []
        self._labels: dict[tuple[str, str], float] = {}
        self.nodes: dict[tuple, Node] = {}
        self.missing_states: set[str] = set()
        self.unmapped_states: list[str] = []
        self.trees_built = False
        self._label_from_runs()

    def member(self, model_id: str) -> str:
        """The pool name of a stored response's model id (the id itself when no member has it)."""
        return self.names[self.model_index[model_id]] if model_id in self.model_index else model_id

    # ------------------------------------------------------------------ trees
    def feat(self, H):
        """What the head reads from raw hidden states H (d,) or (n, d): the checkpoint's feature map, if any."""
        H = np.asarray(H, dtype=np.float64)
        if self.features is None:
            return H
        mapped = self.features(np.atleast_2d(H).astype(np.float32))
        return np.asarray(mapped, dtype=np.float64).reshape(H.shape[:-1] + (-1,))

    def node(self, task, turns=()) -> Node:
        """The node of a transcript (one per task and turns: a Turn's identity includes its model)."""
        k = (task, turns)
        n = self.nodes.get(k)
        if n is not None:
            return n
        key = text_key(coordinator_text(task, turns))
        n = Node(task, turns, key, latest_answer(turns))
        v = self.all_states.get(key)
        if v is not None:
            n.state = self.feat(v)
        n.forced = self.rule.forced_role(turns)
        n.ending = self.rule.ending(turns) if turns else None
        self.nodes[k] = n
        return n

    def child(self, n: Node, m: int, role: Role) -> Node | None:
        """The child reached by (model m, role) from n: the loop's request, answered by the store (None: never
        asked)."""
        ck = (m, role)
        if ck in n.children:
            return n.children[ck]
        req = self.memo.request(self.pool, self.role_sampling, n.task, n.turns, m, role)
        resp = self.store.get_response(req.key)
        c = None
        if resp is not None:
            c = self.node(n.task, n.turns + (turn_of(self.names[m], role, resp),))
            c.call_cost = resp.cost_usd
        n.children[ck] = c
        return c

    def cost(self, task, turns) -> float:
        """What the calls of a stored transcript cost (USD, as their replies recorded)."""
        return sum(self.node(task, turns[:i + 1]).call_cost for i in range(len(turns)))

    def pickable(self, n: Node) -> list[Role]:
        """The roles a pick at n may take under the run's rule: the forced one, else the unmasked ones."""
        if n.forced is not None:
            return [n.forced]
        return [r for r, ok in zip(ROLES, self.rule.role_mask(n.turns)) if ok]

    def walk_path(self, task, path):
        """Follow a stored path [[model, role], ...] (forced roles are already in it). Returns (node, status):
        status is the rule's ending, "open" (the path stops before one), "missing" (a reply not in the store) or
        "disallowed" (a pick the rule does not allow: a run made under older rules, e.g. a Verifier first)."""
        n = self.node(task)
        for m, r in path:
            role = Role(r)
            if role not in self.pickable(n):
                return n, "disallowed"
            c = self.child(n, int(m), role)
            if c is None:
                return n, "missing"
            n = c
        return n, n.ending or "open"

    def build_all_trees(self) -> list[Node]:
        """Expand every stored edge the rule allows of every task tree (train, eval, and MT-Bench follow-ups from the
        eval rows); returns the roots."""
        roots = [self.node(t) for t in self.tasks.values()]
        for r in self.eval_rows:  # MT-Bench second turns: history = the method's own first answer
            t = self.tasks.get(r["task_id"])
            if t is None or t.grader != "judge" or len(t.prompt) < 2:
                continue
            first = tuple(Turn(x["model"], Role(x["role"]), x["text"], x["ok"]) for x in r["turns"]
                          if x["conversation_turn"] == 1)
            roots.append(self.node(t.follow_up(2, (self.rule.answer(first) or "",))))
        if self.trees_built:
            return roots
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n.terminal:
                continue
            for role in self.pickable(n):
                for m in range(self.L):
                    c = self.child(n, m, role)
                    if c is not None:
                        stack.append(c)
        self.trees_built = True
        keys = {n.key for n in self.nodes.values()}
        self.unmapped_states = [k for k in self.all_state_keys if k not in keys]
        return roots

    # ------------------------------------------------------------------ grading
    def _label_from_runs(self):
        for g, c, tid, path, reward, correct in self.episodes:
            t = self.tasks.get(tid)
            if t is None:
                continue
            n, st = self.walk_path(t, json.loads(path))
            answer = self.rule.answer(n.turns)
            if st != "disallowed" and answer is not None:
                self._labels[(tid, answer)] = float(correct)
        for r in self.eval_rows:
            t = self.tasks.get(r["task_id"])
            if t is None or t.grader == "judge" or r["score"] is None or r["verifier_first"]:
                continue
            if r["answer"] is not None:
                self._labels[(t.id, r["answer"])] = float(r["score"])

    def label(self, task, answer):
        """The grade of an answer: the run's, else graded here (math, choice), else None (unknown)."""
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

    def reward(self, task, turns, picks, correct: float, cost_usd: float = 0.0) -> float | None:
        """trinity's shaped reward of an episode with these turns and picks [(model, Role)...]."""
        ep = Episode(task=task, candidate=0, rng=None, turns=turns, picks=list(picks), cost_usd=cost_usd,
                     correct=correct, outage=self.rule.ending(turns) == "outage" if turns else False)
        return shaped_reward(ep, self.max_turns, self.rw)

    # ------------------------------------------------------------------ policy enumeration
    def expect(self, task, Ws: np.ndarray, greedy: bool = False) -> dict[str, np.ndarray]:
        """Exact expectations over the policy of K heads Ws (K, L+3, d) on one task, over every path of its stored
        tree (`rollout.enumerate_paths`). Mass that reaches a never-asked edge or a state not in the store is
        "unknown", mass on an ungradeable answer "unknown_grade". Returns a dict of (K,) arrays: acc, reward (the
        known part), bonus (reward − correctness), turns, the mass of each of the rule's endings, and the bounds
        reward_lo / reward_hi with the unknown mass at the lowest / highest possible reward."""
        K = Ws.shape[0]
        out = {k: np.zeros(K) for k in ("acc", "reward", "unknown", "unknown_grade", "turns", "bonus") + ENDINGS}
        lo_r = -self.rw.turn_penalty_weight * ((self.max_turns - 1) / self.max_turns) / 4
        hi_r = 1 + self.rw.diversity_weight * math.log(min(self.L, self.max_turns))

        def state(turns):
            return self.node(task, turns).state

        def child(turns, m, role):
            c = self.child(self.node(task, turns), m, role)
            return None if c is None else (c.turns[-1], c.call_cost)

        for path in enumerate_paths(self.rule, Ws, self.L, state, child, greedy=greedy):
            p = path.prob
            if not path.explored:
                if path.end == "missing_state":
                    self.missing_states.add(self.node(task, path.turns).key)
                out["unknown"] += p
                continue
            out[path.end] += p
            out["turns"] += p * len(path.turns)
            if path.end == "outage":  # not a sample: no reward (never in a store, which keeps no outage)
                continue
            b = self.reward(task, path.turns, path.picks, 0.0, path.cost_usd)
            out["bonus"] += p * b
            c = self.label(task, self.rule.answer(path.turns))
            if c is None:
                out["unknown_grade"] += p
                continue
            out["acc"] += p * c
            out["reward"] += p * (c + b)
        out["reward_lo"] = out["reward"] + (out["unknown"] + out["unknown_grade"]) * lo_r
        out["reward_hi"] = out["reward"] + (out["unknown"] + out["unknown_grade"]) * hi_r
        return out

    def play(self, task, W, rng):
        """One episode of head W played by trinity's loop on the stored tree, sampled with `rng` (None: argmax),
        under the run's rule. Returns (outcome, correct, reward, path, episode): outcome is the rule's ending,
        "unexplored" (a request the store has no reply to) or "missing-state"; correct and reward are None when
        unknown (an ungradeable answer, or the episode left the stored tree); path = [(member name, role)...] of
        the picks made."""
        ep = Episode(task=task, candidate=0, rng=rng)
        try:
            asyncio.run(play_episodes([ep], [W], self.pool, self.states, self.max_turns, self.rw, self._grade,
                                      trees=self.memo, stop_on_outage=self.rule.stop_on_outage,
                                      roles=self.rule.roles, answer_rule=self.rule.answer_rule,
                                      role_sampling=self.role_sampling))
        except (Unexplored, MissingState) as e:
            return ("unexplored" if isinstance(e, Unexplored) else "missing-state"), None, None, self.named(ep), ep
        how = self.rule.ending(ep.turns)
        if math.isnan(ep.correct):
            return how, None, None, self.named(ep), ep
        return how, ep.correct, ep.reward, self.named(ep), ep

    def named(self, ep):
        """An episode's picks as (member name, role name) pairs."""
        return [(self.names[m], role.value) for m, role in ep.picks]

    def _grade(self, task, answer) -> float:
        """The loop's grade: a known label (NaN when the answer cannot be graded here)."""
        g = self.label(task, answer)
        return math.nan if g is None else g
