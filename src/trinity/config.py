"""params.yaml → validated, typed settings.

Every section is a pydantic model with `extra="forbid"` and strict scalar types, so an unknown key or a
wrong type fails at load with a message naming the file and the dotted key, before any work starts.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trinity.records import stable_hash

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class ConfigError(ValueError):
    """params.yaml (or another settings file) is wrong; the message names the file and the key."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


USER_BENCHMARK_NAME = re.compile(r"[a-z][a-z0-9_]*")
"""A user benchmark's name: lower-case letters, digits and underscores (it prefixes task ids and names report rows)."""


class DataSettings(_Section):
    root: str = "../shared/benchmarks"
    """Benchmark directory, relative to the project root; env TRINITY_DATA_DIR overrides it."""
    train: dict[str, int] = Field(default_factory=lambda: {"math500": 4, "mmlu": 4})
    """Training sources → number of items drawn (seeded) from each."""
    heldout: dict[str, int] = Field(default_factory=lambda: {"gsm8k": 10})
    """Held-out evaluation sources → number of items (-1 = all): benchmarks never trained on."""
    in_distribution: dict[str, int] = Field(default_factory=dict)
    """In-distribution evaluation sources → number of items (-1 = all): items of the training benchmarks that
    are not in the training set (drawn from what training left)."""
    validation: dict[str, int] = Field(default_factory=dict)
    """Validation sources → number of items: items of the training benchmarks in neither the training set nor the
    in-distribution evaluation (drawn from what both left). Evolve scores each generation's mean and best candidate
    on them and saves the best there, beside the best pool member alone on the same items (empty: no selection,
    the last mean is saved)."""
    seed: int = 0
    math500_max_level: int = 5
    """Only MATH-500 problems of at most this difficulty level (1-5) are drawn."""
    user_benchmarks: dict[str, str] = Field(default_factory=dict)
    """Your own benchmarks: name → a JSONL file of items (relative to the project root; format in
    docs/user_benchmarks.md). Each name can then be used under train, in_distribution or heldout like a staged
    benchmark's. Keep the files under benchmarks/ (a dependency of the prepare stage: DVC re-draws when one changes)."""

    @model_validator(mode="after")
    def _check_user_benchmarks(self):
        for name, path in self.user_benchmarks.items():  # (a clash with a staged benchmark's name: at the draw)
            if not USER_BENCHMARK_NAME.fullmatch(name):
                raise ValueError(f"data.user_benchmarks.{name}: a name is lower-case letters, digits and underscores, "
                                 "starting with a letter")
            if not path.strip():
                raise ValueError(f"data.user_benchmarks.{name}: empty path")
        return self

    def resolved_root(self) -> Path:
        env = os.environ.get("TRINITY_DATA_DIR")
        p = Path(env) if env else Path(self.root)
        return p if p.is_absolute() else (PROJECT_ROOT / p).resolve()

    def resolved_user_benchmarks(self) -> dict[str, Path]:
        """user_benchmarks with each path resolved against the project root."""
        return {name: p if (p := Path(path)).is_absolute() else (PROJECT_ROOT / p).resolve()
                for name, path in self.user_benchmarks.items()}


