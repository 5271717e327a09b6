"""A known-answer problem for the training machinery: a scripted pool whose competence is known by construction.

Three task families the encoder can tell apart — arithmetic (graded by the math grader), multiple choice (the
choice grader) and code (assert tests run in the real sandbox) — and four scripted members:

- `arith-expert`, `choice-expert`, `code-expert` each answer their own family correctly and every other
  family wrongly (a plausible wrong answer in the right format: graders see real text);
- `mute` answers nothing ("I am not sure."), as Worker, Thinker and Verifier.

As Verifier every member but `mute` accepts a correct answer with probability `accept_correct` and a wrong
one with probability `accept_wrong` (decided by a hash of member, task and answer: deterministic, so the
rollout trees stay memoised). As Thinker they suggest a plan and hand over to a Worker.

So the oracle router (for each task, its family's expert as Worker) scores 1.0, every single member alone
1/3 (one family in three), and a coordinator that has learnt the families routes each to its expert. What is
real: the encoder reading the transcripts, the head, the episode loop and its reward shaping, the optimisers,
the graders. What is scripted: only the pool's replies, which are instant (no LLM is called).

`measure_learnability` trains each optimiser at the same episode budget and scores the saved vector (argmax
policy, as evaluated) on held-out tasks of the same families after every generation (bench/learnability.py).
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from trinity.config import PROJECT_ROOT, EvolveSettings
from trinity.machine import commit, cpu_kind
from trinity.records import ChatResponse, Task

FAMILIES = ("arithmetic", "choice", "code")
EXPERTS = {"arithmetic": "arith-expert", "choice": "choice-expert", "code": "code-expert"}
MEMBERS = ("arith-expert", "choice-expert", "code-expert", "mute")

_OPS = (("+", "plus", lambda a, b: a + b), ("-", "minus", lambda a, b: a - b), ("*", "times", lambda a, b: a * b))
_CHOICE_KINDS = (("largest", max), ("smallest", min))
_CODE_KINDS = (("multiplied by", lambda x, k: x * k, "x * {k}"), ("plus", lambda x, k: x + k, "x + {k}"))


def make_tasks(n_per_family: int, seed: int, split: str, exclude: Sequence[Task] = ()) -> list[Task]:
    """`n_per_family` tasks of each family, drawn by a generator fixed by (seed, split), no query twice and none
    of `exclude`'s (the held-out split is drawn excluding the training split)."""
    rng = np.random.default_rng([seed, int.from_bytes(split.encode()[:4].ljust(4, b"\0"), "little")])
    seen = {t.query for t in exclude}
    by_family: dict[str, list[Task]] = {f: [] for f in FAMILIES}

    def add(family: str, task: Task) -> None:
        if task.query not in seen and len(by_family[family]) < n_per_family:
            seen.add(task.query)
            by_family[family].append(task)

    while min(len(v) for v in by_family.values()) < n_per_family:
        i = len(by_family["arithmetic"])
        a, b = int(rng.integers(11, 99)), int(rng.integers(11, 99))
        sym, word, fn = _OPS[int(rng.integers(len(_OPS)))]
        q = (f"Compute {a} {sym} {b}." if rng.random() < 0.5 else f"What is {a} {word} {b}?")
        add("arithmetic", Task(id=f"known/{split}/arithmetic/{i}", source="known_arithmetic", prompt=(q,),
                               grader="math", answer=str(fn(a, b)), metadata={"family": "arithmetic"}))
        i = len(by_family["choice"])
        nums = [int(x) for x in rng.choice(np.arange(2, 200), size=4, replace=False)]
        kind, pick = _CHOICE_KINDS[int(rng.integers(len(_CHOICE_KINDS)))]
        letters = "ABCD"
        q = f"Which of the following numbers is the {kind}?\n" + "\n".join(
            f"{letters[j]}) {n}" for j, n in enumerate(nums))
        add("choice", Task(id=f"known/{split}/choice/{i}", source="known_choice", prompt=(q,), grader="choice",
                           answer=letters[nums.index(pick(nums))],
                           metadata={"family": "choice", "choices": [str(n) for n in nums]}))
        i = len(by_family["code"])
        k = int(rng.integers(2, 20))
        name = f"{['scale', 'shift', 'adjust', 'transform'][int(rng.integers(4))]}_{int(rng.integers(100))}"
        desc, fn, expr = _CODE_KINDS[int(rng.integers(len(_CODE_KINDS)))]
        q = f"Write a Python function {name}(x) that returns x {desc} {k}."
        tests = "\n".join(f"assert {name}({x}) == {fn(x, k)}" for x in (3, -2, 10))
        add("code", Task(id=f"known/{split}/code/{i}", source="known_code", prompt=(q,), grader="code", tests=tests,
                         metadata={"family": "code", "test_format": "assert", "entry_point": name,
                                   "expr": expr.format(k=k)}))
    return [t for group in zip(*by_family.values()) for t in group]


