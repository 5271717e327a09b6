"""evolve: train the coordinator's head (params `evolve`, `reward`, `coordinator`, `pool`) on the train split,
resumable generation by generation; writes data/checkpoints/coordinator.{npy,json} and data/evolve/. The router
stage trains the learned-router baseline through the same `train_and_save`."""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from trinity.config import Settings
from trinity.files import write_json
from trinity.stages.lineage import lineage
from trinity.code_version import run_id
from trinity.grading import grade
from trinity.coordinator import policy
from trinity.stages.common import load_tasks
from trinity.stages.paths import Paths


def generation_logger(tracker, pool_names: list[str], prefix: str = "", step: bool = True, label: str = "evolve"):
    """W&B per generation: fitness (best/mean), step size, accuracy, model and role usage (every member and
    role, zeros included, so the curves have no gaps), model-choice entropy, new calls, store hits (and the
    hit rate), calls per episode, states encoded, cost; running totals of calls and cost."""
    totals = {"calls": 0, "cost_usd": 0.0}

    def on_generation(rec) -> None:
        totals["calls"] += rec.calls_made
        totals["cost_usd"] += rec.cost_usd
        metrics = {k: v for k, v in asdict(rec).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        metrics |= {f"model_usage/{k}": rec.model_usage.get(k, 0) for k in pool_names}
        metrics |= {f"role_usage/{k}": v for k, v in rec.role_usage.items()}
        lookups = rec.calls_made + rec.store_hits
        metrics |= {"store_hit_rate": rec.store_hits / lookups if lookups else 1.0,
                    "calls_total": totals["calls"], "cost_usd_total": totals["cost_usd"]}
        if tracker is not None:
            tracker.log({f"{prefix}{k}": v for k, v in metrics.items()}, step=rec.generation if step else None)
        print(f"[{'ablation' if prefix else label}:{rec.method}] gen {rec.generation}: saved vector "
              f"{rec.saved_fitness:.3f} (acc {rec.saved_accuracy:.2f}); candidates mean {rec.mean_fitness:.3f} "
              f"best {rec.best_candidate_fitness:.3f}; step {rec.sigma:.4g} calls {rec.calls_made} "
              f"hits {rec.store_hits}{_outage_note(rec)}{_validation_note(rec)} ({rec.wall_s:.1f}s)", flush=True)

    return on_generation


def _validation_note(rec) -> str:
    """The progress line's validation scores, when the run has a validation slice."""
    if rec.validation_mean is None:
        return ""
    return (f"; validation: mean {rec.validation_mean:.3f}, best candidate {rec.validation_best_candidate:.3f}, "
            f"selected {rec.validation_selected:.3f}")


def _outage_note(rec) -> str:
    """The progress line's outage count, when a generation had any: episodes left out of the fitness, replays."""
    if not (rec.outage_episodes or rec.outage_replays or rec.saved_outage_episodes):
        return ""
    return (f"; outages: {rec.outage_episodes} of {rec.episodes} episodes left out ({rec.outage_replays} replayed), "
            f"{rec.saved_outage_episodes} of the saved vector's")


def _train(settings: Settings, train, pool, states, store, *, resume_path: Path, run_id: str, on_generation,
           trees=None, validation=()):
    """The training loop of `settings.evolve.method`, its never-seen nodes expanded where `pool.task_runner` says."""
    from trinity.evolve.loop import evolve as run_es
    from trinity.pool.task_runner import run_expanding

    return run_expanding(
        lambda: run_es(settings, train, pool, states, grade, resume_path=resume_path, on_generation=on_generation,
                       run_id=run_id, store=store, trees=trees, validation=validation),
        settings.pool, pool, name=f"trinity-expand-{settings.evolve.method.replace('_', '-')}")


def _reset_adapter(states, layout) -> None:
    """Back to δ = 0 (the base encoder id) after SVF training evaluated its candidates' adapters."""
    if layout is not None and layout.n_svf:
        states.set_adapter(np.zeros(layout.n_svf, dtype=np.float32))


def run(settings: Settings, paths: Paths = Paths(), tracker=None) -> dict:
    return train_and_save(settings, paths, tracker, name="evolve", checkpoint=paths.checkpoint,
                          out_dir=paths.evolve_dir)


def train_and_save(settings: Settings, paths: Paths, tracker, *, name: str, checkpoint: Path, out_dir: Path) -> dict:
    """Train a head on the train split with `settings` (resumable: the run state is data/store/<name>_state.pkl)
    and write its checkpoint (`checkpoint`.{npy,json}) and `out_dir`/{history,metrics}.json."""
    from trinity.code_version import code_version
    from trinity.coordinator.checkpoint_meta import CheckpointMeta, CheckpointMember
    from trinity.coordinator.episode import StateCache
    from trinity.coordinator.features import features_json
    from trinity.evolve.loop import saved_fitness_episodes
    from trinity.pool.members import check_pool_config
    from trinity.pool.task_runner import executor_for
    from trinity.pool.runtime import build_pool
    from trinity.store import Store

    check_pool_config(settings.pool)
    splits = load_tasks(paths)
    train = splits.train
    encoder = policy.make_encoder(settings)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the resume state is this checkout's own (a queued experiment's copy does not share the workspace's)
    resume = paths.data / "store" / f"{name}_state.pkl"
    resume.parent.mkdir(parents=True, exist_ok=True)
    with Store(paths.store) as store:
        pool = build_pool(settings.pool, store, executor=executor_for(settings.pool))
        states = StateCache(encoder, store)
        result = _train(settings, train, pool, states, store, resume_path=resume,
                        run_id=run_id(settings, name),
                        on_generation=generation_logger(tracker, pool.names, label=name),
                        validation=splits.validation)
        layout = result.layout
        _reset_adapter(states, layout)
        meta = CheckpointMeta(
            pool=[CheckpointMember(name=m.name, model_id=m.model_id) for m in pool.members],
            code_version=code_version(), run_fingerprint=result.fingerprint,
            encoder=encoder.encoder_id, dim=int(states.dim), **layout.describe(),
            svf_layer=settings.coordinator.svf_layer, method=settings.evolve.method,
            features=features_json(result.features),
            seed=settings.evolve.seed, params_hash=settings.params_hash(),
            params_file=settings.source_path, generations=settings.evolve.generations,
            saved_fitness=result.saved_fitness,
            saved_accuracy=result.history[-1].saved_accuracy if result.history else None,
            saved_fitness_episodes=len(saved_fitness_episodes(settings, train)),
            best_candidate_fitness=result.best_candidate_fitness,
            final_mean_fitness=result.history[-1].mean_fitness if result.history else None,
            train_tasks=[t.id for t in train],
            validation_tasks=[t.id for t in splits.validation],
            selection=result.selection,
        )
        policy.save_checkpoint(checkpoint, result.params, meta)
        history = [asdict(r) for r in result.history]
        write_json(out_dir / "history.json", history)
        metrics = {"saved_fitness": result.saved_fitness, "best_candidate_fitness": result.best_candidate_fitness,
                   "generations": len(history), "resumed_from_generation": result.resumed_from,
                   "code_version": code_version(), "calls_made": pool.stats.calls_made,
                   "store_hits": pool.stats.store_hits, "failed_calls": pool.stats.failures,
                   "transient_failures": pool.stats.transient_failures,
                   "outage_episodes": sum(r["outage_episodes"] for r in history),
                   "n_params": layout.n_params, "svf_params": layout.n_svf}
        if result.selection is not None:
            s = result.selection
            metrics |= {"validation_selected": s["selected"], "validation_start": s["start"],
                        "validation_best_member": s["best_member_score"], "best_member": s["best_member"],
                        "beats_best_member_on_validation": s["beats_best_member"]}
            print(f"[{name}] saved: {s['selected_from']}, validation {s['selected']:.3f} on {s['items']} items; best "
                  f"member alone ({s['best_member']}) {s['best_member_score']:.3f}: "
                  + ("the coordinator beats it" if s["beats_best_member"] else
                     "the coordinator does NOT beat it"), flush=True)
        write_json(paths.metrics(name), metrics)
    lineage(tracker, paths, uses=("prepared",), logs="checkpoint" if name == "evolve" else f"{name}-checkpoint",
            metadata=metrics)
    return metrics
