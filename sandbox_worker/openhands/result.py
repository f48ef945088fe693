"""Why an agent run ended, and what that means for the trajectory's outcome.

Pure code (no SDK import): :func:`run_agent` condenses the conversation into an
:class:`EventSummary` (see :func:`sandbox_worker.openhands.sdk.summarize_events`) and
:func:`classify` decides the :class:`EndReason`. The mapping to :class:`OutcomeStatus`
(:attr:`EndReason.outcome_status`) follows the issue's outcome classes:

* the agent stopped by itself (``finish`` tool, or a reply without a tool call): ``completed``;
* a limit ended it (steps, wall time, context window): ``timeout``, scored from the patch;
* the agent broke (an error the agent caused or the SDK raised): ``error``, scored from the patch;
* the infrastructure failed (LLM endpoint unreachable or refusing, agent server lost) or the run
  was cancelled: ``aborted`` -- excluded from training, never a reward of 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from services.protocol.trajectory import OutcomeStatus


class EndReason(StrEnum):
    FINISHED = "finished"  # the agent called the finish tool
    AGENT_MESSAGE = "agent_message"  # the agent replied without a tool call (the SDK stops)
    MAX_STEPS = "max_steps"  # max_iteration_per_run reached
    TIMEOUT = "timeout"  # wall-time limit: paused by the watchdog
    CONTEXT_LIMIT = "context_limit"  # the prompt no longer fits the context window
    STUCK = "stuck"  # the SDK's stuck detector stopped it (off by default)
    AGENT_ERROR = "agent_error"  # the conversation failed for a reason on the agent side
    LLM_UNAVAILABLE = "llm_unavailable"  # the adapter could not be reached / answered 5xx
    LLM_REJECTED = "llm_rejected"  # the adapter refused a request (4xx other than context)
    AGENT_SERVER_ERROR = "agent_server_error"  # lost the agent server (remote mode)
    CANCELLED = "cancelled"  # the caller's cancel event was set

    @property
    def outcome_status(self) -> OutcomeStatus:
        """The trajectory's status for this ending (the one table: :data:`_STATUS_OF_END`)."""
        return _STATUS_OF_END[self]

    @property
    def is_infrastructure(self) -> bool:
        """True when the trajectory says nothing about the policy (it must not be trained on)."""
        return self.outcome_status is OutcomeStatus.ABORTED


_STATUS_OF_END: dict[EndReason, OutcomeStatus] = {
    EndReason.FINISHED: OutcomeStatus.COMPLETED,
    EndReason.AGENT_MESSAGE: OutcomeStatus.COMPLETED,
    EndReason.MAX_STEPS: OutcomeStatus.TIMEOUT,
    EndReason.TIMEOUT: OutcomeStatus.TIMEOUT,
    EndReason.CONTEXT_LIMIT: OutcomeStatus.TIMEOUT,
    EndReason.AGENT_ERROR: OutcomeStatus.ERROR,
    EndReason.STUCK: OutcomeStatus.ERROR,
    EndReason.LLM_UNAVAILABLE: OutcomeStatus.ABORTED,
    EndReason.LLM_REJECTED: OutcomeStatus.ABORTED,
    EndReason.AGENT_SERVER_ERROR: OutcomeStatus.ABORTED,
    EndReason.CANCELLED: OutcomeStatus.ABORTED,
}


class StopCause(StrEnum):
    """Why the conversation's watchdog stopped it (None when it did not)."""

    TIMEOUT = "timeout"
    CANCELLED = "cancelled"
    SERVER_LOST = "server_lost"  # remote mode: the agent server process is gone


@dataclass(frozen=True)
class ConversationError:
    """An SDK ``ConversationErrorEvent``: ``code`` is usually an exception class name."""

    code: str
    detail: str


@dataclass(frozen=True)
class EventSummary:
    """What :func:`run_agent` needs from a conversation's events."""

    n_steps: int = 0  # LLM responses (agent steps)
    n_tool_calls: int = 0  # actions the agent asked for (executed or not)
    n_agent_errors: int = 0  # tool calls the SDK rejected (bad arguments, unknown tool)
    n_condensations: int = 0
    tools_called: tuple[str, ...] = ()  # tool names in call order
    finish_called: bool = False
    last_agent_message: str | None = None
    errors: tuple[ConversationError, ...] = ()  # in order; the last one decides


