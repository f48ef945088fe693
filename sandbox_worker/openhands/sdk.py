"""Everything that touches the OpenHands SDK's classes: LLM, agent, and reading events.

The agent is OpenHands' standard ``Agent`` with the terminal and file-editor tools (``finish``
and ``think`` are built in), talking to the adapter through LiteLLM's OpenAI provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sandbox_worker.openhands.env import prepare_sdk_environment

prepare_sdk_environment()

from openhands.sdk import LLM, Agent, LLMSummarizingCondenser, Tool  # noqa: E402
from openhands.sdk.event import (  # noqa: E402
    ActionEvent,
    AgentErrorEvent,
    Condensation,
    MessageEvent,
)
from openhands.sdk.event.conversation_error import ConversationErrorEvent  # noqa: E402
from openhands.tools.file_editor import FileEditorTool  # noqa: E402
from openhands.tools.terminal import TerminalTool  # noqa: E402
from pydantic import SecretStr  # noqa: E402

from sandbox_worker.openhands.config import OpenHandsConfig  # noqa: E402
from sandbox_worker.openhands.result import ConversationError, EventSummary  # noqa: E402
from services.protocol.tasks import AgentLimits, SamplingConfig  # noqa: E402

FINISH_TOOL = "finish"
TOOL_NAMES = (TerminalTool.name, FileEditorTool.name)

# Without these the SDK treats an unknown model name as a reasoning model: it sends
# ``reasoning_effort`` and silently drops temperature / top_p / top_k (captured in
# tests/data/openhands_requests/no_overrides_00.json).
CAPABILITY_OVERRIDES: dict[str, bool | str] = {
    "supports_reasoning_effort": False,
    "supports_sampling_params": True,
}


def validate_base_url(base_url: str) -> str:
    """The adapter's per-trajectory OpenAI base URL, ``http://host:port/t/<id>/v1``."""
    if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
        raise ValueError(f"llm_base_url must be an http(s) URL, got {base_url!r}")
    if not base_url.rstrip("/").endswith("/v1"):
        raise ValueError(f"llm_base_url must end with /v1 (the OpenAI API root), got {base_url!r}")
    return base_url.rstrip("/")


def build_llm(
    base_url: str,
    sampling: SamplingConfig,
    limits: AgentLimits,
    cfg: OpenHandsConfig,
    usage_id: str = "agent",
) -> LLM:
    """The SDK LLM for one trajectory: the task's sampling parameters, the adapter's URL."""
    return LLM(
        model=cfg.model,
        base_url=validate_base_url(base_url),
        api_key=SecretStr(cfg.api_key),
        usage_id=usage_id,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=None if sampling.top_k < 0 else float(sampling.top_k),
        max_output_tokens=sampling.max_tokens,
        max_input_tokens=limits.max_context_tokens,
        timeout=int(cfg.llm_timeout_s),
        num_retries=cfg.num_retries,
        retry_min_wait=cfg.retry_min_wait_s,
        retry_max_wait=cfg.retry_max_wait_s,
        capability_overrides=dict(CAPABILITY_OVERRIDES),
        # Self-hosted policy: no per-token price (and no lookup of an unknown model's price).
        input_cost_per_token=0.0,
        output_cost_per_token=0.0,
        native_tool_calling=True,
        stream=False,
        log_completions=False,
    )


def untracked_url(base_url: str) -> str:
    """The adapter's untracked ``/v1`` for a per-trajectory ``.../t/<id>/v1`` URL."""
    head, sep, _ = validate_base_url(base_url).rpartition("/t/")
    if not sep:
        raise ValueError(f"{base_url!r} is not a per-trajectory URL (.../t/<id>/v1)")
    return f"{head}/v1"


def build_agent(
    base_url: str,
    sampling: SamplingConfig,
    limits: AgentLimits,
    cfg: OpenHandsConfig,
    terminal_env: dict[str, str] | None = None,
) -> Agent:
    """OpenHands' Agent with the terminal and file-editor tools (+ built-in finish and think).

    ``terminal_env`` is added to the agent's shell environment (on the machine the tools run).
    """
    llm = build_llm(base_url, sampling, limits, cfg)
    terminal_params: dict[str, Any] = {}
    if cfg.terminal != "auto":
        terminal_params["terminal_type"] = cfg.terminal
    if terminal_env:
        terminal_params["env"] = dict(terminal_env)
    condenser = None
    if cfg.condenser.enabled:
        summary_url = base_url if cfg.condenser.tracked else untracked_url(base_url)
        condenser = LLMSummarizingCondenser(
            llm=build_llm(summary_url, sampling, limits, cfg, usage_id="condenser"),
            max_size=cfg.condenser.max_size,
            keep_first=cfg.condenser.keep_first,
            max_tokens=cfg.condenser.max_tokens,
        )
    return Agent(
        llm=llm,
        tools=[
            Tool(name=TerminalTool.name, params=terminal_params),
            Tool(name=FileEditorTool.name),
        ],
        condenser=condenser,
    )


def _text_of(event: MessageEvent) -> str:
    parts = [getattr(c, "text", "") for c in event.llm_message.content]
    return "".join(p for p in parts if isinstance(p, str))


def summarize_events(events: Iterable[object]) -> EventSummary:
    """Condense a conversation's events (local or remote) into an :class:`EventSummary`."""
    response_ids: set[str] = set()
    n_tool_calls = n_agent_errors = n_condensations = 0
    tools: list[str] = []
    finish_called = False
    last_message: str | None = None
    errors: list[ConversationError] = []
    for event in events:
        if isinstance(event, ActionEvent):
            response_ids.add(event.llm_response_id)
            n_tool_calls += 1
            tools.append(event.tool_name)
            if event.tool_name == FINISH_TOOL and event.action is not None:
                finish_called = True
        elif isinstance(event, MessageEvent) and event.source == "agent":
            if event.llm_response_id is not None:
                response_ids.add(event.llm_response_id)
            last_message = _text_of(event)
        elif isinstance(event, AgentErrorEvent):
            n_agent_errors += 1
        elif isinstance(event, Condensation):
            n_condensations += 1
        elif isinstance(event, ConversationErrorEvent):
            errors.append(ConversationError(code=event.code, detail=event.detail))
    return EventSummary(
        n_steps=len(response_ids),
        n_tool_calls=n_tool_calls,
        n_agent_errors=n_agent_errors,
        n_condensations=n_condensations,
        tools_called=tuple(tools),
        finish_called=finish_called,
        last_agent_message=last_message,
        errors=tuple(errors),
    )
