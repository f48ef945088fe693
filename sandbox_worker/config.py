"""Settings of a sandbox worker (config section ``worker``)."""

from __future__ import annotations

import re
import socket
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from sandbox_worker.backends.base import MIN_DISK_MB, MIN_INODES
from sandbox_worker.evaluation.evaluate import DEFAULT_TEST_CMD
from sandbox_worker.evaluation.infra import TestInfraRule
from sandbox_worker.evaluation.log_parser import LOG_PARSERS
from sandbox_worker.openhands.config import OpenHandsConfig
from sandbox_worker.patch_extract import DEFAULT_MAX_PATCH_BYTES, MAX_PATCH_BYTES_LIMIT
from services.config import StrictModel, register_section
from services.metrics_server import DEFAULT_ADDR, MetricsAddr, MetricsPort
from services.protocol.tasks import TaskKind
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


class ToyToolLatencyConfig(StrictModel):
    """Simulated latency of the toy task's ``lookup`` tool (docs/toy-task.md, "Latency model").

    Off by default (``median_s`` 0: no wait). On, every trajectory waits before its second turn
    for a time drawn from a lognormal with this median and 99th percentile (``p99_s``; None:
    10 x the median, the "SWE-like" shape: median 3 s, p99 30 s), deterministic per task id and
    attempt, capped at ``max_s``. The default cap (60 s) keeps a trajectory inside the toy
    configs' ``wall_time_s`` (120 s); a wait that outlives the wall time ends as a timeout.
    """

    median_s: float = Field(0.0, ge=0.0, le=3600.0)
    p99_s: float | None = Field(None, gt=0.0, le=86_400.0)
    max_s: float = Field(60.0, gt=0.0, le=86_400.0)

    @property
    def enabled(self) -> bool:
        return self.median_s > 0.0

    @property
    def p99(self) -> float:
        """The 99th percentile in effect (10 x the median when ``p99_s`` is not set)."""
        return self.p99_s if self.p99_s is not None else 10.0 * self.median_s

    @model_validator(mode="after")
    def _p99_above_median(self) -> ToyToolLatencyConfig:
        if self.enabled and self.p99 < self.median_s:
            raise ValueError(
                f"toy_tool_latency.p99_s ({self.p99:g}) must be >= median_s ({self.median_s:g})"
            )
        return self


class SandboxLimitsConfig(StrictModel):
    """CPU, memory, pids, disk and inode limits of one sandbox (``SandboxLimits`` in config
    form). ``disk_mb`` / ``inodes`` bound what the sandbox holds in its writable places
    (/testbed with the image's checkout, /tmp, the control dir) on a tmpfs: those bytes also
    count against ``memory_mb`` (docs/sandboxes.md, "Disk quota")."""

    cpus: float = Field(1.0, gt=0.0, le=256.0)
    memory_mb: int = Field(4096, ge=16)
    pids: int = Field(512, ge=8)
    disk_mb: int = Field(2048, ge=MIN_DISK_MB)
    inodes: int = Field(100_000, ge=MIN_INODES)


class BackendSettings(StrictModel):
    """Host-side settings of the sandbox backend (``None``: the backend's own default).

    ``state_root`` holds per-sandbox directories (unix sockets live there: keep the path
    short); ``docker_host`` is the docker endpoint (default ``$DOCKER_HOST`` or the private dev
    engine); ``rootfs_cache`` and ``cgroups`` only apply to bwrap.
    """

    state_root: str | None = Field(None, pattern=r"^/")
    docker_host: str | None = Field(None, pattern=r"^(unix|tcp|ssh|npipe)://")
    rootfs_cache: str | None = Field(None, pattern=r"^/")
    cgroups: Literal["auto", "required", "off"] = "auto"