class PoolMember(_Section):
    name: str
    backend: Literal["local", "openai"]
    model: str
    """Local: a bundled model id (see trinity.pool.bundled) or a path to a .gguf file.
    OpenAI-compatible: the model id sent to the endpoint."""
    base_url: str | None = None
    api_key_env: str | None = None
    """Name of the environment variable that holds the key (never the key itself)."""
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 256
    price_input_per_mtok: float = 0.0
    price_output_per_mtok: float = 0.0
    max_concurrency: int = 1
    """Calls in flight at once: an HTTP member's cap; a local member served by llama-server gets this many parallel
    slots (unset: `pool.max_concurrency`). A local member run in process decodes one call at a time whatever this is."""
    timeout_s: float = 120.0
    max_retries: int = 5
    engine: Literal["llama-server", "in-process"] = "llama-server"
    """Local members: what runs the GGUF. "llama-server" (default): llama.cpp's own server, one process per model
    started on first use (parallel slots decoded as one batch, a prompt cache per slot; `trinity.pool.llama_server`).
    "in-process": llama-cpp-python in this process, one call at a time per model, bit-for-bit reproducible between
    fresh runs (docs/benchmarks.md, "Local engine"). Unset here: `pool.local_engine`."""
    n_threads: int | None = None
    """Local members: CPU threads. Unset: in process 2 per model; llama-server the cores this process may use, split
    between the models the pool serves, at least 2 each (`trinity.pool.llama_server.with_thread_budget`: 2 each on
    2 cores, their waiting threads asleep)."""
    n_ctx: int = 4096
    """Local members: context window (tokens) of one call (per slot, for llama-server)."""
    prompt_style: Literal["chat", "completion"] = "chat"
    """"completion" for base (non-chat) models: the messages are rendered as a few-shot text prompt."""
    structured_output: bool = True
    """OpenAI-compatible members: send the Verifier's `response_format` (a strict JSON schema holding the verdict
    field). False for a server that rejects it (HTTP 400): the verdict is then asked for in the prompt only and
    read from the reply's last `Verdict:` line, unconstrained (local members always use a llama.cpp grammar)."""

    @field_validator("temperature", "top_p", "price_input_per_mtok", "price_output_per_mtok", "timeout_s", mode="before")
    @classmethod
    def _int_is_float(cls, v):
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _check_backend_fields(self):
        if self.backend == "openai" and not self.base_url:
            raise ValueError(f"pool member {self.name!r}: backend 'openai' needs base_url")
        return self


_DASK_ADDRESS = re.compile(r"(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([1-9][0-9]{0,4})")
"""A Dask scheduler address: protocol, host (a name, IPv4, or [IPv6]) and port."""


EXECUTION_SETTINGS = ("task_runner", "dask_workers", "dask_threads_per_worker", "dask_address")
"""The pool's settings of where its never-seen requests run (`trinity.pool.task_runner`). No part of a run's
identity: left out of the params hash (so of run ids) and of the resume fingerprint."""

MOVED_TO_POOL = EXECUTION_SETTINGS
"""evolve.* keys of earlier versions that are pool.* keys now: a params file still naming them fails with a
message saying where they went."""

RUNTIME_ONLY_SETTINGS = frozenset({"pool.max_concurrency", *(f"pool.{k}" for k in EXECUTION_SETTINGS)})
"""Settings that change how a stage runs (how many calls in flight, where never-seen nodes are expanded), never
what it computes: no DVC stage lists them as params (dvc.yaml lists every other key of the sections it reads), so
changing one leaves `dvc status` clean."""


