"""Settings of the queue layer, shared by the rollout manager and the sandbox workers.

Both sides must agree on ``prefix``; the timing knobs are read by whichever side acts on them
(workers refresh heartbeats well inside ``heartbeat_ttl_s``; the manager re-delivers a dead
node's tasks once their stream entries have been idle for ``claim_min_idle_s``).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from services.config import StrictModel


class QueueConfig(StrictModel):
    prefix: str = Field("swerl:", pattern=r"^[A-Za-z0-9_.:\-]{1,64}$")
    # A worker is considered dead when its heartbeat key has expired.
    heartbeat_ttl_s: float = Field(10.0, gt=0.0, le=3600.0)
    # Min idle time (XAUTOCLAIM) before an entry of a dead node is taken back. Live workers
    # refresh their running entries on every heartbeat, so only lost work gets this idle.
    claim_min_idle_s: float = Field(30.0, ge=0.0, le=86_400.0)
    # A task handed to workers this many times without any result is dead-lettered (a task
    # that kills its worker must not take the cluster down one node after the other).
    max_deliveries: int = Field(5, ge=1, le=100)
    results_maxlen: int = Field(100_000, ge=100)  # approximate cap of the global results stream
    dead_maxlen: int = Field(100_000, ge=100)  # approximate cap of the dead-letter stream
    # Reconnection: per-command retries with exponential backoff capped at backoff_cap_s.
    connect_retries: int = Field(8, ge=0, le=1000)
    backoff_cap_s: float = Field(2.0, gt=0.0, le=60.0)
    socket_timeout_s: float = Field(10.0, gt=0.0, le=600.0)

    @field_validator("prefix")
    @classmethod
    def _prefix_ends_with_separator(cls, value: str) -> str:
        """``swerl`` and ``swerl:`` mean the same namespace (and an env value ``x:`` would be
        parsed as a YAML mapping, so the colon may be left out)."""
        return value if value.endswith(":") else value + ":"
