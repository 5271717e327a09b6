"""The training loop over memoised rollout trees: ask the optimiser for candidates, play their episodes, tell it
their fitness. The optimiser is sep-CMA-ES, the paper's (`trinity.evolve.sep_cma`), or a baseline of its ablation
(REINFORCE, random search), behind one interface (`trinity.evolve.optimizer.Optimizer`), so every method plays the same episodes budget
(generations x popsize x episodes_per_candidate) on the same tasks (`minibatch`), with the same seeds.

The loop is explicit, checkpointable state: after every generation the run's `RunState` (the pickled
optimiser, the generation index and the history) is written atomically, so a killed run restarts where it
stopped and, because every random draw is fixed by (seed, generation, candidate, task) or by the optimiser's
pickled state, ends with the same parameters as an uninterrupted one. pycma would sample from numpy's *global*
RNG; `SepCMA` gives it a RandomState of its own, pickled with it, and leaves the global RNG as it found it (the
baselines use their own generators). The hidden states the policy reads are cache-independent too (the
encoder's chunking), so a resumed process with cold caches replays the same picks.

The flat parameter vector is the `ParamLayout`: the head alone, or [δ…, head…] when
`coordinator.svf_layer` is set (each candidate's δ then changes its hidden states: its transcripts are
encoded with its own adapter).

An outage is not a sample (docs/reproducibility.md, "An outage is not a sample"): episodes are played with `stop_on_outage` (an
episode ends at its first transiently failed call, with no reward), and a generation replays its outage episodes
up to `OUTAGE_REPLAYS` times (same seeds, same picks: the stored calls cost nothing, only the failed calls are asked
again). A candidate's fitness is then the mean over its episodes not hit by an outage; the outage episodes left
are counted (`GenerationRecord.outage_episodes`) and kept out of the optimiser's update and the store's episodes
table. When a candidate has no episode left to be ranked on (pycma needs a value for every candidate, and none
would be honest), the run stops with an `OutageError` before telling the optimiser or checkpointing anything of
that generation: a rerun resumes at it and asks only the failed calls again. The saved vector's score follows the
same rule.
"""
from __future__ import annotations

import asyncio
import pickle
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from trinity.config import Settings
from trinity.coordinator.features import fit_feature_map
from trinity.coordinator.episode import (Episode, OutageError, RolloutTrees, StateCache, entropy_of_counts,
                                        episode_rng, play_episodes)
from trinity.coordinator.head import HeadShape, ParamLayout
from trinity.coordinator.role_sampling import RoleSampling
from trinity.coordinator.roles import ROLES, allowed_roles
from trinity.coordinator.rollout import is_outage
from trinity.evolve.optimizer import METHODS, Optimizer, default_popsize
from trinity.evolve.random_search import RandomSearch
from trinity.evolve.records import EvolutionResult, GenerationRecord
from trinity.evolve.reinforce import Reinforce
from trinity.evolve.sep_cma import SepCMA
from trinity.records import Task

def minibatch(tasks: Sequence[Task], n: int, seed: int, generation: int) -> list[Task]:
    """Tasks for one generation, drawn without replacement by a generator fixed by (seed, generation): a fresh draw
    each generation, balanced across the training benchmarks (each gets n // k, the first n % k of a seeded order one
    more; a benchmark with fewer items gives all it has and the rest go to the others)."""
    rng = np.random.default_rng([seed, 7919, generation])
    by_source: dict[str, list[int]] = {}
    for i, t in enumerate(tasks):
        by_source.setdefault(t.source, []).append(i)
    queues = {s: [ix[j] for j in rng.permutation(len(ix))] for s, ix in sorted(by_source.items())}
    order = [sorted(queues)[j] for j in rng.permutation(len(queues))]
    chosen: list[int] = []
    while len(chosen) < min(n, len(tasks)):
        for s in order:  # round robin over the benchmarks, in a seeded order
            if queues[s] and len(chosen) < n:
                chosen.append(queues[s].pop(0))
    return [tasks[i] for i in sorted(chosen)]


