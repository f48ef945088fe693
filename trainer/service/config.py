"""Settings of the trainer service (config section ``trainer_service``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from services.config import StrictModel, register_section
from services.metrics_server import DEFAULT_ADDR, MetricsAddr, MetricsPort
from services.protocol.ids import Ident

SECTION = "trainer_service"


class TrainerServiceConfig(StrictModel):
    """One trainer service runs at most one train job of its group at a time."""

    redis_url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^(redis|rediss|unix)://")
    key_prefix: str = Field("swerl:api:", description="the job API's Redis key prefix")
    group: Ident = Field("default", description="the trainer group whose train jobs it claims")
    command: list[str] = Field(
        default_factory=list,
        description="the training command before --config FILE [--resume] "
        "(empty: this Python's -m trainer train; e.g. [torchrun, --nproc-per-node=8, -m, "
        "trainer, train])",
    )
    base_config: str = Field(
        "", description="YAML with the run's other sections (manager, publish, train, trainer)"
    )
    runs_dir: str = Field(
        "runs", min_length=1, description="job run dirs (<runs_dir>/<job id>); shared storage"
    )
    lease_ttl_s: float = Field(30.0, gt=0, le=3600, description="lease of a claimed job")
    poll_interval_s: float = Field(1.0, gt=0, le=60, description="wait between empty claims")
    stop_grace_s: float = Field(
        30.0, ge=0, le=3600, description="SIGTERM to SIGKILL of a stopped training process"
    )
    nnodes: int = Field(
        1, ge=1, le=1024, description="nodes of the group's torchrun (>1: a multi-node group)"
    )
    node_rank: int = Field(
        0, ge=0, description="this node's rank: 0 claims jobs (the leader), >0 joins them"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Prometheus endpoint (trainer/service/metrics.py): None serves none.
    metrics_port: MetricsPort = None
    metrics_addr: MetricsAddr = DEFAULT_ADDR

    @model_validator(mode="after")
    def _rank_in_group(self) -> TrainerServiceConfig:
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} must be < nnodes {self.nnodes}")
        return self


register_section(SECTION, TrainerServiceConfig)
