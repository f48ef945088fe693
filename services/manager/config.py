"""Settings of the rollout manager (config section ``manager``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.config import StrictModel, register_section
from services.metrics_server import DEFAULT_ADDR, MetricsAddr, MetricsPort
from services.queue.config import QueueConfig


class ManagerConfig(StrictModel):
    redis_url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^(redis|rediss|unix)://")
    # Tasks a node may hold beyond its slots (queued on its stream), so a worker starts its next
    # task the moment a slot frees instead of waiting for a manager round trip.
    prefetch: int = Field(1, ge=0, le=64)
    # Longest wait between dispatch passes; completions and submissions wake the loop at once.
    poll_interval_s: float = Field(0.5, gt=0.0, le=60.0)
    # How often dead nodes are looked for and their tasks taken back.
    reclaim_interval_s: float = Field(2.0, gt=0.0, le=3600.0)
    # How often the service logs a one-line summary (pending, nodes, slots, busy).
    summary_interval_s: float = Field(30.0, gt=0.0)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Prometheus endpoint (services/manager/metrics.py): None serves none.
    metrics_port: MetricsPort = None
    metrics_addr: MetricsAddr = DEFAULT_ADDR
    queue: QueueConfig = Field(default_factory=QueueConfig)


register_section("manager", ManagerConfig)