def param_layout(settings: Settings, n_models: int, states: StateCache) -> ParamLayout:
    """The flat vector's layout for this pool and encoder (SVF scales first when coordinator.svf_layer is set)."""
    n_svf = 0
    if settings.coordinator.svf_layer is not None:
        n_svf = int(getattr(states.encoder, "svf_num_params", 0))
        if not n_svf:
            raise ValueError("coordinator.svf_layer is set but the encoder has no SVF scales: build it with "
                             "svf_layer (stages.make_encoder does)")
    return ParamLayout(HeadShape(n_models=n_models, dim=states.dim), n_svf)


def make_optimizer(settings: Settings, layout: ParamLayout, x0: np.ndarray | None = None) -> Optimizer:
    """The optimiser of `evolve.method`, started at `x0` (None: the zero vector, uniform picks)."""
    ev = settings.evolve
    popsize = ev.popsize or default_popsize(layout.n_params)
    if ev.method == "sep_cma":
        return SepCMA(layout.n_params, ev.sigma0, popsize, ev.seed, x0=x0)
    if ev.method == "reinforce":
        return Reinforce(layout, popsize, lr=ev.reinforce_lr, x0=x0)
    if ev.method == "random_search":
        return RandomSearch(layout.n_params, popsize, sigma=ev.sigma0, seed=ev.seed, x0=x0)
    raise ValueError(f"unknown evolve.method {ev.method!r}; expected one of {METHODS}")


@dataclass(frozen=True, eq=False)
class RunState:
    """Everything a run needs to carry on where it stopped, pickled whole after every generation (`resume_path`):
    a killed run reloads it and ends with the parameters of an uninterrupted one. A record, never changed in place:
    each generation makes the next one with `dataclasses.replace`. The optimiser is its one mutable part (pycma's
    state, with both random streams: `SepCMA`), advanced by `ask` / `tell`."""

    fingerprint: str
    """The run's identity (`run_fingerprint`): the state of another run is never resumed."""
    optimizer: Optimizer
    generation: int = 0
    """Generations played, told to the optimiser and recorded."""
    history: tuple[GenerationRecord, ...] = ()
    best_fitness: float = -np.inf
    """The best sampled candidate so far, by its (noisy) minibatch fitness: kept for inspection."""
    best_params: np.ndarray | None = None
    selected_params: np.ndarray | None = None
    """With a validation slice: the best vector there so far (the start, then each generation's mean and best
    candidate; a tie keeps the earlier) — what the run saves."""
    selected_validation: float = -np.inf
    selected_from: str = ""
    """Where the selected vector came from: "start", "generation g mean" or "generation g best candidate"."""
    start_validation: float | None = None


