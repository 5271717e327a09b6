"""sep-CMA-ES (pycma, diagonal covariance) over the flat head parameters.

The loop is explicit, checkpointable state: after every generation the pickled ES, the generation index
and the history are written atomically, so a killed run restarts where it stopped and, because every
random draw is fixed by (seed, generation, candidate, task), ends with the same parameters as an
uninterrupted one. pycma's `seed` reseeds numpy's *global* RNG; nothing else here touches it.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from trinity.config import Settings
from trinity.coordinator.episode import Episode, StateCache, episode_rng, play_episodes
from trinity.coordinator.head import HeadShape
from trinity.records import Task


def default_popsize(n_params: int) -> int:
    return 4 + int(math.floor(3 * math.log(n_params)))


def minibatch(tasks: Sequence[Task], n: int, seed: int, generation: int) -> list[Task]:
    """Tasks for one generation, drawn without replacement by a generator fixed by (seed, generation)."""
    rng = np.random.default_rng([seed, 7919, generation])
    idx = rng.permutation(len(tasks))[: min(n, len(tasks))]
    return [tasks[i] for i in sorted(idx)]


@dataclass
class GenerationRecord:
    generation: int
    best_fitness: float
    mean_fitness: float
    sigma: float
    calls_made: int
    store_hits: int
    states_encoded: int
    cost_usd: float
    model_usage: dict[str, int]
    role_usage: dict[str, int]
    mean_accuracy: float
    wall_s: float


@dataclass
class EvolutionResult:
    params: np.ndarray  # the distribution mean after the last generation (robust to minibatch noise)
    best_params: np.ndarray
    best_fitness: float
    history: list[GenerationRecord] = field(default_factory=list)


def _atomic_pickle(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def evolve(settings: Settings, train: Sequence[Task], pool, states: StateCache, grade: Callable[[Task, str], float],
           resume_path: Path | None = None, on_generation: Callable[[GenerationRecord], None] | None = None,
           run_id: str = "evolve", store=None) -> EvolutionResult:
    import cma

    ev = settings.evolve
    shape = HeadShape(n_models=len(pool), dim=states.dim)
    n = shape.n_params
    popsize = ev.popsize or default_popsize(n)
    state = None
    if resume_path is not None and resume_path.exists():
        with open(resume_path, "rb") as f:
            state = pickle.load(f)
        if state.get("fingerprint") != _fingerprint(settings, shape, train):
            state = None  # different run: start over (the old state stays out of the way)
    if state is None:
        # pycma treats seed 0 as "random": offset so every evolve.seed is reproducible
        es = cma.CMAEvolutionStrategy(np.zeros(n), ev.sigma0, {
            "CMA_diagonal": True, "seed": ev.seed + 1, "popsize": popsize, "verbose": -9,
            "tolx": 0, "tolfun": 0, "tolflatfitness": 10**9, "tolstagnation": 10**9, "maxiter": 10**9})
        state = {"es": es, "generation": 0, "history": [], "best": (-np.inf, np.zeros(n)),
                 "fingerprint": _fingerprint(settings, shape, train)}
    es = state["es"]
    if "np_global_rng" in state:  # pycma samples from numpy's global RNG: restore it for an identical resume
        np.random.set_state(state["np_global_rng"])
    while state["generation"] < ev.generations:
        g = state["generation"]
        t0 = time.perf_counter()
        calls0, hits0, enc0, cost0 = pool.stats.calls_made, pool.stats.store_hits, states.encoded, pool.stats.cost_usd
        X = es.ask()
        tasks = minibatch(train, ev.episodes_per_candidate, ev.seed, g)
        heads = [shape.unflatten(x) for x in X]
        episodes = [Episode(task=t, candidate=c, rng=episode_rng(ev.seed, g, c, t.id))
                    for c in range(len(X)) for t in tasks]
        asyncio.run(play_episodes(episodes, heads, pool, states, settings.coordinator.max_turns,
                                  settings.reward, grade))
        fitness = np.zeros(len(X))
        for e in episodes:
            fitness[e.candidate] += e.reward / len(tasks)
        es.tell(X, (-fitness).tolist())  # pycma minimises
        if store is not None:
            store.put_episodes({"run_id": run_id, "generation": g, "candidate": e.candidate, "task_id": e.task.id,
                                "path": e.path, "reward": e.reward, "correct": e.correct, "cost_usd": e.cost_usd}
                               for e in episodes)
        b = int(np.argmax(fitness))
        if fitness[b] > state["best"][0]:
            state["best"] = (float(fitness[b]), np.array(X[b]))
        models, roles = {}, {}
        for e in episodes:
            for m, r in e.picks:
                models[pool.names[m]] = models.get(pool.names[m], 0) + 1
                roles[r.value] = roles.get(r.value, 0) + 1
        rec = GenerationRecord(
            generation=g, best_fitness=float(fitness.max()), mean_fitness=float(fitness.mean()),
            sigma=float(es.sigma), calls_made=pool.stats.calls_made - calls0, store_hits=pool.stats.store_hits - hits0,
            states_encoded=states.encoded - enc0, cost_usd=pool.stats.cost_usd - cost0, model_usage=models,
            role_usage=roles, mean_accuracy=float(np.mean([e.correct for e in episodes])),
            wall_s=time.perf_counter() - t0)
        state["history"].append(rec)
        state["generation"] = g + 1
        state["np_global_rng"] = np.random.get_state()
        if resume_path is not None:
            _atomic_pickle(state, resume_path)
        if on_generation is not None:
            on_generation(rec)
    return EvolutionResult(params=np.asarray(es.mean, dtype=np.float64).copy(), best_params=state["best"][1],
                           best_fitness=state["best"][0], history=state["history"])


def _fingerprint(settings: Settings, shape: HeadShape, train: Sequence[Task]) -> str:
    from trinity.records import stable_hash

    return stable_hash({"settings": settings.model_dump(include={"evolve", "reward", "coordinator", "pool"}),
                        "shape": [shape.n_models, shape.dim], "train": [t.id for t in train]})


def save_checkpoint(path: Path, params: np.ndarray, metadata: dict) -> None:
    """Checkpoint = params .npy + JSON metadata beside it (same stem)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path.with_suffix(".npy"), params.astype(np.float64))
    path.with_suffix(".json").write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")


def load_checkpoint(path: Path) -> tuple[np.ndarray, dict]:
    npy, meta = path.with_suffix(".npy"), path.with_suffix(".json")
    if not npy.exists() or not meta.exists():
        raise FileNotFoundError(f"checkpoint {path}: expected {npy.name} and {meta.name} beside each other")
    return np.load(npy), json.loads(meta.read_text())