@dataclass(frozen=True)
class AgentRunResult:
    end_reason: EndReason
    n_steps: int
    duration_s: float
    error: str | None = None  # human-readable cause for every reason but finished/agent_message
    status: str | None = None  # the SDK's final execution status
    summary: EventSummary = field(default_factory=EventSummary)

    @property
    def is_infrastructure(self) -> bool:
        return self.end_reason.is_infrastructure

    @property
    def outcome_status(self) -> OutcomeStatus:
        return self.end_reason.outcome_status


# Codes of ConversationErrorEvents (SDK exception class names) that mean the LLM endpoint is
# down or unreachable: LiteLLM connection errors, 5xx and timeouts are mapped to these.
_UNAVAILABLE_CODES = frozenset(
    {
        "LLMServiceUnavailableError",
        "LLMTimeoutError",
        "LLMRateLimitError",
        "LLMNoResponseError",
        "APIConnectionError",
        "ServiceUnavailableError",
        "InternalServerError",
        "Timeout",
    }
)
_REJECTED_CODES = frozenset(
    {"LLMBadRequestError", "LLMAuthenticationError", "BadRequestError", "NotFoundError"}
)
_CONTEXT_CODES = frozenset({"LLMContextWindowExceedError", "ContextWindowExceededError"})
# Phrases of an over-long prompt: the adapter's 400 (code context_length_exceeded) and the
# usual provider wordings.
_CONTEXT_PHRASES = ("context_length_exceeded", "context window", "context length")
_SERVER_LOST_CODES = frozenset({"WebSocketConnectionError", "ConnectError", "RemoteProtocolError"})


def _classify_error(err: ConversationError) -> EndReason:
    if err.code == "MaxIterationsReached":
        return EndReason.MAX_STEPS
    detail = err.detail.lower()
    if err.code in _CONTEXT_CODES or (
        err.code in _REJECTED_CODES and any(p in detail for p in _CONTEXT_PHRASES)
    ):
        return EndReason.CONTEXT_LIMIT
    if err.code in _UNAVAILABLE_CODES:
        return EndReason.LLM_UNAVAILABLE
    if err.code in _REJECTED_CODES:
        return EndReason.LLM_REJECTED
    if err.code in _SERVER_LOST_CODES:
        return EndReason.AGENT_SERVER_ERROR
    return EndReason.AGENT_ERROR


def classify(
    status: str | None,
    summary: EventSummary,
    stop_cause: StopCause | None = None,
    run_error: ConversationError | None = None,
    server_lost: bool = False,
) -> tuple[EndReason, str | None]:
    """The end reason of a run and its explanation.

    ``status`` is the SDK's final execution status (``finished``, ``error``, ``paused``...),
    ``run_error`` an error raised by ``run()`` that has no event (e.g. the agent server's
    connection dropped), ``server_lost`` says the agent server is gone (remote mode). A stop by
    the watchdog wins: once the wall time is up or the run is cancelled, whatever the
    conversation did while being stopped is a consequence of that.
    """
    if stop_cause is StopCause.CANCELLED:
        return EndReason.CANCELLED, "the run was cancelled"
    if stop_cause is StopCause.TIMEOUT:
        return EndReason.TIMEOUT, "wall-time limit reached"
    if stop_cause is StopCause.SERVER_LOST:
        return EndReason.AGENT_SERVER_ERROR, "the agent server stopped during the run"
    errors = list(summary.errors)
    if run_error is not None and run_error not in errors:
        errors.append(run_error)
    if errors and status != "finished":
        last = errors[-1]
        reason = _classify_error(last)
        if server_lost and reason is EndReason.AGENT_ERROR:
            reason = EndReason.AGENT_SERVER_ERROR
        return reason, f"{last.code}: {last.detail}"
    if server_lost:
        return EndReason.AGENT_SERVER_ERROR, "the agent server stopped"
    if status == "finished":
        if summary.finish_called:
            return EndReason.FINISHED, None
        return EndReason.AGENT_MESSAGE, None
    if status == "stuck":
        return EndReason.STUCK, "the SDK's stuck detector stopped the agent"
    return EndReason.AGENT_ERROR, f"the conversation ended in status {status!r} without an error"