class EvaluationSettings(StrictModel):
    """The reward evaluation (``sandbox_worker.evaluation.EvalConfig``) as the worker runs it."""

    test_timeout_s: int = Field(1800, ge=1)  # the SWE-bench harness's default
    # Per-repository test timeouts ("owner/name" -> seconds) over test_timeout_s.
    test_timeout_by_repo: dict[str, int] = Field(default_factory=dict)
    step_timeout_s: float = Field(120.0, gt=0.0)
    harness_grace_s: float = Field(60.0, gt=0.0)
    limits: SandboxLimitsConfig = Field(default_factory=SandboxLimitsConfig)
    # Reward grading (docs/tasks-and-rewards.md): "structured" needs the structured report and
    # the official log parser to agree; "swebench" is the official parser alone; "auto" (the
    # default): structured where swerl's script runs, swebench where the harness's does.
    grading: Literal["auto", "structured", "swebench"] = "auto"
    restore_test_infra: bool = True
    # Per-repository test-infrastructure rules ("owner/name" or "*" -> TestInfraRule fields).
    infra_rules: dict[str, TestInfraRule] = Field(default_factory=dict)
    # The eval script: "auto" (the default: per row, sandbox_worker/evaluation/row_grading.py:
    # the harness's script for rows with an eval_script, SWE-smith rows and repositories the
    # harness specifies; swerl's for rows with a test_cmd and every other repository),
    # "swerl" (swerl's: test_cmd + the row's test files) or "harness" (the official harness's
    # script for the row: its eval_script, else the harness's spec for its repository and
    # version; needs grading "swebench" or "auto"). A choice that cannot grade a row right
    # (swerl's pytest script on django ...) fails that task at once, not retried.
    eval_script: Literal["auto", "swerl", "harness"] = "auto"
    # "auto" (the parser of the script the row gets), "pytest" (swerl's) or a harness parser.
    log_parser: str = Field("auto", pattern=r"^(?:pytest|auto|parse_log_[a-z0-9_]+)$")
    # swerl's test command (before the test files) for rows without their own test_cmd.
    test_cmd: str = Field(DEFAULT_TEST_CMD, min_length=1)
    # Canaries planted per run (structured grading; docs/security.md).
    canary_count: int = Field(3, ge=1, le=20)
    # .git moved out of the repository while the tests run (off for a repository whose tests
    # read git at run time, e.g. a version from setuptools_scm computed during the tests).
    hide_git: bool = True

    @model_validator(mode="after")
    def _harness_grades_by_its_parser(self) -> EvaluationSettings:
        if self.eval_script == "harness" and self.grading == "structured":
            raise ValueError(
                'evaluation.eval_script "harness" needs evaluation.grading "swebench" or "auto" '
                "(the harness's script loads no structured-report plugin)"
            )
        if self.log_parser != "auto" and self.log_parser not in LOG_PARSERS:
            known = ", ".join(["auto", *sorted(LOG_PARSERS)])
            raise ValueError(f"evaluation.log_parser {self.log_parser!r}: one of {known}")
        return self


