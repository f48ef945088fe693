"""Settings of the job API (config section ``api``).

Tokens come from the YAML file or the environment, e.g.
``SWERL_API__TOKENS='[{name: ci, token: s3cret, scopes: [read, submit]}]'``.

Besides who may call (tokens), the section bounds what a caller may ask for, because the
services act on a job with their own privileges: ``paths`` (the roots every path-valued job
field must resolve into, :mod:`services.api.paths`), ``max_body_bytes`` (the request body cap)
and ``quotas`` (jobs in flight per token, tasks per job). ``insecure_dev`` is the explicit
statement that an API without tokens may listen on a non-loopback address (development only).
"""

from __future__ import annotations

import ipaddress
import os
from enum import StrEnum
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from services.config import StrictModel, register_section
from services.queue.config import QueueConfig

# The machine-wide data directory of a deployment (compose's default for models, eval inputs
# and sandbox state lives below it) and the per-user cache of a development machine.
DATA_DIR = Path("/var/lib/swerl")
MIB = 1024 * 1024
# 16 MiB: the largest body a legitimate request needs is an eval-input upload (a predictions
# file: 2,294 full SWE-bench predictions of a few KiB each are ~7 MiB) or a rollout spec of
# 10,000 instance ids (~1 MiB); 16 MiB fits both with room, while 100 concurrent requests at
# the cap stay under 2 GiB of memory. A spec is never near it.
DEFAULT_MAX_BODY_BYTES = 16 * MIB


def cache_dir() -> Path:
    """``$SWERL_CACHE_DIR`` or ``~/.cache/swerl``: the set-up's models (the tiny model) live
    there, so a development machine's jobs can name them without configuring roots."""
    raw = os.environ.get("SWERL_CACHE_DIR") or Path.home() / ".cache" / "swerl"
    return Path(os.path.abspath(raw))  # relative: as the set-up scripts read it, from the cwd


class Scope(StrEnum):
    READ = "read"  # list and read jobs, results, logs
    SUBMIT = "submit"  # submit jobs, cancel one's own
    ADMIN = "admin"  # everything, including cancelling anyone's job


class ApiToken(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@\-]+$")
    # SecretStr: never printed (--print-config, the start-up log show "**********").
    token: SecretStr = Field(min_length=8, max_length=512)
    scopes: list[Scope] = Field(min_length=1)
    # This token's own quotas (None: api.quotas').
    max_jobs_in_flight: int | None = Field(None, ge=0, le=1_000_000)
    max_tasks_per_job: int | None = Field(None, ge=1, le=100_000_000)


def _default_inputs() -> tuple[str, ...]:
    return (
        str(DATA_DIR / "models"),
        str(DATA_DIR / "datasets"),
        str(DATA_DIR / "eval-inputs"),
        str(cache_dir()),
    )


def _default_outputs() -> tuple[str, ...]:
    return (str(DATA_DIR / "checkpoints"), str(cache_dir() / "runs"))


def check_root(root: str) -> str:
    """A configured root as the checks compare against: absolute, then ``os.path.realpath``
    (so a root reached through a symlink, ``/var/lib`` -> ``/data/lib``, matches the job paths
    resolved the same way). Relative roots are refused: a job path is read by the trainer or
    the evaluator, whose working directory the API does not know; ``/`` is refused: it would
    confine nothing."""
    if not root or "\x00" in root:
        raise ValueError(f"root {root!r} must be a non-empty path without NUL bytes")
    if not os.path.isabs(root):
        raise ValueError(
            f"root {root!r} is relative: give an absolute path (job paths are resolved on the "
            "trainer's and evaluator's hosts, not in the API's working directory)"
        )
    resolved = os.path.realpath(root)
    if resolved == "/":
        raise ValueError(f"root {root!r} is the whole filesystem: name the directories jobs use")
    return resolved


class PathRoots(StrictModel):
    """Where path-valued job fields may point (docs/api.md "Path roots"): a field is resolved
    (``os.path.realpath``: ``..`` and symlinks followed) and must then lie under one of its
    roots, component-wise. Shared by every feature that takes a path from a caller (job specs
    today, eval-input uploads next): :class:`services.api.paths.PathPolicy`."""

    # Read: dataset, model, predictions, checkpoint (and a train mixture's every file).
    inputs: tuple[str, ...] = Field(
        default_factory=_default_inputs, max_length=64, validate_default=True
    )
    # Written: checkpoint_dir. Also readable (an eval of a checkpoint a train job wrote).
    outputs: tuple[str, ...] = Field(
        default_factory=_default_outputs, max_length=64, validate_default=True
    )

    @field_validator("inputs", "outputs")
    @classmethod
    def _resolved(cls, roots: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(check_root(root) for root in roots))


