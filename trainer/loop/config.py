"""Settings of the training loop (section ``train`` of the swerl configuration).

``python -m trainer train --config FILE`` reads four sections of one file: ``train`` (this
model: phases, batch shapes, dataset, rollouts, logging), ``trainer`` (the engine: model,
algorithm, objective, ``batch.max_policy_lag``, checkpoint directory), ``manager`` (Redis URL and
queue prefix of the rollout manager) and, when ``train.publish`` is true, ``publish`` (the
adapter the new versions go to). Defaults are LI2SAO_SPEC's: bootstrap 32 prompts x 8, then
256 x 1, the gate's paper values. See docs/training.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.config import StrictModel, load_config, register_section
from services.datasets.mixture import parse_mixture
from services.datasets.overlap import DEFAULT_THRESHOLD
from services.protocol.ids import Ident
from services.protocol.tasks import (
    AgentLimits,
    SamplingConfig,
    TaskKind,
    check_instances_of_kind,
)
from services.protocol.toy import MAX_INSTANCE, ToyPart, toy_prompt_ids

SECTION = "train"
Schedule = Literal["auto", "groups", "single", "switch"]
# auto: the schedule each algorithm's paper uses (LI2SAO_SPEC "Baselines"); see resolve_schedule
AUTO_SCHEDULES: dict[str, str] = {
    "li2sao": "switch",
    "grpo": "groups",
    "dapo": "groups",
    "gspo": "groups",
    "lisao": "single",
    "pact": "single",
    "srppo": "single",
}


class GroupShape(StrictModel):
    """Batches of ``prompts`` groups x ``group_size`` samples (the bootstrap's 32 x 8)."""

    prompts: int = Field(default=32, ge=1, description="prompt groups per batch (P)")
    group_size: int = Field(default=8, ge=2, description="samples per prompt (n)")


class SingleShape(StrictModel):
    """Batches of ``batch_size`` single rollouts, streamed from ``in_flight`` running ones."""

    batch_size: int = Field(default=256, ge=1, description="trajectories per batch (B)")
    in_flight: int | None = Field(
        default=None, description="trajectories submitted and not yet trained (> B; None = 2 B)"
    )

    @model_validator(mode="after")
    def _budget_above_batch(self) -> SingleShape:
        if self.in_flight is not None and self.in_flight <= self.batch_size:
            raise ValueError(
                f"in_flight ({self.in_flight}) must be larger than batch_size "
                f"({self.batch_size}): the streaming phase needs work beyond one batch"
            )
        return self

    @property
    def budget(self) -> int:
        return self.in_flight if self.in_flight is not None else 2 * self.batch_size


class GateSettings(StrictModel):
    """The readiness gate (Eq. 12-13, Algorithm 1; trainer.algorithms.ReadinessGate)."""

    beta: float = Field(default=0.9, ge=0, lt=1, description="EMA factor")
    eta_e: float = Field(default=0.2, description="explained-variance threshold")
    eta_a: float = Field(default=0.65, ge=0, le=1, description="ranking-accuracy threshold")
    consecutive: int = Field(default=10, ge=1, description="ready steps in a row to switch (M)")
    t_min: int = Field(default=60, ge=0, description="first step that may count as ready")
    t_max: int = Field(default=150, ge=0, description="switch at this step regardless")

    @model_validator(mode="after")
    def _window(self) -> GateSettings:
        if self.t_max < self.t_min:
            raise ValueError(f"t_max ({self.t_max}) must be >= t_min ({self.t_min})")
        return self


DENY_FILE_HELP = (
    "instance deny-list (services/datasets/denylist.py: an id a line, '# reason'): listed ids "
    "are left out at start-up, each logged with its reason"
)


class ToyPrompts(StrictModel):
    """Toy prompts ``toy-lookup-<n>`` for ``start <= n < stop``, all or one part of a fixed
    split (services/protocol/toy.py ``is_held_out``: one number in 8 by hash is held out), so a
    run trains on a broad range and evaluates on unseen prompts of the same distribution."""

    start: int = Field(default=0, ge=0, description="first request number")
    stop: int = Field(gt=0, le=MAX_INSTANCE, description="one past the last request number")
    part: ToyPart = Field(
        default="all", description="all | train (the split's training part) | held_out"
    )

    @model_validator(mode="after")
    def _range(self) -> ToyPrompts:
        if self.stop <= self.start:
            raise ValueError(f"toy_prompts: stop ({self.stop}) must be above start ({self.start})")
        return self

    def ids(self) -> list[str]:
        return toy_prompt_ids(self.start, self.stop, self.part)


MIXTURE_HELP = (
    "dataset files drawn by weight, '[name=]path[:weight],...' (services/datasets/mixture.py): "
    "prompts are '<name>/<instance_id>' keys, instead of instance_ids / instances_file"
)


class DatasetConfig(StrictModel):
    """Where the prompts come from: instance ids drawn in seeded shuffled epochs, or a
    ``mixture`` of dataset files drawn by the mixture's seeded sampler (every instance once per
    pass of its dataset; keys ``<dataset>/<instance_id>``).

    ``kind`` is the task kind of every rollout request (``swe`` when unset; ``toy`` for the toy
    task of docs/toy-task.md); a toy run names only toy instance ids (checked at start-up).
    The deny-list applies to both forms (a mixture's entry by its instance id); a mixture's
    entries that overlap ``overlap_eval`` (services/datasets/overlap.py) are left out too.
    """

    instance_ids: list[Ident] = Field(default_factory=list, description="prompt instance ids")
    instances_file: str = Field(
        default="", description="file with one instance id per line (added after instance_ids)"
    )
    toy_prompts: ToyPrompts | None = Field(
        default=None, description="toy prompts by range and split part (kind toy; added first)"
    )
    mixture: str = Field(default="", description=MIXTURE_HELP)
    on_change: Literal["error", "restart"] = Field(
        default="error",
        description="a resumed run whose dataset changed since its checkpoint (ids, files, "
        "weights, seed, deny-list): error (default) | restart (draw the new dataset from its "
        "start)",
    )
    deny_file: str = Field(default="", description=DENY_FILE_HELP)
    overlap_eval: str = Field(
        default="",
        description="evaluation dataset file (e.g. SWE-bench Verified): mixture entries that "
        "are, share the snapshot of, or near-duplicate one of its instances are left out",
    )
    overlap_threshold: float = Field(
        default=DEFAULT_THRESHOLD, gt=0, le=1, description="near-duplicate problem similarity"
    )
    kind: TaskKind | None = Field(
        default=None, description="task kind of every request: swe | toy (None: swe)"
    )
    shuffle: bool = Field(default=True, description="shuffle each epoch (seeded)")
    seed: int = Field(default=0, ge=0, description="seed of the epoch permutations")

    @field_validator("mixture")
    @classmethod
    def _mixture_parses(cls, value: str) -> str:
        if value:
            parse_mixture(value)  # DatasetError (a ValueError) names the part
        return value

    @model_validator(mode="after")
    def _ids_of_kind(self) -> DatasetConfig:
        if self.kind is not None:
            check_instances_of_kind(self.kind, self.instance_ids)
        if self.mixture and (self.instance_ids or self.instances_file or self.toy_prompts):
            raise ValueError(
                "give a mixture or instance ids (instance_ids/instances_file/toy_prompts), not both"
            )
        if self.toy_prompts is not None and self.kind != "toy":
            raise ValueError("toy_prompts needs kind: toy")
        if self.mixture and self.kind == "toy":
            raise ValueError("a mixture holds SWE instances: kind 'toy' cannot use it")
        if self.overlap_eval and not self.mixture:
            raise ValueError("overlap_eval checks a mixture: set mixture")
        return self


class RolloutSettings(StrictModel):
    """What every rollout request carries, and how long the loop waits for results."""

    job_id: Ident = "train"
    limits: AgentLimits = Field(default_factory=AgentLimits)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_attempts: int = Field(default=3, ge=1, le=20, description="infrastructure retries")
    wait_timeout_s: float = Field(
        default=7200.0, gt=0, description="longest wait for one batch's trajectories"
    )


class EvalSet(StrictModel):
    """A set of held-out instances: ids, a file of ids, or toy prompts by range (added first)."""

    toy_prompts: ToyPrompts | None = Field(
        default=None, description="toy prompts by range and split part"
    )
    instance_ids: list[Ident] = Field(default_factory=list, description="held-out instance ids")
    instances_file: str = Field(
        default="", description="file with one held-out id per line (added after instance_ids)"
    )
    deny_file: str = Field(default="", description=DENY_FILE_HELP)

    def inline_ids(self) -> list[str]:
        """The ids written in the config (toy prompts, then ``instance_ids``; not the file)."""
        toy = self.toy_prompts.ids() if self.toy_prompts is not None else []
        return [*toy, *self.instance_ids]

    def is_empty(self) -> bool:
        return not (self.toy_prompts or self.instance_ids or self.instances_file)


class EvalSettings(EvalSet):
    """The held-out evaluation of ``train.eval_interval`` (trainer.loop.evaluation): one rollout
    request over these instances on the version each interval step publishes; never trained
    on. The instances must not be training prompts (held out). ``shifted`` is a second set
    scored apart (``eval/shifted/*``): prompts of another form (longer request numbers), to
    see how far what was learned carries."""

    shifted: EvalSet | None = Field(
        default=None, description="a second held-out set scored apart (eval/shifted/*)"
    )
    n_samples: int = Field(default=1, ge=1, le=64, description="samples per held-out instance")
    sampling: SamplingConfig | None = Field(
        default=None, description="sampling of the evaluation (None: train.rollout.sampling)"
    )
    limits: AgentLimits | None = Field(
        default=None, description="agent limits (None: train.rollout.limits)"
    )
    wait_at_end_s: float = Field(
        default=1800.0, ge=0, description="longest wait for the last evaluations at the end"
    )


class TrainConfig(StrictModel):
    """The training loop: ``steps`` steps of collect -> build -> train -> publish -> log."""

    run_dir: str = Field(min_length=1, description="metrics.jsonl, batches.jsonl, tensorboard/")
    run_id: Ident = Field(default="run", description="prefix of the loop's rollout batch ids")
    steps: int = Field(ge=1, description="optimizer steps of the run")
    schedule: Schedule = Field(
        default="auto", description="groups, single, switch (Li2SAO), or auto from the algorithm"
    )
    bootstrap: GroupShape = Field(default_factory=GroupShape)
    single: SingleShape = Field(default_factory=SingleShape)
    gate: GateSettings = Field(default_factory=GateSettings)
    critic_warmup_steps: int | None = Field(
        default=None, ge=0, description="critic-only first steps (None: 10 for lisao, else 0)"
    )
    dynamic_sampling: bool | None = Field(
        default=None, description="only mixed groups enter a batch (None: true for dapo)"
    )
    checkpoint_every: int = Field(default=10, ge=1, description="checkpoint every N steps")
    publish: bool = Field(default=True, description="publish each version (section publish)")
    tensorboard: bool = Field(default=True, description="also write TensorBoard scalars")
    store_prefix: str = Field(default="swerl:", description="trajectory store key prefix")
    run_dispatcher: bool = Field(
        default=False, description="run the manager's dispatch loop in this process"
    )
    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    eval_interval: int = Field(
        default=0, ge=0, description="evaluate the held-out set (section eval) every N steps"
    )
    eval: EvalSettings = Field(default_factory=EvalSettings)

    @model_validator(mode="after")
    def _has_prompts(self) -> TrainConfig:
        dataset = self.dataset
        if not (dataset.instance_ids or dataset.instances_file or dataset.mixture
                or dataset.toy_prompts):  # fmt: skip
            raise ValueError("dataset needs instance_ids, an instances_file, toy_prompts or a "
                             "mixture")  # fmt: skip
        return self

    @model_validator(mode="after")
    def _eval_set(self) -> TrainConfig:
        if not self.eval_interval:
            return self
        if self.eval.is_empty():
            raise ValueError(
                "eval_interval needs eval.instance_ids, an eval.instances_file or eval.toy_prompts"
            )
        if not self.publish:
            raise ValueError(
                "eval_interval needs publish: true (the evaluation runs on the engines, which "
                "serve a trained version only once it is published)"
            )
        held_out = self.eval.inline_ids()
        if self.eval.shifted is not None:
            held_out += self.eval.shifted.inline_ids()
        if self.dataset.kind is not None:
            check_instances_of_kind(self.dataset.kind, held_out)
        elif self.eval.toy_prompts or (self.eval.shifted and self.eval.shifted.toy_prompts):
            raise ValueError("eval toy_prompts need train.dataset.kind: toy")
        training = list(self.dataset.instance_ids)
        if self.dataset.toy_prompts is not None:
            training += self.dataset.toy_prompts.ids()
        shared = sorted(set(held_out) & set(training))
        if shared:
            raise ValueError(f"eval instances must be held out, but {shared[:3]} are training "
                             "prompts (dataset.instance_ids)")  # fmt: skip
        return self


def resolve_schedule(config: TrainConfig, algorithm: str) -> str:
    """The schedule the run uses; ``switch`` only for li2sao (it needs the readiness gate)."""
    schedule = AUTO_SCHEDULES.get(algorithm, "single") if config.schedule == "auto" else None
    schedule = schedule or config.schedule
    if schedule == "switch" and algorithm != "li2sao":
        raise ValueError(
            f"schedule 'switch' needs the readiness statistics of li2sao, not {algorithm!r}"
        )
    return schedule


def warmup_steps(config: TrainConfig, algorithm: str) -> int:
    """Critic-only steps at the start (LI2SAO_SPEC: LiSAO 10, Li2SAO none)."""
    if config.critic_warmup_steps is not None:
        return config.critic_warmup_steps
    return 10 if algorithm == "lisao" else 0


def uses_dynamic_sampling(config: TrainConfig, algorithm: str) -> bool:
    """DAPO re-draws until groups are mixed (LI2SAO_SPEC "Baselines"); others keep every group."""
    if config.dynamic_sampling is not None:
        return config.dynamic_sampling
    return algorithm == "dapo"


register_section(SECTION, TrainConfig)


def load_train_config(
    path: str | Path | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> TrainConfig:
    """The ``train`` section from YAML / ``SWERL_TRAIN__*`` / overrides, validated."""
    return load_config(
        TrainConfig, section=SECTION, path=path, overrides=overrides, environ=environ
    )