def load_run_state(path: Path) -> RunState | None:
    """The run state pickled at `path`, or None when there is none. A state pickled as a dict (the format before
    `RunState`: the same fields, with "best" a (fitness, params) pair) is read as the same record."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        state = _MovedClasses(f).load()
    if isinstance(state, dict) and {"optimizer", "generation", "history", "best"} <= state.keys():
        state = RunState(fingerprint=state.get("fingerprint"), optimizer=state["optimizer"],
                         generation=state["generation"], history=tuple(state["history"]),
                         best_fitness=state["best"][0], best_params=state["best"][1])
    return state if isinstance(state, RunState) else None


_MOVED = {("trinity.evolve.sep_cma", "RunState"): "trinity.evolve.loop",
          ("trinity.evolve.sep_cma", "GenerationRecord"): "trinity.evolve.records",
          ("trinity.evolve.baselines", "Reinforce"): "trinity.evolve.reinforce",
          ("trinity.evolve.baselines", "RandomSearch"): "trinity.evolve.random_search"}
"""Where the classes a run state pickles lived before the loop and the optimisers had a file each: a state pickled
then resumes here."""


class _MovedClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        return super().find_class(_MOVED.get((module, name), module), name)


def _atomic_pickle(obj, path: Path) -> None:
    from trinity.files import atomic_open

    with atomic_open(path, "wb", fsync=True) as f:
        pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)


def evolve(settings: Settings, train: Sequence[Task], pool, states: StateCache, grade: Callable[[Task, str], float],
           resume_path: Path | None = None, on_generation: Callable[[GenerationRecord], None] | None = None,
           run_id: str = "evolve", store=None, trees: RolloutTrees | None = None,
           validation: Sequence[Task] = ()) -> EvolutionResult:
    """Train the coordinator with `settings.evolve.method` (see module doc). `trees`: the memoised rollout
    trees to walk (kept across calls to share them, e.g. between the methods of an ablation). `validation`: the
    items the saved vector is selected on (`trinity.evolve.validation`; empty: the last mean is saved)."""
    from trinity.evolve import validation as val
    ev = settings.evolve
    # What the head reads: raw states (the paper) or standardised by these training tasks' root states. Set on
    # `states`, so every episode below (and the caller's later use of `states`) reads the same features.
    states.features = fit_feature_map(settings.coordinator.feature_norm, states, train)
    layout = param_layout(settings, len(pool), states)
    n = layout.n_params
    trees = RolloutTrees() if trees is None else trees
    fingerprint = run_fingerprint(settings, layout, train, getattr(states.encoder, "base_id", None),
                                  validation=validation)
    validation = list(validation)
    members = val.score_members(validation, pool, grade, trees, RoleSampling.of(settings)) if validation else {}
    x0 = None
    if ev.warm_start == "best_member":
        if not validation:
            raise ValueError("evolve.warm_start: best_member starts from the best member on validation, and "
                             "data.validation is empty: name some validation items (e.g. data.validation.math500: 10)")
        x0 = val.warm_start_head(layout, pool.names.index(val.best_member(members)), states, train)
    scoring = saved_fitness_episodes(settings, train)
    state = load_run_state(resume_path) if resume_path is not None else None
    if state is not None and (state.fingerprint != fingerprint or state.generation > ev.generations):
        state = None  # a different run, or one already past the asked length: start over
    if state is not None:
        state.optimizer.resume()  # same run, possibly asked for more generations: carry on
    else:
        state = RunState(fingerprint=fingerprint, optimizer=make_optimizer(settings, layout, x0),
                         best_params=np.zeros(n))
    opt: Optimizer = state.optimizer

    def on_validation(params: np.ndarray, what: str):
        s = val.score_policy(params, layout, validation, settings, pool, states, grade, trees)
        if np.isnan(s.accuracy):
            raise OutageError(f"scoring {what} on validation: every one of its {len(validation)} items hit an outage. "
                              "Nothing of this generation is checkpointed; a rerun asks only the failed calls again")
        return s

    if validation and state.selected_params is None:  # the starting point is a candidate for saving too
        s0 = on_validation(opt.params, "the start")
        state = replace(state, selected_params=opt.params, selected_validation=s0.accuracy, selected_from="start",
                        start_validation=s0.accuracy)
    resumed_from = state.generation
    if resumed_from:
        print(f"[evolve:{opt.method}] resuming run {fingerprint[:12]} at generation {resumed_from} of {ev.generations}",
              flush=True)
    while state.generation < ev.generations:
        g = state.generation
        t0 = time.perf_counter()
        calls0, hits0, enc0, cost0 = pool.stats.calls_made, pool.stats.store_hits, states.encoded, pool.stats.cost_usd
        X = opt.ask()
        tasks = minibatch(train, ev.episodes_per_candidate, ev.seed, g)
        split = [layout.split(x) for x in X]
        heads = [W for _, W in split]
        adapters = [d for d, _ in split] if layout.n_svf else None
        specs = [(t, c, (ev.seed, g, c, t.id)) for c in range(len(X)) for t in tasks]
        episodes, replayed = play_replaying_outages(specs, heads, pool, states, settings, grade, adapters=adapters,
                                                    trees=trees, keep_features=opt.needs_features)
        fitness = candidate_fitness(episodes, len(X))
        unranked = [c for c in range(len(X)) if np.isnan(fitness[c])]
        if unranked:
            raise OutageError(
                f"evolve generation {g}: {_outage_summary(episodes)} even after {OUTAGE_REPLAYS} replays, leaving "
                f"candidate(s) {unranked} of {len(X)} with no episode to be ranked on. Nothing of generation {g} is "
                "told to the optimiser or checkpointed; every reply received is in the store, so a rerun (the stage "
                f"task retries) resumes at generation {g} and asks only the failed calls again")
        clean = [e for e in episodes if not e.outage]
        opt.tell(X, fitness, clean)
        if store is not None:
            store.put_episodes({"run_id": run_id, "generation": g, "candidate": e.candidate, "task_id": e.task.id,
                                "path": e.path_json, "reward": e.reward, "correct": e.correct, "cost_usd": e.cost_usd}
                               for e in clean)
        b = int(np.argmax(fitness))
        best = {}
        if fitness[b] > state.best_fitness:
            best = {"best_fitness": float(fitness[b]), "best_params": np.array(X[b])}
        saved = score_params(opt.params, layout, scoring, settings, pool, states, grade, trees)
        v_mean = v_best = None
        if validation:
            v_mean = on_validation(opt.params, f"generation {g}'s mean")
            v_best = on_validation(np.asarray(X[b], dtype=np.float64), f"generation {g}'s best candidate")
            for what, vec, s in (("mean", opt.params, v_mean), ("best candidate", X[b], v_best)):
                if s.accuracy > best.get("selected_validation", state.selected_validation):
                    best |= {"selected_params": np.array(vec, dtype=np.float64), "selected_validation": s.accuracy,
                             "selected_from": f"generation {g} {what}"}
        names = pool.names
        models = dict.fromkeys(names, 0)
        roles = dict.fromkeys((r.value for r in ROLES), 0)
        picks = []
        for e in episodes:
            picks += e.picks
        for (m, r), k in Counter(picks).items():
            models[names[m]] += k
            roles[r.value] += k
        calls = pool.stats.calls_made - calls0
        rec = GenerationRecord(
            generation=g, best_candidate_fitness=float(fitness.max()), mean_fitness=float(fitness.mean()),
            sigma=opt.sigma, calls_made=calls, store_hits=pool.stats.store_hits - hits0,
            states_encoded=states.encoded - enc0, cost_usd=pool.stats.cost_usd - cost0, model_usage=models,
            role_usage=roles, mean_accuracy=float(np.mean([e.correct for e in clean])),
            wall_s=time.perf_counter() - t0, method=opt.method, episodes=len(episodes),
            calls_per_episode=calls / len(episodes), model_entropy=entropy_of_counts(list(models.values())),
            saved_fitness=saved[0], saved_accuracy=saved[1], outage_episodes=len(episodes) - len(clean),
            outage_replays=replayed, saved_outage_episodes=saved[2],
            validation_mean=None if v_mean is None else v_mean.accuracy,
            validation_best_candidate=None if v_best is None else v_best.accuracy,
            validation_selected=best.get("selected_validation", state.selected_validation) if validation else None,
            validation_no_answer=None if v_mean is None else v_mean.no_answer,
            validation_best_member=members[val.best_member(members)].accuracy if validation else None)
        state = replace(state, generation=g + 1, history=state.history + (rec,), **best)
        if resume_path is not None:
            _atomic_pickle(state, resume_path)
        if on_generation is not None:
            on_generation(rec)
    history = list(state.history)
    selection = None
    if validation:
        top = val.best_member(members)
        selection = {"items": len(validation), "start": state.start_validation, "warm_start": ev.warm_start,
                     "selected": state.selected_validation, "selected_from": state.selected_from,
                     "members": {k: v.accuracy for k, v in members.items()},
                     "members_no_answer": {k: v.no_answer for k, v in members.items()},
                     "best_member": top, "best_member_score": members[top].accuracy,
                     "beats_best_member": bool(state.selected_validation > members[top].accuracy)}
    return EvolutionResult(params=opt.params if state.selected_params is None else state.selected_params,
                           saved_fitness=history[-1].saved_fitness if history else None,
                           best_candidate_params=state.best_params, best_candidate_fitness=state.best_fitness,
                           history=history, layout=layout, resumed_from=resumed_from, fingerprint=fingerprint,
                           features=states.features, selection=selection)


OUTAGE_REPLAYS = 2
"""How many times a generation replays its episodes hit by an outage before leaving them out. A replay is a fresh
episode with the same seed: the same picks, its stored calls cost nothing, only the failed call is asked again; so
a brief outage leaves the generation exactly as an uninterrupted run plays it."""


def play_replaying_outages(specs: Sequence[tuple[Task, int, tuple]], heads, pool, states: StateCache,
                           settings: Settings, grade, *, adapters=None, trees: RolloutTrees | None = None,
                           keep_features: bool = False) -> tuple[list[Episode], int]:
    """One sampled episode per spec (task, candidate, seed parts of its stream), each ended at its first outage;
    the outage episodes are replayed up to OUTAGE_REPLAYS times, a replay taking its slot. Returns the episodes (in
    spec order; some may still be `outage`) and how many replays were played."""
    c = settings.coordinator

    def play(ix: Sequence[int]) -> list[Episode]:
        eps = [Episode(task=specs[i][0], candidate=specs[i][1], rng=episode_rng(*specs[i][2])) for i in ix]
        asyncio.run(play_episodes(eps, heads, pool, states, c.max_turns, settings.reward, grade, adapters=adapters,
                                  trees=trees, keep_features=keep_features, stop_on_outage=True,
                                  roles=allowed_roles(c), answer_rule=c.answer_rule,
                                  role_sampling=RoleSampling.of(settings)))
        return eps

    episodes = play(range(len(specs)))
    replayed = 0
    for _ in range(OUTAGE_REPLAYS):
        out = [i for i, e in enumerate(episodes) if e.outage]
        if not out:
            break
        for i, e in zip(out, play(out)):
            episodes[i] = e
        replayed += len(out)
    return episodes, replayed


def candidate_fitness(episodes: Sequence[Episode], n_candidates: int) -> np.ndarray:
    """Each candidate's fitness: the mean reward of its episodes not hit by an outage (NaN when none is left)."""
    total, count = np.zeros(n_candidates), np.zeros(n_candidates)
    for e in episodes:
        if not e.outage:
            total[e.candidate] += e.reward
            count[e.candidate] += 1
    return np.divide(total, count, out=np.full(n_candidates, np.nan), where=count > 0)


