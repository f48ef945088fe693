"""Messages of the execution plane: rollout requests, tasks, task results.

The trainer asks the rollout manager for a :class:`RolloutRequest`; the manager turns it into
one :class:`RolloutTask` per trajectory and puts them on Redis streams; a sandbox worker runs a
task and reports a :class:`TaskResult`. All are pydantic models that travel as JSON; a payload
that does not validate is rejected with a clear message (and dead-lettered, never lost).

Every request and task has a ``kind`` (:data:`TASK_KINDS`): ``"swe"`` (the default: a SWE-bench
instance run by an agent in a sandbox) or ``"toy"`` (the toy task "lookup then answer",
:mod:`services.protocol.toy`, run without a container). A toy request or task must name toy
instance ids (``toy-lookup-<n>``); an unknown kind is a validation error naming the field.
"""

from __future__ import annotations

import time
import uuid
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.protocol.ids import Ident, InstanceKey
from services.protocol.toy import ToyTaskError, instance_number
from services.protocol.trajectory import Outcome

TaskKind = Literal["swe", "toy"]
TASK_KINDS: tuple[str, ...] = get_args(TaskKind)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


def check_instances_of_kind(kind: str, instance_ids: list[str]) -> None:
    """A toy request or task names only toy instance ids (ValueError naming the first bad one)."""
    if kind != "toy":
        return
    for instance_id in instance_ids:
        try:
            instance_number(instance_id)
        except ToyTaskError as exc:
            raise ValueError(f"kind 'toy': {exc}") from None


class AgentLimits(Message):
    max_steps: int = Field(300, ge=1, le=10_000)  # agent iterations (LLM calls)
    wall_time_s: float = Field(3600.0, gt=0)
    max_context_tokens: int = Field(131_072, ge=256)


class SamplingConfig(Message):
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(-1, ge=-1)
    max_tokens: int = Field(4096, ge=1)  # per assistant turn


class RolloutRequest(Message):
    """``len(instance_ids)`` prompts x ``n_samples`` trajectories, one group per prompt."""

    batch_id: Ident = Field(default_factory=lambda: f"b-{uuid.uuid4().hex[:12]}")
    job_id: Ident = "default"
    instance_ids: list[InstanceKey] = Field(min_length=1)
    n_samples: int = Field(1, ge=1, le=1024)
    group_ids: list[Ident] | None = None  # default: "<batch_id>:<index>"
    policy_version: int = Field(0, ge=0)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    max_attempts: int = Field(3, ge=1, le=20)  # infrastructure retries per task
    kind: TaskKind = "swe"

    @model_validator(mode="after")
    def _groups_match(self) -> RolloutRequest:
        check_instances_of_kind(self.kind, self.instance_ids)
        if self.group_ids is not None and len(self.group_ids) != len(self.instance_ids):
            raise ValueError(
                f"group_ids has {len(self.group_ids)} entries for "
                f"{len(self.instance_ids)} instance_ids"
            )
        return self

    def resolved_group_ids(self) -> list[str]:
        return self.group_ids or [f"{self.batch_id}:{i}" for i in range(len(self.instance_ids))]


class RolloutTask(Message):
    task_id: Ident
    batch_id: Ident
    job_id: Ident = "default"
    group_id: Ident
    instance_id: InstanceKey
    sample_index: int = Field(0, ge=0)
    policy_version: int = Field(0, ge=0)
    attempt: int = Field(1, ge=1)
    max_attempts: int = Field(3, ge=1)
    limits: AgentLimits = Field(default_factory=AgentLimits)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    image: str | None = None  # default: the instance image naming rule of the node
    created_at: float = Field(default_factory=time.time)
    kind: TaskKind = "swe"

    @model_validator(mode="after")
    def _instance_of_kind(self) -> RolloutTask:
        check_instances_of_kind(self.kind, [self.instance_id])
        return self

    @property
    def trajectory_id(self) -> str:
        """One trajectory per attempt, so a retried task never appends to a dead record."""
        return f"{self.task_id}.a{self.attempt}"


class TaskResult(Message):
    task_id: Ident
    batch_id: Ident
    trajectory_id: Ident
    node: Ident
    attempt: int = Field(ge=1)
    outcome: Outcome
    finished_at: float = Field(default_factory=time.time)