class Quotas(StrictModel):
    """What one token may ask for (each token counts on its own; :class:`ApiToken` may set
    its own values). Counted atomically in Redis (services/api/lua.py ``SUBMIT``)."""

    # Jobs of one token not yet finished (queued, running, cancelling); over it: 429.
    # 0: no limit.
    max_jobs_in_flight: int = Field(100, ge=0, le=1_000_000)
    # Tasks of one job (rollout: instances x samples; train: trajectories per step, prompts
    # x samples; eval: the instances selected); over it: 422 naming the field.
    max_tasks_per_job: int = Field(10_000, ge=1, le=100_000_000)


class RunnerConfig(StrictModel):
    # Rollout jobs driven at once by this API process (0: this process runs none; another API
    # process, or `python -m services.api --runner-only`, must).
    concurrency: int = Field(4, ge=0, le=256)
    poll_interval_s: float = Field(0.5, gt=0.0, le=60.0)
    # A job whose runner stops heartbeating for this long is handed to another runner.
    lease_ttl_s: float = Field(30.0, gt=0.0, le=3600.0)
    # Also run the rollout manager's dispatch loop in this process (no `services.manager`).
    dispatcher: bool = False


class ApiConfig(StrictModel):
    redis_url: str = Field("redis://127.0.0.1:6379/0", pattern=r"^(redis|rediss|unix)://")
    host: str = "127.0.0.1"
    port: int = Field(8300, ge=0, le=65535)
    # No tokens: development mode, every caller is "anonymous" with every scope (a warning says
    # so at start-up). With tokens, every /v1 request needs one.
    tokens: list[ApiToken] = Field(default_factory=list)
    # Without tokens the API listens on loopback only, unless this says it is a development
    # setup (`--insecure-dev`, SWERL_API__INSECURE_DEV=true).
    insecure_dev: bool = False
    key_prefix: str = Field("swerl:api:", pattern=r"^[A-Za-z0-9_.:\-]{1,64}$")
    max_page_size: int = Field(500, ge=1, le=10_000)
    log_lines_kept: int = Field(10_000, ge=10, le=1_000_000)
    idempotency_ttl_s: int = Field(86_400, ge=1)
    # A request body over this is a 413, refused before it is read (Content-Length) or as soon
    # as the streamed bytes pass it (chunked).
    max_body_bytes: int = Field(DEFAULT_MAX_BODY_BYTES, ge=64 * 1024, le=1024 * MIB)
    paths: PathRoots = Field(default_factory=PathRoots)
    quotas: Quotas = Field(default_factory=Quotas)
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    queue: QueueConfig = Field(default_factory=QueueConfig)  # the rollout manager's queue

    @field_validator("tokens")
    @classmethod
    def _unique(cls, tokens: list[ApiToken]) -> list[ApiToken]:
        names = [t.name for t in tokens]
        if len(set(names)) != len(names):
            raise ValueError("token names must be unique")
        if len({t.token.get_secret_value() for t in tokens}) != len(tokens):
            raise ValueError("two tokens have the same secret")
        return tokens


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` keeps the API on this machine: a loopback address or
    ``localhost``. Anything else (``0.0.0.0``, ``::``, an interface, another name) is not."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def insecure_listen_problem(cfg: ApiConfig) -> str | None:
    """Why the API must not listen as configured, or None: without tokens every caller is an
    admin, so only loopback, unless ``insecure_dev`` says it is a development setup."""
    if cfg.tokens or cfg.insecure_dev or is_loopback(cfg.host):
        return None
    return (
        f"refusing to listen on {cfg.host}:{cfg.port} without api.tokens: every caller would "
        "have every scope. Configure tokens (SWERL_API__TOKENS='[{name: ci, token: <secret>, "
        'scopes: [read, submit]}]\', docs/api.md "Auth"), listen on 127.0.0.1, or, for a '
        "development setup only, pass --insecure-dev (SWERL_API__INSECURE_DEV=true)"
    )


register_section("api", ApiConfig)
