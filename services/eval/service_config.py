"""Settings of the evaluator service (config section ``eval_service``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.config import StrictModel, register_section
from services.metrics_server import DEFAULT_ADDR, MetricsAddr, MetricsPort
from services.protocol.ids import Ident

SECTION = "eval_service"


class EvalServiceConfig(StrictModel):
    """One evaluator service runs one eval job at a time (``workers`` sandboxes at once); run
    several for several jobs at once."""

    redis_url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^(redis|rediss|unix)://")
    key_prefix: str = Field("swerl:api:", description="the job API's Redis key prefix")
    group: Ident = Field("default", description="the job group whose eval jobs it claims")
    runs_dir: str = Field(
        "eval-runs", min_length=1, description="job report dirs (<runs_dir>/<job id>)"
    )
    backend: Literal["docker", "bwrap"] = Field("docker", description="sandbox backend")
    state_root: str | None = Field(
        None,
        pattern=r"^/",
        description="host directory of the sandboxes' state (None: the backend's default); "
        "in a container that drives the host's engine: the same path inside and out",
    )
    workers: int = Field(4, ge=1, le=1024, description="instances graded at once")
    timeout_s: int = Field(1800, ge=1, le=86_400, description="test timeout per instance")
    image_namespace: str = Field("", description="instance images' namespace ('': the default)")
    image_tag: str = Field("latest", min_length=1)
    hardened: bool = Field(
        True,
        description="grade every prediction a second time as training rewards are graded "
        "(hardened_resolved and tamper flags next to the official verdict; doubles the "
        "evaluation time); false: --no-hardened",
    )
    engine_url: list[str] = Field(
        default_factory=list,
        description="SGLang-protocol engines serving a checkpoint job's model (empty: the "
        "CPU reference engine, small models only)",
    )
    lease_ttl_s: float = Field(30.0, gt=0, le=3600, description="lease of a claimed job")
    poll_interval_s: float = Field(1.0, gt=0, le=60, description="wait between empty claims")
    stop_grace_s: float = Field(
        30.0, ge=0, le=3600, description="SIGINT to SIGKILL of a stopped evaluation process"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    # Prometheus endpoint (services/eval/metrics.py): None serves none.
    metrics_port: MetricsPort = None
    metrics_addr: MetricsAddr = DEFAULT_ADDR


register_section(SECTION, EvalServiceConfig)