class PoolSettings(_Section):
    members: list[PoolMember]
    max_concurrency: int = 8
    """Global cap on in-flight calls across the whole pool."""
    local_engine: Literal["llama-server", "in-process"] = "llama-server"
    """The engine of every local member that does not name its own (`PoolMember.engine`)."""
    task_runner: Literal["threads", "dask"] = "threads"
    """Where never-seen requests are expanded (a step's calls no stored reply answers) when the stage is
    orchestrated by Prefect: its ThreadPoolTaskRunner, or prefect-dask's DaskTaskRunner on a LocalCluster of
    worker processes (`trinity.pool.task_runner`; the evolve, router and evaluate stages' pools). Runtime only:
    it never changes results."""
    dask_workers: int = 2
    """LocalCluster worker processes (each loads the local models it is asked for once)."""
    dask_threads_per_worker: int = 1
    dask_address: str = ""
    """The scheduler of an existing Dask cluster (e.g. "tcp://127.0.0.1:8786") for task_runner: dask; empty = a
    LocalCluster of `dask_workers` started for the run (then dask_workers / dask_threads_per_worker apply; with an
    address, the cluster's own workers do). Its workers must run this checkout's code: the same environment (venv
    or install) as this process (docs/operations.md, "Dask: a pool on an existing cluster"). Runtime only, like
    the three above (`EXECUTION_SETTINGS`): where calls run is no part of a run's identity (resume fingerprint,
    params hash, run id), so one run may move between clusters."""

    @model_validator(mode="before")
    @classmethod
    def _local_member_defaults(cls, data):
        """A local member without its own `engine` takes `local_engine`; one served by llama-server without its own
        `max_concurrency` gets `max_concurrency` slots (as many calls as the pool keeps in flight)."""
        if not isinstance(data, dict) or not isinstance(data.get("members"), list):
            return data
        engine = data.get("local_engine", "llama-server")
        slots = data.get("max_concurrency", 8)
        members = []
        for m in data["members"]:
            if isinstance(m, dict) and m.get("backend") == "local":
                m = {"engine": engine, **m}
                if m["engine"] == "llama-server":
                    m = {"max_concurrency": slots, **m}
            members.append(m)
        return {**data, "members": members}

    @model_validator(mode="after")
    def _check_execution(self):
        for k in ("dask_workers", "dask_threads_per_worker"):
            if getattr(self, k) < 1:
                raise ValueError(f"pool.{k} must be >= 1, got {getattr(self, k)}")
        m = _DASK_ADDRESS.fullmatch(self.dask_address)
        if self.dask_address and (m is None or int(m.group(3)) > 65535):
            raise ValueError(f"pool.dask_address must be a scheduler address like 'tcp://127.0.0.1:8786' "
                             f"(tcp:// or tls://, a host and a port), got {self.dask_address!r}")
        if self.dask_address and self.task_runner != "dask":
            raise ValueError(f"pool.dask_address is set ({self.dask_address!r}) but pool.task_runner is "
                             f"{self.task_runner!r}: set task_runner: dask to use the cluster, or clear the address")
        return self

    @model_validator(mode="after")
    def _unique_names(self):
        names = [m.name for m in self.members]
        if len(set(names)) != len(names):
            raise ValueError(f"pool member names must be unique, got {names}")
        if not names:
            raise ValueError("pool.members is empty")
        return self


class CoordinatorSettings(_Section):
    encoder: str = "smollm2-135m-instruct"
    """A bundled GGUF id (loaded through transformers, converted copy cached) or a local HF model path."""
    encoder_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Forward-pass dtype: auto = bfloat16 on CPUs with native bf16 kernels (AVX512-BF16/AMX; ~2x faster, features
    within ~1e-4 cosine of fp32), float32 elsewhere. Part of the encoder id, so stored states never mix dtypes."""
    encode_chunk_tokens: int = Field(128, ge=1)
    """Transcripts are encoded in chunks cut at multiples of this many positions and prefixes are reused in whole
    chunks, so a feature is bit-identical whatever the prefix cache holds (exact resume). Larger chunks mean
    fewer, more efficient matrix products but more prefix tokens recomputed per turn; 128 is fastest here (see
    docs/benchmarks.md, "Coordinator cost"). Part of the encoder id."""
    max_turns: int = 3
    roles: list[Literal["thinker", "worker", "verifier"]] = Field(
        default_factory=lambda: ["thinker", "worker", "verifier"])
    """The roles the head may pick (the others get probability 0). All three: the paper's coordinator. The learned
    router baseline is this coordinator with ["worker"] and max_turns 1 (`trinity.coordinator.router`)."""
    max_encode_tokens: int = 2048
    """Transcripts longer than this keep their last tokens (the head reads the end of the conversation)."""
    policy_eval: Literal["argmax", "sample"] = "argmax"
    """How evaluation, serving and the validation selection play the head: its argmax picks, or seeded draws."""
    answer_rule: Literal["latest", "first", "accepted_else_first", "latest_unrejected"] = "first"
    """Which Worker answer an episode returns (`coordinator.roles.returned_answer`). "first": chosen by regrading
    stored episodes under every rule (scripts/answer_rule.py, reports/evidence/answer_rule.md). Under "first" an episode ends
    at its first answer: no later turn could change what it returns."""
    thinker_max_tokens: int = 160
    verifier_max_tokens: int = 48
    """Role caps on a member's max_tokens: a suggestion or a verdict needs far fewer tokens than a solution."""
    feature_norm: Literal["none", "standardize"] = "none"
    """What the head reads: "none" = the raw hidden state (the paper); "standardize" = centred and scaled by the
    training tasks' root states, plus a bias feature (trinity.coordinator.features; docs/results.md, "Does
    training learn?"). Saved in the checkpoint, applied wherever the head is used."""
    svf_layer: int | None = None
    """Train SVF scales of this encoder block (negative counts from the end) along with the head: the flat
    parameter vector becomes [δ…, head…]. None = head only (the paper's default)."""

    @model_validator(mode="after")
    def _check_roles(self):
        if len(set(self.roles)) != len(self.roles):
            raise ValueError(f"coordinator.roles: a role is listed twice: {self.roles}")
        if "worker" not in self.roles:
            raise ValueError(f"coordinator.roles: {self.roles} has no worker: no turn would ever answer")
        if self.max_turns < 1:
            raise ValueError(f"coordinator.max_turns must be >= 1, got {self.max_turns}")
        return self


