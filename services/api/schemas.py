"""The job API's wire format (``/v1``): one spec per job kind, the job view, pages, errors.

Specs forbid unknown fields, so a misspelled field is a 422 that names it, never ignored.
Path fields (:func:`path_ref`) are confined to the configured roots at submission
(:mod:`services.api.paths`).
"""

from __future__ import annotations

import difflib
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from services.api.paths import Access, path_field
from services.datasets.mixture import is_mixture_spec, parse_mixture
from services.datasets.predictions import GOLD
from services.protocol.ids import Ident, InstanceKey
from services.protocol.progress import TrajectoryProgress
from services.protocol.tasks import AgentLimits, SamplingConfig
from services.protocol.trajectory import OutcomeStatus

# A free-text reference (model name, path, dataset name): printable, no control characters.
REF_PATTERN = r"^[^\x00-\x1f\x7f]+$"
Ref = Field(min_length=1, max_length=1024, pattern=REF_PATTERN)


def path_ref(access: Access, *, mixture: bool = False, literals: tuple[str, ...] = ()) -> Any:
    """A path field the services act on: confined to ``api.paths`` at submission
    (:mod:`services.api.paths`; the declaration is ``x-swerl-path`` in /openapi.json)."""
    extra = path_field(access, mixture=mixture, literals=literals)
    return Field(min_length=1, max_length=1024, pattern=REF_PATTERN, json_schema_extra=extra)


class JobKind(StrEnum):
    TRAIN = "train"
    ROLLOUT = "rollout"
    EVAL = "eval"


class JobState(StrEnum):
    QUEUED = "queued"  # waiting to be claimed (train/eval: by a trainer/evaluator)
    RUNNING = "running"  # a runner or trainer holds its lease
    CANCELLING = "cancelling"  # cancel asked while running; the holder is stopping it
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BatchShape(Spec):
    prompts_per_step: int = Field(8, ge=1, le=100_000)
    samples_per_prompt: int = Field(8, ge=1, le=1024)


# The trainer's algorithm registry (trainer.algorithms.ALGORITHM_REGISTRY, baselines
# included), named here because the API may not import the trainer (torch); a unit test keeps
# the two equal.
ALGORITHM_NAMES: tuple[str, ...] = ("dapo", "grpo", "gspo", "li2sao", "lisao", "pact", "srppo")