def correct_answer(task: Task) -> str:
    """The expert's reply: correct, in the format the family's grader reads."""
    fam = task.metadata["family"]
    if fam == "arithmetic":
        return f"Working it out: the result is {task.answer}. \\boxed{{{task.answer}}}"
    if fam == "choice":
        return f"Comparing the options carefully.\nAnswer: {task.answer}"
    name = task.metadata["entry_point"]
    return f"```python\ndef {name}(x):\n    return {task.metadata['expr']}\n```"


def wrong_answer(task: Task, member: str) -> str:
    """A non-expert's reply: the right format, a wrong answer (different per member)."""
    off = 1 + MEMBERS.index(member) % 3  # 1..3: never the right option of four
    fam = task.metadata["family"]
    if fam == "arithmetic":
        wrong = int(task.answer) + off
        return f"Working it out: the result is {wrong}. \\boxed{{{wrong}}}"
    if fam == "choice":
        letters = "ABCD"
        wrong = letters[(letters.index(task.answer) + off) % 4]
        return f"Comparing the options carefully.\nAnswer: {wrong}"
    name = task.metadata["entry_point"]
    return f"```python\ndef {name}(x):\n    return x - {off}\n```"


MUTE_REPLY = "I am not sure."
THINKER_REPLY = ("<suggestion>Solve the question directly and state the final answer in the required format."
                 "</suggestion>\n<suggested_role>worker</suggested_role>")


def _unit(*parts: str) -> float:
    h = hashlib.sha256("|".join(parts).encode()).digest()
    return int.from_bytes(h[:8], "little") / 2**64