def _outage_summary(episodes: Sequence[Episode]) -> str:
    """'k of n episodes hit an outage (member: count, ...)': which members' calls failed."""
    out = [e for e in episodes if e.outage]
    by = Counter(next(t.model for t in e.turns if is_outage(t)) for e in out)
    members = ", ".join(f"{m}: {k}" for m, k in sorted(by.items()))
    return f"{len(out)} of {len(episodes)} episodes hit an outage (failed calls by member: {members})"


def saved_fitness_episodes(settings: Settings, train: Sequence[Task]) -> list[tuple[Task, int]]:
    """The fixed episodes on which every generation's saved vector is scored: `evolve.saved_fitness_tasks`
    training tasks (a seeded draw, the same every generation; null = all) x `saved_fitness_samples` seeded
    sampled episodes each. The same episodes for every generation make the curve comparable across them."""
    ev = settings.evolve
    n = len(train) if ev.saved_fitness_tasks is None else min(ev.saved_fitness_tasks, len(train))
    idx = sorted(np.random.default_rng([ev.seed, 104729]).permutation(len(train))[:n])
    return [(train[i], k) for i in idx for k in range(ev.saved_fitness_samples)]


def score_params(params: np.ndarray, layout: ParamLayout, scoring: Sequence[tuple[Task, int]], settings: Settings,
                 pool, states: StateCache, grade, trees: RolloutTrees) -> tuple[float, float, int]:
    """(mean shaped reward, mean correctness, outage episodes left out) of one parameter vector over the scoring
    episodes, played with the sampled policy that training optimises, each episode's stream fixed by (seed, task,
    sample). As in training, outage episodes are replayed (`OUTAGE_REPLAYS`), then left out of both means; when
    none is left, OutageError."""
    if not scoring:
        return 0.0, 0.0, 0
    delta, W = layout.split(params)
    specs = [(t, 0, (settings.evolve.seed, "saved-fitness", k, t.id)) for t, k in scoring]
    eps, _ = play_replaying_outages(specs, [W], pool, states, settings, grade,
                                    adapters=None if delta is None else [delta], trees=trees)
    clean = [e for e in eps if not e.outage]
    if not clean:
        raise OutageError(f"scoring the saved vector: {_outage_summary(eps)} even after {OUTAGE_REPLAYS} replays, "
                          "leaving nothing to score it on. Nothing of this generation is checkpointed; a rerun asks "
                          "only the failed calls again")
    return (float(np.mean([e.reward for e in clean])), float(np.mean([e.correct for e in clean])),
            len(eps) - len(clean))


