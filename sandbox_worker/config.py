"""Settings of a sandbox worker (config section ``worker``)."""

from __future__ import annotations

import re
import socket
from typing import Literal

from pydantic import Field, model_validator

from services.config import StrictModel
from services.queue.config import QueueConfig

NODE_PATTERN = r"^[A-Za-z0-9._\-]{1,100}$"


def default_node_name() -> str:
    """The host name, reduced to the characters a node name may hold."""
    name = re.sub(r"[^A-Za-z0-9._\-]", "-", socket.gethostname())[:100]
    return name or "node"


class SimulatedRunnerConfig(StrictModel):
    """The simulated runner (scheduling tests, benchmarks): it only sleeps.

    Durations: a ``sleep<ms>`` token in the instance id wins; otherwise lognormal with the given
    median and sigma when ``lognormal_median_s`` is set (deterministic per task id and seed);
    otherwise ``duration_s``.
    """

    duration_s: float = Field(0.0, ge=0.0, le=86_400.0)
    lognormal_median_s: float | None = Field(None, gt=0.0, le=86_400.0)
    lognormal_sigma: float = Field(1.0, ge=0.0, le=5.0)
    max_duration_s: float = Field(3600.0, gt=0.0)  # cap of sampled durations
    seed: int = 0
    reward: float = Field(1.0, ge=0.0, le=1.0)
    # Record every run's start and end in Redis under <prefix>sim: (concurrency and
    # utilisation measurements in tests and benchmarks).
    probe: bool = False


class WorkerConfig(StrictModel):
    redis_url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^(redis|rediss|unix)://")
    node: str = Field(default_factory=default_node_name, pattern=NODE_PATTERN)
    slots: int = Field(1, ge=1, le=256)
    backend: Literal["docker", "bwrap", "simulated"] = "docker"
    heartbeat_interval_s: float = Field(2.0, gt=0.0, le=600.0)
    # Longest a blocking read waits; bounds how fast the worker notices a stop request.
    block_ms: int = Field(1000, ge=1, le=60_000)
    # On SIGTERM/SIGINT: how long running trajectories may finish before they are stopped and
    # handed back (a second signal skips the wait).
    shutdown_grace_s: float = Field(30.0, ge=0.0, le=86_400.0)
    # How long a runner gets to return after its cancel token is set.
    cancel_stop_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    # How often the worker re-reads its own unacknowledged entries (a read whose reply was lost
    # across a connection failure leaves entries delivered but unseen).
    orphan_check_interval_s: float = Field(30.0, gt=0.0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    queue: QueueConfig = Field(default_factory=QueueConfig)
    simulated: SimulatedRunnerConfig = Field(default_factory=SimulatedRunnerConfig)

    @model_validator(mode="after")
    def _heartbeat_inside_ttl(self) -> WorkerConfig:
        if self.heartbeat_interval_s * 2 > self.queue.heartbeat_ttl_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s:g}) must be at most half of "
                f"queue.heartbeat_ttl_s ({self.queue.heartbeat_ttl_s:g}), or a live worker "
                "looks dead between two heartbeats"
            )
        return self