class KnownAnswerModel:
    """A scripted pool member (the `ChatModel` protocol): its reply is a function of the task, the role asked
    and, for a Verifier, the proposed answer. It recognises the task by its query inside the prompt."""

    def __init__(self, name: str, tasks: Sequence[Task], accept_correct: float = 0.9, accept_wrong: float = 0.2):
        if name not in MEMBERS:
            raise ValueError(f"unknown scripted member {name!r}; expected one of {MEMBERS}")
        self.name, self.model_id = name, f"known-answer:{name}"
        self.accept_correct, self.accept_wrong = accept_correct, accept_wrong
        self._tasks = {t.query: t for t in tasks}
        self.calls = 0

    def _task(self, text: str) -> Task:
        for q, t in self._tasks.items():
            if q in text:
                return t
        raise KeyError(f"{self.name}: no known task in the prompt {text[:120]!r}")

    def reply(self, task: Task, role: str, proposed: str | None = None) -> str:
        if self.name == "mute":
            return MUTE_REPLY
        if role == "thinker":
            return THINKER_REPLY
        if role == "verifier":
            right = proposed is not None and proposed.strip() == correct_answer(task)
            p = self.accept_correct if right else self.accept_wrong
            return ("The answer is right.\nVerdict: ACCEPT" if _unit(self.name, task.id, proposed or "") < p
                    else "The answer is wrong.\nVerdict: REJECT")
        return correct_answer(task) if EXPERTS[task.metadata["family"]] == self.name else wrong_answer(task, self.name)

    async def chat(self, messages, sampling) -> ChatResponse:
        self.calls += 1
        text = messages[-1].content
        task = self._task(text)
        if "ACCEPT or REJECT" in text:
            proposed = text.split("Proposed answer:\n", 1)[1].rsplit("\n\nIs the proposed answer correct?", 1)[0]
            out = self.reply(task, "verifier", proposed)
        elif "<suggestion>" in text:
            out = self.reply(task, "thinker")
        else:
            out = self.reply(task, "worker")
        return ChatResponse(text=out, model=self.model_id, prompt_tokens=sum(len(m.content) for m in messages) // 4,
                            completion_tokens=len(out) // 4)


def make_pool(tasks: Sequence[Task], accept_correct: float = 0.9, accept_wrong: float = 0.2):
    """The scripted pool as a real `Pool` (no store: replies are instant; the rollout trees memoise them)."""
    from trinity.config import PoolMember
    from trinity.pool.runtime import Pool

    models = [KnownAnswerModel(n, tasks, accept_correct, accept_wrong) for n in MEMBERS]
    return Pool(models, [PoolMember(name=n, backend="local", model=f"known-answer-{n}") for n in MEMBERS], None)


def oracle_accuracy(tasks: Sequence[Task], grade) -> float:
    """The oracle router: for each task, the member whose answer is best (known by construction), as Worker."""
    return float(np.mean([max(grade(t, correct_answer(t)), *(grade(t, wrong_answer(t, m)) for m in MEMBERS[:3]))
                          for t in tasks]))


def single_member_accuracy(tasks: Sequence[Task], grade) -> dict[str, float]:
    """Each member alone, as Worker for one turn (the evaluation's `alone:<member>`)."""
    out = {}
    for m in MEMBERS:
        model = KnownAnswerModel(m, tasks)
        out[m] = float(np.mean([grade(t, model.reply(t, "worker")) for t in tasks]))  # (mute: MUTE_REPLY)
    return out


@dataclass
class PolicyScore:
    accuracy: float
    mean_turns: float
    model_usage: dict[str, int] = field(default_factory=dict)
    role_usage: dict[str, int] = field(default_factory=dict)


def score_policy(W: np.ndarray, tasks: Sequence[Task], pool, states, settings, grade, trees, *,
                 samples: int = 0, seed: int = 0) -> PolicyScore:
    """Accuracy of head W on `tasks`: argmax (samples=0, the policy the product evaluates) or the sampled policy
    averaged over `samples` seeded episodes per task."""
    import asyncio

    from trinity.coordinator.episode import Episode, episode_rng, play_episodes

    if samples:
        eps = [Episode(task=t, candidate=0, rng=episode_rng(seed, "known-answer-eval", k, t.id))
               for t in tasks for k in range(samples)]
    else:
        eps = [Episode(task=t, candidate=0, rng=None) for t in tasks]
    asyncio.run(play_episodes(eps, [W], pool, states, settings.coordinator.max_turns, settings.reward, grade,
                              trees=trees, answer_rule=settings.coordinator.answer_rule))
    models: dict[str, int] = dict.fromkeys(pool.names, 0)
    roles: dict[str, int] = {}
    for e in eps:
        for m, r in e.picks:
            models[pool.names[m]] += 1
            roles[r.value] = roles.get(r.value, 0) + 1
    return PolicyScore(float(np.mean([e.correct for e in eps])), float(np.mean([len(e.turns) for e in eps])),
                       models, roles)


def known_answer_settings(base, coordinator: dict | None = None, **evolve_overrides):
    """`base` (the project's params: encoder, reward shaping, σ0, max_turns) with the scripted pool as its pool,
    the given coordinator.* overrides (e.g. feature_norm) and evolve.* overrides (generations, popsize,
    episodes_per_candidate, method, warm_start: "none" unless given, as it needs validation items)."""
    from trinity.config import Settings

    dump = base.model_dump(exclude={"source_path"})
    dump["pool"]["members"] = [{"name": n, "backend": "local", "model": f"known-answer-{n}"} for n in MEMBERS]
    dump["evaluate"]["judge"] = MEMBERS[0]
    dump["data"]["in_distribution"], dump["data"]["heldout"] = {}, {}
    dump["coordinator"].update(coordinator or {})
    dump["evolve"].update({"warm_start": "none", **evolve_overrides})  # a warm start needs validation items
    return Settings.model_validate(dump)


def train_method(settings, train: Sequence[Task], test: Sequence[Task], pool, states, grade, trees, workdir: Path,
                 on_generation: Callable[[dict], None] | None = None, validation: Sequence[Task] = ()) -> dict:
    """Train with settings.evolve.method for settings.evolve.generations generations, one generation at a time
    through `evolve`'s exact resume (a finished run extended by one generation: the same run as an
    uninterrupted one), scoring the saved vector (argmax) on `test` after each. `validation`: the items the saved
    vector is selected on (and the warm start's best member found on). Returns the curve."""
    from trinity.evolve.loop import evolve

    total = settings.evolve.generations
    resume = workdir / f"{settings.evolve.method}-{settings.evolve.warm_start}.pkl"
    curve = []
    t0 = time.perf_counter()
    for g in range(1, total + 1):
        s = known_answer_settings(settings, generations=g)
        res = evolve(s, train, pool, states, grade, resume_path=resume, trees=trees, validation=validation)
        rec = res.history[-1]
        _, W = res.layout.split(res.params)  # (the layout of what the head reads: evolve set states.features)
        sc = score_policy(W, test, pool, states, settings, grade, trees)
        point = {"generation": g, "episodes": sum(r.episodes for r in res.history),
                 "mean_fitness": round(rec.mean_fitness, 4), "saved_fitness": round(rec.saved_fitness, 4),
                 "train_accuracy_saved": round(rec.saved_accuracy, 4), "heldout_accuracy": round(sc.accuracy, 4),
                 "validation_selected": rec.validation_selected,
                 "heldout_turns": round(sc.mean_turns, 2), "wall_s": round(time.perf_counter() - t0, 1)}
        curve.append(point)
        if on_generation is not None:
            on_generation({**point, "method": settings.evolve.method, "model_usage": sc.model_usage,
                           "role_usage": sc.role_usage})
    return {"curve": curve, "params": res.params, "final": sc}


PAPER_SIGMA0 = EvolveSettings.model_fields["sigma0"].default
"""The paper's σ0 (the settings' default; params.yaml sets its own for `make run`'s small population)."""


def measure_learnability(generations: int, tasks_per_generation: int, n_train: int, n_heldout: int, methods: list[str],
        popsize: int | None = None, params: Path = PROJECT_ROOT / "params.yaml", encoder=None, seed: int = 0,
        feature_norm: str | None = None, max_turns: int | None = None, sigma0: float | None = None,
        n_validation: int = 0, warm_starts: Sequence[str] = ("none",),
        log=lambda s: print(s, file=sys.stderr, flush=True)) -> dict:
    """Train each of `methods` on the known-answer problem at the same budget and score the vector it would save on
    held-out tasks after every generation (`python -m bench.learnability` prints it;
    tests/integration/test_learnability.py runs it small). The result is the bench's JSON object: the figure, what it is compared against, the curves."""
    from trinity.config import load_settings
    from trinity.coordinator.episode import RolloutTrees, StateCache
    from trinity.evolve.loop import param_layout
    from trinity.evolve.optimizer import default_popsize
    from trinity.grading import grade
    from trinity.coordinator.policy import make_encoder

    t_start = time.perf_counter()
    project = load_settings(params)
    coordinator = {"feature_norm": feature_norm} if feature_norm else {}
    if max_turns:
        coordinator["max_turns"] = max_turns
    # the optimiser's shape is the paper's unless asked (not params.yaml's, which is sized for `make run`)
    base = known_answer_settings(project, coordinator, generations=generations, seed=seed,
                                    episodes_per_candidate=tasks_per_generation, popsize=popsize,
                                    sigma0=sigma0 if sigma0 is not None else PAPER_SIGMA0)
    train = make_tasks(n_train, seed, "train")
    heldout = make_tasks(n_heldout, seed, "heldout", exclude=train)
    validation = make_tasks(n_validation, seed, "validation", exclude=train + heldout) if n_validation else []
    assert not {t.query for t in train} & {t.query for t in heldout}, "held-out queries drawn into training"
    pool = make_pool(train + heldout + validation)
    encoder = encoder if encoder is not None else make_encoder(base)
    states = StateCache(encoder, store=None)
    trees = RolloutTrees()  # shared by every method: same replies, same transcripts (states encoded once)
    layout = param_layout(base, len(pool), states)
    popsize = base.evolve.popsize or default_popsize(layout.n_params)

    oracle = oracle_accuracy(heldout, grade)
    single = single_member_accuracy(heldout, grade)
    zero = np.zeros((len(pool) + 3, states.dim))  # (uniform whatever the features)
    rand = score_policy(zero, heldout, pool, states, base, grade, trees, samples=8, seed=seed)
    log(f"[learnability] oracle {oracle:.3f} · best single {max(single.values()):.3f} · random routing "
        f"{rand.accuracy:.3f} · {len(train)} train / {len(heldout)} held-out tasks · popsize {popsize} · "
        f"{tasks_per_generation} tasks/gen · {generations} generations · encoder {getattr(encoder, 'encoder_id', '?')}")

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method, start in [(m, w) for m in methods for w in warm_starts]:
            s = known_answer_settings(base, method=method, warm_start=start)
            name = method if list(warm_starts) == ["none"] else f"{method} (start: {start})"
            states.features = None  # each method fits its own (identical) map from the training tasks

            def progress(p, _m=name):
                log(f"[learnability:{_m}] gen {p['generation']}/{generations} · mean fitness {p['mean_fitness']:.3f}"
                    f" · saved {p['saved_fitness']:.3f} · held-out acc {p['heldout_accuracy']:.3f} "
                    f"({p['heldout_turns']:.2f} turns) · models {p['model_usage']} · roles {p['role_usage']} · "
                    f"{p['wall_s']:.0f}s · states encoded {states.encoded}")

            out = train_method(s, train, heldout, pool, states, grade, trees, Path(tmp), on_generation=progress,
                                  validation=validation)
            curve = out["curve"]
            reach = next((p["generation"] for p in curve if p["heldout_accuracy"] >= 0.9 * oracle), None)
            final = out["final"]
            results[name] = {
                "heldout_accuracy": final.accuracy, "fraction_of_oracle": round(final.accuracy / oracle, 4),
                "generations_to_90pct": reach, "heldout_turns": final.mean_turns, "model_usage": final.model_usage,
                "role_usage": final.role_usage, "curve": curve}
    first = next(iter(results))
    return {
        "name": "learnability", "figure": results[first]["fraction_of_oracle"],
        "unit": f"held-out accuracy of the trained coordinator ({first}, argmax) / the oracle router's",
        "goal": ">= 0.9",
        "compared_to": "the oracle router (each task to its family's expert), every single member alone, random "
                       "routing (zero head, sampled, 8 episodes per task) and the other optimisers at the same episode "
                       "budget, same run",
        "detail": {
            "oracle_accuracy": oracle, "single_member_accuracy": single,
            "best_single_fraction_of_oracle": round(max(single.values()) / oracle, 4),
            "random_routing_accuracy": rand.accuracy,
            "random_routing_fraction_of_oracle": round(rand.accuracy / oracle, 4),
            "methods": results,
            "budget": {"generations": generations, "popsize": popsize, "tasks_per_generation": tasks_per_generation,
                       "episodes_per_method": generations * popsize * min(tasks_per_generation, len(train))},
            "tasks": {"train": len(train), "heldout": len(heldout), "validation": len(validation),
                      "families": list(FAMILIES)},
            "warm_starts": list(warm_starts),
            "settings": {"sigma0": base.evolve.sigma0, "reinforce_lr": base.evolve.reinforce_lr,
                         "max_turns": base.coordinator.max_turns, "reward": base.reward.model_dump(),
                         "feature_norm": base.coordinator.feature_norm,
                         "encoder": getattr(encoder, "encoder_id", "?")},
            "pool_calls": pool.stats.calls_made, "states_encoded": states.encoded,
            "wall_s": round(time.perf_counter() - t_start, 1), "commit": commit(), "cpu": cpu_kind()},
    }