class RewardSettings(_Section):
    """The episode's reward: the returned answer's grade (the paper's binary objective: every weight below 0, the
    default), plus a bonus for spreading turns across members, minus a turn penalty and a cost term. The bonus pays
    for spreading right or wrong; leave it off unless validation shows it helps."""
    diversity_weight: float = 0.0
    turn_penalty_weight: float = 0.0
    cost_weight: float = 0.0
    """Reward −= cost_weight x the episode's cost in `cost_unit` (0 in the paper)."""
    cost_unit: Literal["usd", "ktokens", "seconds"] = "usd"
    """usd: the members' prices (API members; a local member costs 0 unless given a notional price);
    ktokens: thousands of prompt + completion tokens; seconds: the calls' recorded wall time (local members).
    Costs are those recorded when a call was paid, so a replay from the store sees the same cost."""

    @field_validator("*", mode="before")
    @classmethod
    def _int_is_float(cls, v):
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v


class EvolveSettings(_Section):
    method: Literal["sep_cma", "reinforce", "random_search"] = "sep_cma"
    """The optimiser: sep-CMA-ES (the paper's), or one of the baselines of its ablation, which play the same
    episode budget (generations x popsize x episodes_per_candidate) on the same tasks."""
    seed: int = 0
    generations: int = 3
    sigma0: float = 0.03
    """Initial step size of sep-CMA-ES; the (fixed) perturbation scale of random search."""
    popsize: int | None = None
    """None → pycma's default ⌈4 + 3 ln n⌉ (for every method: it sets the episode budget)."""
    episodes_per_candidate: int = 4
    """Tasks drawn per generation (seeded); every candidate plays each of them once."""
    reinforce_lr: float = 0.001
    """Adam step size of the REINFORCE baseline."""
    saved_fitness_tasks: int | None = 32
    """Training tasks (a seeded draw, fixed for the run; null = all) on which, every generation, the vector the
    run saves (CMA's mean) is scored: its own fitness, not the best sampled candidate's minibatch score.
    32 x 2 samples = 64 episodes per generation, ~12 % of the paper's 33 x 16 population episodes."""
    saved_fitness_samples: int = 2
    """Seeded sampled episodes per scoring task (the same episodes every generation)."""
    warm_start: Literal["none", "best_member"] = "none"
    """Where the optimiser starts: "none" = the zero head (uniform picks); "best_member" = a head whose argmax
    policy is the best pool member on validation, as Worker (`trinity.evolve.validation.warm_start_head`; needs
    data.validation)."""

    @model_validator(mode="before")
    @classmethod
    def _moved_to_pool(cls, data):
        """Where never-seen nodes are expanded is the pool's setting now (every stage's pool uses it)."""
        moved = sorted(k for k in MOVED_TO_POOL if isinstance(data, dict) and k in data)
        if moved:
            raise ValueError(f"{', '.join('evolve.' + k for k in moved)} moved to the pool section: write "
                             f"{', '.join('pool.' + k for k in moved)} (every stage's pool expands its calls there)")
        return data

    @field_validator("sigma0", "reinforce_lr", mode="before")
    @classmethod
    def _int_is_float(cls, v):
        return float(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @model_validator(mode="after")
    def _check_positive(self):
        if self.generations < 0:
            raise ValueError(f"evolve.generations must be >= 0, got {self.generations}")
        if self.saved_fitness_tasks is not None and self.saved_fitness_tasks < 1:
            raise ValueError(f"evolve.saved_fitness_tasks must be >= 1 (or null), got {self.saved_fitness_tasks}")
        for k in ("episodes_per_candidate", "saved_fitness_samples"):
            if getattr(self, k) < 1:
                raise ValueError(f"evolve.{k} must be >= 1, got {getattr(self, k)}")
        if self.popsize is not None and self.popsize < 2:
            raise ValueError(f"evolve.popsize must be >= 2 (or null), got {self.popsize}")
        return self


class EvaluateSettings(_Section):
    seed: int = 0
    random_routing_seed: int = 0
    judge: str | PoolMember | None = None
    """The MT-Bench judge: a pool member's name, or a member of its own (e.g. an OpenAI-compatible endpoint,
    written like a pool member). Required when an evaluation set includes mt_bench. It judges at temperature 0
    (FastChat's setting) and its calls go through the response store like every other call."""
    judge_max_tokens: int = Field(512, ge=16)
    """Cap on a judge reply (FastChat's judge writes an explanation, then "[[rating]]")."""
    bootstrap_resamples: int = Field(2000, ge=100)


class TrackingSettings(_Section):
    wandb_project: str = "trinity"
    wandb_mode: Literal["offline", "online", "disabled"] = "offline"
    """The env var WANDB_MODE overrides this."""


class Settings(_Section):
    data: DataSettings = Field(default_factory=DataSettings)
    pool: PoolSettings
    coordinator: CoordinatorSettings = Field(default_factory=CoordinatorSettings)
    reward: RewardSettings = Field(default_factory=RewardSettings)
    evolve: EvolveSettings = Field(default_factory=EvolveSettings)
    evaluate: EvaluateSettings = Field(default_factory=EvaluateSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)

    source_path: str = ""
    """Where these settings were read from (filled by load_settings)."""

    @model_validator(mode="after")
    def _check_judge(self):
        judge = self.evaluate.judge
        names = [m.name for m in self.pool.members]
        if isinstance(judge, str) and judge not in names:
            raise ValueError(f"evaluate.judge: {judge!r} is not a pool member (members: {names}); name one of them "
                             "or give the judge's own settings (backend, model, base_url, ...)")
        evaluated = {k.partition(":")[0] for k in (*self.data.heldout, *self.data.in_distribution)}
        if "mt_bench" in evaluated and judge is None:
            raise ValueError("evaluate.judge: MT-Bench is evaluated (data.heldout or data.in_distribution names "
                             "mt_bench) but no judge is set: name a pool member or configure an endpoint")
        return self

    def section_hash(self, *sections: str) -> str:
        return stable_hash({s: getattr(self, s).model_dump() for s in sections})

    def params_hash(self) -> str:
        """The settings' identity: every key but where the pool's calls run (`EXECUTION_SETTINGS`)."""
        return stable_hash(self.model_dump(exclude={"source_path": True, "pool": set(EXECUTION_SETTINGS)}))


def load_settings(path: str | os.PathLike = "params.yaml") -> Settings:
    """Read and validate a params file. Raises ConfigError naming the file and the dotted key."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = PROJECT_ROOT / path
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections, got {type(raw).__name__}")
    if "source_path" in raw:
        raise ConfigError(f"{path}: key 'source_path' is reserved")
    try:
        return Settings.model_validate({**raw, "source_path": str(path)})
    except ValidationError as e:
        lines = [f"  {problem}" for problem in validation_problems(e)]
        raise ConfigError(f"{path}: invalid settings\n" + "\n".join(lines)) from None


def validation_problems(e: ValidationError) -> list[str]:
    """Each error of a pydantic validation as "dotted.key: what is wrong": "unknown key" for a key the record does
    not have, else pydantic's message and the value given (when it is no mapping). The settings and every file the
    code both writes and reads (a checkpoint's metadata) name their errors this way."""
    problems = []
    for err in e.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<top level>"
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        else:
            msg = err["msg"]
            if "input" in err and not isinstance(err["input"], dict):
                msg += f" (got {err['input']!r})"
        problems.append(f"{key}: {msg}")
    return problems