class TrajectoryRunnerConfig(StrictModel):
    """The real trajectory runner (``--backend docker|bwrap``): adapter, tasks, sandboxes.

    ``adapter_url`` is the LLM adapter as the *worker host* reaches it (scheme, host, port; no
    path): the host side of the LLM relay connects there, and the runner opens and closes
    trajectories there. ``instances`` lists SWE-bench-format files (JSONL/JSON/parquet) holding
    every instance a task may name; empty means the mini task set ``tests/data/instances.jsonl``.
    ``adapter_token`` is the adapter's ``worker_token`` (required when the adapter runs in
    training mode); it stays in the worker: sandboxes get only their trajectory's relay.
    """

    adapter_url: str = "http://127.0.0.1:8100"
    adapter_token: str | None = Field(None, min_length=16)
    instances: list[str] = Field(default_factory=list)
    # Image naming (sandbox_worker.images.instance_image); None: $SWERL_IMAGE_NAMESPACE or swerl.
    image_namespace: str | None = None
    image_tag: str = Field("latest", pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
    # Published images of a dataset instead (sandbox_worker.image_pull.image_name): "swebench"
    # (the harness's names), "swegym", "swesmith" (the row's image_name or its snapshot's).
    # SWE-smith rows (repo "swesmith/...") always get SWE-smith's images once this is set.
    image_dataset: Literal["swebench", "swegym", "swesmith"] | None = None
    # Namespaced task sets (sandbox_worker/task_sets.py): "<dataset>/<instance_id>" keys of a
    # training mixture. datasets: the mixture's "[name=]path[:weight],..." (weights ignored);
    # task_sets_dir: every <name>.jsonl there (None: $SWERL_CACHE/tasksets, where
    # `images add` writes); dataset_images: dataset name -> image rule (default "local":
    # swerl/<dataset>/..., or "swebench" / "swegym" / "swesmith": the published images).
    datasets: str = ""
    task_sets_dir: str | None = Field(None, pattern=r"^/")
    dataset_images: dict[str, Literal["local", "swebench", "swegym", "swesmith"]] = Field(
        default_factory=dict
    )
    workdir: str = Field("/testbed", pattern=r"^/[A-Za-z0-9._\-/]+$")
    sandbox: SandboxLimitsConfig = Field(default_factory=SandboxLimitsConfig)
    backend: BackendSettings = Field(default_factory=BackendSettings)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    openhands: OpenHandsConfig = Field(default_factory=OpenHandsConfig)
    relay_port: int = Field(18080, ge=1, le=65535)  # the adapter's port inside the sandbox
    agent_server_startup_s: float = Field(300.0, gt=0.0)  # SDK imports: ~15 CPU-seconds
    adapter_timeout_s: float = Field(30.0, gt=0.0)  # open / close calls
    adapter_attempts: int = Field(3, ge=1, le=20)  # tries of each open / close call
    # The toy runner's chat completions (kind "toy"): longest one call may take.
    toy_call_timeout_s: float = Field(120.0, gt=0.0)
    # The toy task's simulated tool latency (off by default; ToyToolLatencyConfig).
    toy_tool_latency: ToyToolLatencyConfig = Field(default_factory=ToyToolLatencyConfig)
    # The longest agent patch graded (bytes): a longer one is reward 0 with the reason
    # patch_too_large (never truncated, never a failure at close). At most 4 MiB, so that its
    # JSON in the close body stays under the adapter's close limit (adapter.max_close_body_bytes).
    max_patch_bytes: int = Field(DEFAULT_MAX_PATCH_BYTES, ge=1024, le=MAX_PATCH_BYTES_LIMIT)

    @field_validator("adapter_url")
    @classmethod
    def _plain_http_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"adapter_url must be http(s)://HOST:PORT, got {value!r}")
        try:
            parts.port  # noqa: B018 -- raises ValueError for a bad port
        except ValueError as exc:
            raise ValueError(f"adapter_url has an invalid port: {value!r}") from exc
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(
                f"adapter_url must have no path (the runner appends /t/<id>/v1), got {value!r}"
            )
        return value.rstrip("/")

    @model_validator(mode="after")
    def _condenser_stays_on_the_trajectory(self) -> TrajectoryRunnerConfig:
        condenser = self.openhands.condenser
        if condenser.enabled and not condenser.tracked:
            raise ValueError(
                "openhands.condenser.tracked must be true for sandboxed runs: the relay lets a "
                "sandbox reach only its own trajectory's /t/<id>/v1, not the untracked /v1"
            )
        return self


class WorkerConfig(StrictModel):
    redis_url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^(redis|rediss|unix)://")
    node: str = Field(default_factory=default_node_name, pattern=NODE_PATTERN)
    slots: int = Field(1, ge=1, le=256)
    backend: Literal["docker", "bwrap", "simulated"] = "docker"
    # Task kinds this worker runs (docker/bwrap backends): "swe" needs the sandbox backend and
    # the OpenHands bundle, "toy" only the adapter. A task of another kind is aborted, final.
    # The simulated backend runs every kind (it only sleeps).
    kinds: list[TaskKind] = Field(default_factory=lambda: ["swe", "toy"], min_length=1)
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
    # Prometheus endpoint (sandbox_worker/metrics.py): None serves none.
    metrics_port: MetricsPort = None
    metrics_addr: MetricsAddr = DEFAULT_ADDR
    queue: QueueConfig = Field(default_factory=QueueConfig)
    simulated: SimulatedRunnerConfig = Field(default_factory=SimulatedRunnerConfig)
    # The real runner (backends docker and bwrap); ignored by the simulated one.
    rollout: TrajectoryRunnerConfig = Field(default_factory=TrajectoryRunnerConfig)

    @field_validator("kinds")
    @classmethod
    def _distinct_kinds(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"kinds must be distinct, got {value}")
        return value

    @model_validator(mode="after")
    def _heartbeat_inside_ttl(self) -> WorkerConfig:
        if self.heartbeat_interval_s * 2 > self.queue.heartbeat_ttl_s:
            raise ValueError(
                f"heartbeat_interval_s ({self.heartbeat_interval_s:g}) must be at most half of "
                f"queue.heartbeat_ttl_s ({self.queue.heartbeat_ttl_s:g}), or a live worker "
                "looks dead between two heartbeats"
            )
        return self


register_section("worker", WorkerConfig)
