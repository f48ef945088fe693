"""How a trajectory run becomes an :class:`Outcome` (pure code; see docs/tasks-and-rewards.md).

The agent's end decides the *status*, the evaluation of the patch decides the *reward*:

=========================================  ===============  ===================================
agent run ended with (:class:`EndReason`)  status           reward
=========================================  ===============  ===================================
``finished`` / ``agent_message``           ``completed``    tests on the patch (0 or 1)
``max_steps`` / ``timeout`` /              ``timeout``      tests on whatever patch exists
``context_limit``
``agent_error`` / ``stuck``                ``error``        tests on whatever patch exists
``llm_unavailable`` / ``llm_rejected`` /   ``aborted``      none: infrastructure, excluded
``agent_server_error``                                      from training, never a 0
``cancelled``                              ``aborted``      none (reason: the cancel's reason)
=========================================  ===============  ===================================

An ``agent_server_error`` after the policy's first tool call, in a sandbox that still answers,
is graded as ``agent_error`` (the trajectory runner re-attributes it: the policy's shell can
kill its own server, and an excluded abort would reward doing so).

Any infrastructure failure around the agent (sandbox not created, image missing, wrong image,
sandbox lost, evaluation infrastructure failed, the adapter unreachable or having recorded an
abort itself) is ``aborted`` with its reason, whatever the agent did.

The table above is :attr:`EndReason.outcome_status` (the one place it is encoded).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sandbox_worker.openhands.result import EndReason
from services.protocol.trajectory import Outcome, OutcomeStatus

MAX_REASON_CHARS = 2000


def abort_reason_of_end(
    end_reason: EndReason, error: str | None, cancel_reason: str | None = None
) -> str:
    """The ``abort_reason`` of an aborted agent ending (``cancelled``: the cancel's reason)."""
    if end_reason is EndReason.CANCELLED:
        return cancel_reason or "cancelled"
    return f"{end_reason.value}: {error or 'no detail'}"


def aborted(
    reason: str,
    *,
    patch: str = "",
    test_report: Mapping[str, Any] | None = None,
    durations: Mapping[str, float] | None = None,
    n_turns: int = 0,
    n_tokens: int = 0,
    retryable: bool = True,
) -> Outcome:
    """An infrastructure failure or a cancel: excluded from training, no reward.
    ``retryable=False``: a configuration error no other attempt can fix (final at once)."""
    return Outcome(
        status=OutcomeStatus.ABORTED,
        reward=None,
        abort_reason=(reason or "aborted")[:MAX_REASON_CHARS],
        patch=patch,
        test_report=dict(test_report or {}),
        n_turns=n_turns,
        n_tokens=n_tokens,
        durations=dict(durations or {}),
        retryable=retryable,
    )


def graded(
    status: OutcomeStatus,
    reward: float,
    *,
    patch: str,
    test_report: Mapping[str, Any],
    durations: Mapping[str, float],
    n_turns: int = 0,
    n_tokens: int = 0,
) -> Outcome:
    """A trajectory the policy is responsible for: ``completed``, ``timeout`` or ``error``."""
    if status is OutcomeStatus.ABORTED:
        raise ValueError("graded() is for completed, timeout and error outcomes")
    if reward not in (0.0, 1.0):
        raise ValueError(f"a SWE-bench reward is 0 or 1, got {reward!r}")
    return Outcome(
        status=status,
        reward=reward,
        patch=patch,
        test_report=dict(test_report),
        n_turns=n_turns,
        n_tokens=n_tokens,
        durations=dict(durations),
    )


def with_counts(outcome: Outcome, n_turns: int, n_tokens: int) -> Outcome:
    return outcome.model_copy(update={"n_turns": n_turns, "n_tokens": n_tokens})
