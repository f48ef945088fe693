"""Settings of the job API (config section ``api``).

Tokens come from the YAML file or the environment, e.g.
``SWERL_API__TOKENS='[{name: ci, token: s3cret, scopes: [read, submit]}]'``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from services.config import StrictModel, register_section
from services.queue.config import QueueConfig


class Scope(StrEnum):
    READ = "read"  # list and read jobs, results, logs
    SUBMIT = "submit"  # submit jobs, cancel one's own
    ADMIN = "admin"  # everything, including cancelling anyone's job


class ApiToken(StrictModel):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.@\-]+$")
    # SecretStr: never printed (--print-config, the start-up log show "**********").
    token: SecretStr = Field(min_length=8, max_length=512)
    scopes: list[Scope] = Field(min_length=1)


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
    key_prefix: str = Field("swerl:api:", pattern=r"^[A-Za-z0-9_.:\-]{1,64}$")
    max_page_size: int = Field(500, ge=1, le=10_000)
    log_lines_kept: int = Field(10_000, ge=10, le=1_000_000)
    idempotency_ttl_s: int = Field(86_400, ge=1)
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


register_section("api", ApiConfig)
