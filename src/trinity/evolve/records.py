"""What a training run reports: one `GenerationRecord` per generation (the fitness curve, calls, usage, validation)
and the run's `EvolutionResult` (the saved vector, its scores, the history)."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trinity.coordinator.head import ParamLayout


@dataclass
class GenerationRecord:
    generation: int
    best_candidate_fitness: float
    """The best sampled candidate's fitness on this generation's minibatch: a noisy maximum over candidates,
    *not* the fitness of the vector the run saves (that is `saved_fitness`)."""
    mean_fitness: float
    """Mean over this generation's candidates of their minibatch fitness."""
    sigma: float
    calls_made: int
    store_hits: int
    states_encoded: int
    cost_usd: float
    model_usage: dict[str, int]
    role_usage: dict[str, int]
    mean_accuracy: float
    wall_s: float
    method: str = "sep_cma"
    episodes: int = 0
    """Episodes played this generation (popsize x tasks): the budget every method spends alike."""
    calls_per_episode: float = 0.0
    model_entropy: float = 0.0
    """Entropy (nats) of the generation's model picks, all episodes pooled: 0 = one model for everything."""
    saved_fitness: float = 0.0
    """Fitness of the vector the run would save after this generation (`Optimizer.params`: CMA's mean), on
    the fixed scoring episodes (`saved_fitness_episodes`): the same tasks and seeds every generation."""
    saved_accuracy: float = 0.0
    """Correctness alone on those same episodes."""
    outage_episodes: int = 0
    """Candidates' episodes still hit by an outage after `OUTAGE_REPLAYS` replays: left out of their candidate's
    fitness (and of `mean_accuracy`, the optimiser's update and the episodes table)."""
    outage_replays: int = 0
    """Candidates' episodes replayed because of an outage (a replay that answered counts like any episode)."""
    saved_outage_episodes: int = 0
    """Scoring episodes of the saved vector left out of `saved_fitness` / `saved_accuracy` for an outage."""
    validation_mean: float | None = None
    """The optimiser's answer (CMA's mean) after this generation, on the validation items (`trinity.evolve.validation`;
    None without a validation slice)."""
    validation_best_candidate: float | None = None
    """This generation's best sampled candidate (by minibatch fitness) on the validation items."""
    validation_selected: float | None = None
    """The best validation score so far (the start included): that of the vector the run would save now."""
    validation_no_answer: float | None = None
    """Share of validation items the mean's episodes returned no answer on."""
    validation_best_member: float | None = None
    """The best pool member alone on the validation items (the same every generation: the line to beat)."""


@dataclass
class EvolutionResult:
    params: np.ndarray
    """The vector the run saves: with a validation slice, the best there of the start and every generation's mean
    and best candidate (`selection`); without one, the optimiser's answer after the last generation (CMA's mean)."""
    saved_fitness: float | None
    """`params`' own fitness on the fixed scoring episodes (None when no generation was played)."""
    best_candidate_params: np.ndarray
    best_candidate_fitness: float
    """The best sampled candidate over the run, by its (noisy) minibatch fitness: kept for inspection; it is
    not what the run saves."""
    history: list[GenerationRecord] = field(default_factory=list)
    layout: ParamLayout | None = None
    resumed_from: int = 0
    """Generations already played by the checkpoint this call resumed (0: a new run)."""
    fingerprint: str = ""
    """The run's identity (`run_fingerprint`)."""
    features: object = None
    """The feature map the head was trained on (`coordinator.features.FeatureMap`; None = raw states): saved
    with the checkpoint, applied wherever the head is used."""
    selection: dict | None = None
    """With a validation slice: what was selected and the line it must beat — items, the start's score, the selected
    vector's score and where it came from, each member alone, the best member, and whether the coordinator beats it
    (strictly). None without one."""