def check_algorithm(name: str) -> str:
    """``name`` if the trainer knows it; else a ValueError listing the known ones (and the
    closest, for a typo)."""
    if name in ALGORITHM_NAMES:
        return name
    close = difflib.get_close_matches(name, ALGORITHM_NAMES, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(
        f"unknown algorithm {name!r}: {hint}the trainer knows {', '.join(ALGORITHM_NAMES)}"
    )


class TrainSpec(Spec):
    """A training run, executed by a trainer service of ``trainer_group``."""

    algorithm: str = Field("li2sao", min_length=1, max_length=64, pattern=r"^[a-z0-9_\-]+$")
    model: str = path_ref(Access.INPUT)  # the model directory (trainer's host)
    # a mixture of dataset files, or a file of instance ids (trainer's host)
    dataset: str = path_ref(Access.INPUT, mixture=True)
    steps: int = Field(ge=1, le=10_000_000)
    batch: BatchShape = Field(default_factory=BatchShape)
    checkpoint_dir: str = path_ref(Access.OUTPUT)  # written (and read back on resume)
    resume: bool = False
    trainer_group: Ident = "default"

    @field_validator("algorithm")
    @classmethod
    def _known_algorithm(cls, value: str) -> str:
        return check_algorithm(value)

    @field_validator("dataset")
    @classmethod
    def _mixture_syntax(cls, value: str) -> str:
        """A mixture's syntax is checked at submission; its files on the trainer."""
        if is_mixture_spec(value):
            parse_mixture(value, check_files=False)  # DatasetError: a ValueError, a 422
        return value


class RolloutSpec(Spec):
    """``instance_ids`` x ``n_samples`` trajectories with the policy ``policy_version``."""

    instance_ids: list[InstanceKey] = Field(min_length=1, max_length=10_000)
    n_samples: int = Field(1, ge=1, le=1024)
    model: str | None = Field(None, min_length=1, max_length=1024, pattern=r"^[^\x00-\x1f\x7f]+$")
    policy_version: int = Field(0, ge=0, le=2**62)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_attempts: int = Field(3, ge=1, le=20)


class EvalSpec(Spec):
    """A checkpoint (or existing predictions) scored on a dataset: pass@1 / resolved rate.

    Executed by the evaluator service (``python -m services.eval serve``), which runs the
    evaluation script on it; paths are read on the evaluator's host. Exactly one of
    ``checkpoint`` (generate the predictions with the training scaffold, then grade) and
    ``predictions`` (grade a SWE-bench predictions file, or ``gold``: the dataset's patches).
    """

    checkpoint: str | None = Field(
        None, min_length=1, max_length=1024, pattern=REF_PATTERN,
        json_schema_extra=path_field(Access.INPUT),
    )  # fmt: skip
    predictions: str | None = Field(
        None, min_length=1, max_length=1024, pattern=REF_PATTERN, validate_default=True,
        json_schema_extra=path_field(Access.INPUT, literals=(GOLD,)),
    )  # fmt: skip
    dataset: str = path_ref(Access.INPUT)
    instance_ids: list[Ident] | None = Field(None, min_length=1, max_length=10_000)
    max_instances: int | None = Field(None, ge=1, le=100_000)
    n_samples: int = Field(1, ge=1, le=1, description="pass@1: one prediction per instance")

    @field_validator("predictions")
    @classmethod
    def _one_source(cls, value: str | None, info: ValidationInfo) -> str | None:
        checkpoint = info.data.get("checkpoint")
        if (value is None) == (checkpoint is None) and "checkpoint" in info.data:
            raise ValueError("give exactly one of checkpoint and predictions")
        return value


SPECS: dict[JobKind, type[Spec]] = {
    JobKind.TRAIN: TrainSpec,
    JobKind.ROLLOUT: RolloutSpec,
    JobKind.EVAL: EvalSpec,
}


class Progress(BaseModel):
    done: int = 0
    total: int = 0
    current_step: int | None = None  # train: the optimizer step reached
    phase: str | None = None  # train (Li2SAO): the phase; others: what the job waits for


class TrajectoryCounts(BaseModel):
    """How a rollout job's trajectories ended. ``graded``: a reward was computed, 0 included
    (a wrong answer, an agent error or a timeout is the policy's normal result); ``aborted``:
    an infrastructure failure (no reward, excluded from training): the job's failed
    trajectories. ``resolved``: graded with a reward above 0."""

    total: int = 0
    graded: int = 0
    resolved: int = 0
    aborted: int = 0

    @classmethod
    def from_metrics(cls, metrics: dict[str, float]) -> TrajectoryCounts | None:
        """The counts behind a rollout runner's metrics summary (``n_<status>`` per outcome
        status, ``resolved_rate`` of the graded ones), or None before any result."""
        by_status = {s: int(metrics.get(f"n_{s.value}", 0)) for s in OutcomeStatus}
        total = sum(by_status.values())
        if not total:
            return None
        aborted = by_status[OutcomeStatus.ABORTED]
        graded = total - aborted
        resolved = round(float(metrics.get("resolved_rate", 0.0)) * graded)
        return cls(total=total, graded=graded, resolved=resolved, aborted=aborted)


class Job(BaseModel):
    """A job as the API shows it."""

    id: str
    kind: JobKind
    state: JobState
    spec: dict[str, Any]
    submitted_by: str
    created_at: float
    updated_at: float
    started_at: float | None = None
    finished_at: float | None = None
    attempt: int = 0  # how many times a runner/trainer claimed it
    progress: Progress = Field(default_factory=Progress)
    metrics: dict[str, float] = Field(default_factory=dict)
    message: str = ""  # why it is in its state (an error, what it waits for)
    # rollout jobs: how the trajectories so far ended (aborted: infrastructure failures)
    trajectories: TrajectoryCounts | None = None
    # in a submission's answer only: what may keep the job from running (no trainer seen)
    warnings: list[str] = Field(default_factory=list)


class JobPage(BaseModel):
    jobs: list[Job]
    next_cursor: str | None = None  # pass as ?cursor= for the next (older) page


class ResultPage(BaseModel):
    results: list[dict[str, Any]]
    total: int
    next_offset: int | None = None


class LogLine(BaseModel):
    ts: float
    level: str
    message: str


class LogPage(BaseModel):
    lines: list[LogLine]
    next_offset: int


class ProgressPage(BaseModel):
    """``GET /v1/jobs/{id}/progress``: the latest event of each trajectory of a rollout job
    (``latest``) and, with ``?after=``, the events after that stream position (``events``,
    oldest first; pass ``next_after`` as ``after`` to follow). ``docs/api.md`` "Progress"."""

    latest: list[TrajectoryProgress]
    events: list[TrajectoryProgress] = Field(default_factory=list)
    next_after: str | None = None  # with ?after= only


class ErrorDetail(BaseModel):
    message: str
    type: str
    field: str | None = None  # the offending field, dotted ("body.spec.steps"), when one


class ErrorBody(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    detail: str = ""
