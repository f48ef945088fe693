"""End-reason classification and its meaning for the outcome (pure, no SDK)."""

from __future__ import annotations

import pytest

from sandbox_worker.openhands.result import (
    ConversationError,
    EndReason,
    EventSummary,
    StopCause,
    classify,
)
from services.protocol.trajectory import OutcomeStatus

FINISHED = EventSummary(n_steps=3, finish_called=True)
MESSAGE_ONLY = EventSummary(n_steps=1, last_agent_message="hello")


def err(code: str, detail: str = "boom") -> EventSummary:
    return EventSummary(n_steps=2, errors=(ConversationError(code, detail),))


def test_agent_ends_by_itself() -> None:
    assert classify("finished", FINISHED) == (EndReason.FINISHED, None)
    assert classify("finished", MESSAGE_ONLY) == (EndReason.AGENT_MESSAGE, None)


@pytest.mark.parametrize(
    ("code", "detail", "expected"),
    [
        ("MaxIterationsReached", "Agent reached maximum iterations limit (2).", "max_steps"),
        ("LLMServiceUnavailableError", "Connection error.", "llm_unavailable"),
        ("LLMTimeoutError", "timed out", "llm_unavailable"),
        ("LLMContextWindowExceedError", "too long", "context_limit"),
        # The adapter's 400 for an over-long prompt, as litellm reports a generic bad request.
        (
            "LLMBadRequestError",
            "the prompt is 9000 tokens but the model's context window is 8192 tokens",
            "context_limit",
        ),
        ("LLMBadRequestError", '{"code": "context_length_exceeded"}', "context_limit"),
        ("LLMBadRequestError", "unsupported n > 1", "llm_rejected"),
        ("LLMAuthenticationError", "bad key", "llm_rejected"),
        ("WebSocketConnectionError", "closed", "agent_server_error"),
        ("ValueError", "a tool crashed", "agent_error"),
    ],
)
def test_errors_are_classified_by_code(code: str, detail: str, expected: str) -> None:
    reason, why = classify("error", err(code, detail))
    assert reason == EndReason(expected)
    assert why is not None and code in why and detail in why


def test_the_last_error_decides() -> None:
    summary = EventSummary(
        errors=(
            ConversationError("ValueError", "x"),
            ConversationError("MaxIterationsReached", "y"),
        )
    )
    assert classify("error", summary)[0] is EndReason.MAX_STEPS


def test_a_run_error_without_event_counts() -> None:
    run_error = ConversationError("LLMServiceUnavailableError", "refused")
    assert classify("error", EventSummary(), run_error=run_error)[0] is EndReason.LLM_UNAVAILABLE


def test_watchdog_stop_wins_over_what_happened_while_stopping() -> None:
    # Forcing a stuck step to end makes the run fail; the cause is still the limit / cancel.
    assert classify("error", err("ValueError"), StopCause.TIMEOUT)[0] is EndReason.TIMEOUT
    assert classify("paused", FINISHED, StopCause.CANCELLED)[0] is EndReason.CANCELLED


def test_lost_agent_server() -> None:
    reason, _ = classify("running", FINISHED, StopCause.SERVER_LOST)
    assert reason is EndReason.AGENT_SERVER_ERROR
    assert classify(None, EventSummary(), server_lost=True)[0] is EndReason.AGENT_SERVER_ERROR
    run_error = ConversationError("ReadError", "connection reset")
    reason, _ = classify(None, EventSummary(), run_error=run_error, server_lost=True)
    assert reason is EndReason.AGENT_SERVER_ERROR


def test_unexpected_status_is_an_agent_error_that_names_it() -> None:
    reason, why = classify("paused", EventSummary())
    assert reason is EndReason.AGENT_ERROR and why is not None and "paused" in why
    assert classify("stuck", EventSummary())[0] is EndReason.STUCK


@pytest.mark.parametrize(
    ("reason", "status", "infra"),
    [
        ("finished", "completed", False),
        ("agent_message", "completed", False),
        ("max_steps", "timeout", False),
        ("timeout", "timeout", False),
        ("context_limit", "timeout", False),
        ("agent_error", "error", False),
        ("stuck", "error", False),
        ("llm_unavailable", "aborted", True),
        ("llm_rejected", "aborted", True),
        ("agent_server_error", "aborted", True),
        ("cancelled", "aborted", True),
    ],
)
def test_outcome_of_each_end_reason(reason: str, status: str, infra: bool) -> None:
    end = EndReason(reason)
    assert end.outcome_status is OutcomeStatus(status)
    assert end.is_infrastructure is infra
    # Infrastructure failures are exactly the aborted ones: never scored, never trained on.
    assert (end.outcome_status is OutcomeStatus.ABORTED) is infra


def test_every_end_reason_is_covered() -> None:
    assert {str(r) for r in EndReason} == {
        "finished",
        "agent_message",
        "max_steps",
        "timeout",
        "context_limit",
        "stuck",
        "agent_error",
        "llm_unavailable",
        "llm_rejected",
        "agent_server_error",
        "cancelled",
    }
