"""Settings of the adapter (section ``adapter`` of the swerl configuration).

Loaded once at start-up with :func:`services.config.load_config`; command-line flags of
``python -m adapter`` override the YAML file and ``SWERL_ADAPTER__*`` environment variables.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationInfo, field_validator, model_validator

from adapter.auth import UntrackedPolicy
from services.config import StrictModel, register_section


class ToolParserName(StrEnum):
    AUTO = "auto"  # pick from the chat template (Qwen3-Coder XML if it renders `<function=`)
    HERMES = "hermes"  # Hermes / Qwen JSON: <tool_call>{"name", "arguments"}</tool_call>
    QWEN3_CODER = "qwen3_coder"  # <tool_call><function=NAME><parameter=K>V</parameter>...


class Placement(StrEnum):
    """How the router chooses the first engine of a new trajectory (adapter.routing)."""

    LEAST_BUSY = "least_busy"
    SAMPLE_INDEX = "sample_index"


class RefreshMode(StrEnum):
    """How a weight refresh treats generation in flight (adapter.weights, docs/weights.md)."""

    STEP = "step"  # close the gate, drain the agent steps in flight, load, reopen
    TOKEN = "token"  # pause the engines (abort mode), load, continue the interrupted requests


class UpstreamConfig(StrictModel):
    """Relay mode: an OpenAI-compatible endpoint answers instead of SGLang engines."""

    url: str = Field(
        min_length=1,
        description="base URL of the endpoint, up to /v1 (POST {url}/chat/completions)",
    )
    model: str = Field(min_length=1, description="the model name the endpoint is asked for")
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="environment variable holding the endpoint's API key (never the key itself)",
    )
    timeout_s: float = Field(default=600.0, gt=0, description="one completion's time limit")
    max_connections: int = Field(default=64, ge=1)

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        url = value.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"upstream URL must start with http:// or https://, got {url!r}")
        return url


class AdapterConfig(StrictModel):
    """Everything the adapter needs; see docs/adapter.md for what each key does."""

    # upstream first: the engines' and the model's validators read it (info.data)
    upstream: UpstreamConfig | None = Field(
        default=None,
        description="relay mode: answer from this OpenAI-compatible endpoint and record text "
        "turns (no tokens; such records are not trainable)",
    )
    engines: list[str] = Field(
        description="base URLs of the SGLang(-protocol) engines (none in relay mode)"
    )
    model: str = Field(
        description="model directory (tokenizer + chat template; none in relay mode)"
    )
    redis_url: str = Field(default="redis://127.0.0.1:6379/0")
    key_prefix: str = Field(default="swerl:", min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(default=8100, ge=1, le=65535)
    admin_token: str | None = Field(default=None, description="bearer token of /admin routes")
    worker_token: str | None = Field(
        default=None,
        min_length=16,
        description="bearer token of the sandbox workers: open / close / read trajectory "
        "records; setting it turns on training mode (per-trajectory tokens on /t/<id>/)",
    )
    untracked_completions: UntrackedPolicy = Field(
        default=UntrackedPolicy.OPEN,
        description="who may call /v1/chat/completions: open | worker_token | off "
        "(default: worker_token in training mode, else open)",
    )
    served_model_name: str | None = Field(
        default=None, description="model id in /v1/models and responses (default: dir name)"
    )
    auto_open_trajectories: bool = Field(
        default=True,
        description="a request to /t/{id}/v1 for an unknown id opens it (default: on, off in "
        "training mode, where it is not allowed)",
    )
    context_length: int | None = Field(
        default=None, ge=16, description="context window (default: the model's config)"
    )
    default_max_tokens: int = Field(default=1024, ge=1)
    tool_parser: ToolParserName = ToolParserName.AUTO
    end_of_turn: str | None = Field(
        default=None, description="text closing an assistant turn (default: tokenizer eos)"
    )
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    engine_timeout_s: float = Field(default=900.0, gt=0)
    engine_attempts: int = Field(default=3, ge=1, description="engines tried per request")
    placement: Placement = Field(
        default=Placement.LEAST_BUSY,
        description="where a new trajectory starts: least_busy (fewest calls in flight) | "
        "sample_index (sample k of every group on engine k mod n, in --engines order, whatever "
        "the load: deterministic, e.g. for the demo's scripted and sampling engines)",
    )
    engine_outage_wait_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="when every engine is out of rotation, how long a call waits for one to be "
        "re-admitted before it fails (0: fail at once)",
    )
    engine_connect_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="longest TCP connect to an engine (a refused connection fails at once)",
    )
    engine_max_connections: int = Field(
        default=256,
        ge=1,
        le=65536,
        description="connections to each engine; further calls wait for one (engine_timeout_s)",
    )
    probe_interval_s: float = Field(default=2.0, gt=0)
    refresh_drain_timeout_s: float = Field(
        default=900.0, gt=0, description="longest wait for in-flight steps during a refresh"
    )
    refresh_mode: RefreshMode = Field(
        default=RefreshMode.STEP,
        description="step: drain in-flight agent steps before loading; token: interrupt them, "
        "load, and continue each from its prefix under the new weights",
    )
    check_model_path: bool = Field(
        default=True,
        description="check a refresh's model_path on the adapter's filesystem before draining "
        "(off only where the engines read a filesystem the adapter does not see)",
    )
    initial_weight_version: int = Field(
        default=0, ge=0, description="version of engines whose weight_version is not a number"
    )
    trajectory_idle_ttl_s: float = Field(
        default=7200.0, gt=0, description="in-memory state of an idle trajectory is dropped"
    )
    redis_max_connections: int = Field(
        default=128,
        ge=1,
        le=65536,
        description="size of the Redis connection pool; calls beyond it wait for a connection",
    )
    redis_pool_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=3600,
        description="longest wait for a free Redis connection before a 503 store_unavailable",
    )
    tokenizer_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description="threads that render and tokenise prompts (off the event loop)",
    )
    tokenizer_processes: int = Field(
        default=1,
        ge=0,
        le=64,
        description="processes that tokenise long texts (0: long texts are tokenised in the "
        "threads too, and a huge prompt can stall the event loop while its result is freed)",
    )
    max_bytes_per_token: float | None = Field(
        default=None,
        gt=0,
        description="prompt bytes per token above which a prompt is too long without "
        "tokenising it (default: the longest token of the vocabulary, never a false reject)",
    )
    max_body_bytes: int | None = Field(
        default=None,
        ge=4096,
        description="largest request body (413 above); default: 4 x context window in bytes "
        "+ 1 MiB",
    )
    max_close_body_bytes: int = Field(
        default=64 << 20,
        ge=4096,
        description="largest body of a trajectory close (413 above; never below "
        "max_body_bytes): it carries the outcome with the agent's patch, which the worker caps "
        "(worker.rollout.max_patch_bytes, at most 4 MiB: 24 MiB once JSON-escaped), and the "
        "test report, whatever the context window",
    )
    log_level: str = "info"

    @model_validator(mode="before")
    @classmethod
    def _training_mode_defaults(cls, data: Any) -> Any:
        """Unset keys whose default depends on training mode (a worker token is set)."""
        if not isinstance(data, dict):
            return data
        training = data.get("worker_token") is not None
        defaults = {
            "auto_open_trajectories": not training,
            "untracked_completions": UntrackedPolicy.WORKER_TOKEN if training else "open",
        }
        return {
            **{k: v for k, v in defaults.items() if data.get(k) is None},
            **{k: v for k, v in data.items() if not (k in defaults and v is None)},
        }

    @model_validator(mode="before")
    @classmethod
    def _relay_mode_defaults(cls, data: Any) -> Any:
        """Relay mode has no engines and no model directory: they default to none there."""
        if isinstance(data, dict) and data.get("upstream") is not None:
            return {"engines": [], "model": "", **data}
        return data

    @property
    def relay(self) -> bool:
        return self.upstream is not None

    @model_validator(mode="after")
    def _check_credentials(self) -> AdapterConfig:
        if self.worker_token is not None:
            if self.worker_token == self.admin_token:
                raise ValueError("worker_token and admin_token must differ (separate roles)")
            if self.auto_open_trajectories:
                raise ValueError(
                    "auto_open_trajectories cannot be on with a worker_token: a record opened "
                    "by its first call has no trajectory token, so anyone could write it"
                )
        elif self.untracked_completions is UntrackedPolicy.WORKER_TOKEN:
            raise ValueError("untracked_completions: worker_token needs adapter.worker_token")
        return self

    @field_validator("engines")
    @classmethod
    def _check_engines(cls, value: list[str], info: ValidationInfo) -> list[str]:
        relay = info.data.get("upstream") is not None
        if relay and value:
            raise ValueError("engines and upstream exclude each other (relay mode has none)")
        if not relay and not value:
            raise ValueError("at least one engine URL (or upstream for relay mode)")
        cleaned = [u.strip().rstrip("/") for u in value]
        for url in cleaned:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"engine URL must start with http:// or https://, got {url!r}")
        if len(set(cleaned)) != len(cleaned):
            raise ValueError("engine URLs must be distinct")
        return cleaned

    @field_validator("model")
    @classmethod
    def _check_model(cls, value: str, info: ValidationInfo) -> str:
        if not value and info.data.get("upstream") is None:
            raise ValueError("the model directory is required (or upstream for relay mode)")
        return value

    @field_validator("redis_url")
    @classmethod
    def _check_redis(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"redis_url must start with redis://, rediss:// or unix://: {value!r}")
        return value


register_section("adapter", AdapterConfig)
