"""A checkpoint's metadata (<stem>.json beside the parameter vector <stem>.npy), as one typed record.

The evolve and router stages write it (`trinity.stages.evolve.train_and_save`); the policy that plays the head, the
evaluate stage, the report, serving and `trinity diagnose` read it. Every field but `pool` is optional: a
checkpoint written by hand (a test's, a benchmark's, or one assembled for `trinity serve`) names its pool and may
leave the rest out, and a checkpoint keeps only the fields it was written with (`to_json`: unset fields stay out of
the file), so writing a record read from a file gives the same bytes back. An unknown field is an error naming it:
a misspelt key must not be read as "absent".

What the fields mean is what the evolve stage wrote them as; the JSON layout is the one the files have always had
(keys sorted, two-space indent: `trinity.coordinator.policy.save_checkpoint`).
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from trinity.config import validation_problems


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CheckpointMember(_Record):
    """A pool member the head was trained on, in the head's order (its first L logits)."""

    name: str
    model_id: str | None = None
    """What the member was when trained (`ChatModel.model_id`: a local GGUF's content hash, an endpoint's model)."""


class Selection(_Record):
    """With a validation slice: which vector the run saved and the line it had to beat (`trinity.evolve.loop`)."""

    items: int
    """Validation items every candidate vector was scored on."""
    start: float
    """The starting vector's validation score (the zero head, or the warm start)."""
    warm_start: str = "none"
    """Where the optimiser started ("none" in checkpoints from before warm starts existed)."""
    selected: float
    """The saved vector's validation score."""
    selected_from: str
    """Where the saved vector came from ("start", "generation g mean", "generation g best candidate")."""
    members: dict[str, float]
    """Each pool member alone, as Worker, on the validation items."""
    members_no_answer: dict[str, float]
    """Share of validation items each member alone returned no answer on."""
    best_member: str
    best_member_score: float
    beats_best_member: bool
    """Whether the saved vector scores strictly above the best member alone."""


class CheckpointMeta(_Record):
    """The metadata of one checkpoint (module doc)."""

    pool: list[CheckpointMember]
    code_version: str | None = None
    """`trinity.code_version` of the code that trained it."""
    run_fingerprint: str | None = None
    """The training run's identity (`trinity.evolve.loop.run_fingerprint`): what results.json names as evaluated."""
    encoder: str | None = None
    """The coordinator encoder's id (model, dtype, feature config): the head reads its hidden states."""
    dim: int | None = None
    """Hidden-state size the head reads."""
    n_params: int | None = None
    head_params: int | None = None
    svf_params: int | None = None
    head_shape: list[int] | None = None
    """[L + 3, d]: L member logits and 3 role logits over a d-dimensional state."""
    svf_layer: int | None = None
    method: str | None = None
    """The optimiser (`evolve.method`)."""
    features: dict[str, Any] | None = None
    """The feature map the head was trained on (`trinity.coordinator.features.features_json`)."""
    seed: int | None = None
    params_hash: str | None = None
    params_file: str | None = None
    generations: int | None = None
    saved_fitness: float | None = None
    """The saved vector's fitness on the fixed scoring episodes of the last generation."""
    saved_accuracy: float | None = None
    saved_fitness_episodes: int | None = None
    best_candidate_fitness: float | None = None
    final_mean_fitness: float | None = None
    train_tasks: list[str] | None = None
    validation_tasks: list[str] | None = None
    selection: Selection | None = None

    @property
    def pool_names(self) -> list[str]:
        return [m.name for m in self.pool]

    def to_json(self) -> dict:
        """The JSON object of the file: the fields this record was made with, nothing added."""
        return self.model_dump(mode="json", exclude_unset=True)

    @classmethod
    def from_json(cls, data: Any, where: str) -> "CheckpointMeta":
        """The record of a checkpoint's JSON; ValueError naming `where` and each wrong field's path."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise ValueError(f"{where}: not a checkpoint's metadata ({'; '.join(validation_problems(e))})") from None