_RUNTIME_ONLY = {"generations"}
"""evolve.* keys that change no generation already played: how many generations to play (generation g's tasks
and seeds depend on g only), so raising `generations` extends a finished run. Where calls run
(`config.EXECUTION_SETTINGS`, pool.*) is left out of the pool's part."""


RESUME_FORMAT = 4
"""Bumped when the pickled state changes meaning (2: optimisers carry their own RandomState; 3: records carry
the saved vector's fitness; 4: selection on validation)."""


def run_fingerprint(settings: Settings, layout: ParamLayout, train: Sequence[Task], encoder_id: str | None,
                    code: str | None = None, validation: Sequence[Task] = ()) -> str:
    """What makes a checkpoint this run's: settings, head shape, the training tasks' content, the encoder's
    exact features (model, dtype, feature config: the policy reads them), and the version of the code that
    shapes results (`trinity.code_version`: all the code the evolve and evaluate stages import) — a code
    change starts a new run unless declared a compatible refactor there. A local member's GGUF is named by its
    content (sha256), not by where it lies: a moved file is the same run, a replaced one a new run."""
    from trinity.code_version import code_version
    from trinity.config import EXECUTION_SETTINGS
    from trinity.pool.bundled import ModelAssemblyError, gguf_sha256
    from trinity.records import stable_hash

    dump = settings.model_dump(include={"evolve", "reward", "coordinator", "pool"},
                               exclude={"pool": set(EXECUTION_SETTINGS)})
    dump["evolve"] = {k: v for k, v in dump["evolve"].items() if k not in _RUNTIME_ONLY}
    for m in dump["pool"]["members"]:
        if m["backend"] == "local":
            try:  # bundled: its pinned hash; a user's file: hashed once, cached by (path, size, mtime)
                m["model"] = f"sha256:{gguf_sha256(m['model'])}"
            except (ModelAssemblyError, OSError):
                pass  # no such file: the pool cannot load it either, and says so
    return stable_hash({"settings": dump, "shape": [layout.head.n_models, layout.head.dim, layout.n_svf],
                        "train": [t.to_json() for t in train], "encoder": encoder_id, "format": RESUME_FORMAT,
                        "validation": [t.to_json() for t in validation],
                        "code": code_version() if code is None else code})
