"""The worker's client of the LLM adapter's trajectory routes (open and close a record).

``POST /trajectories`` opens a record with the task's identifiers before the agent's first LLM
call and answers with the trajectory's bearer token (the runner hands it to the host side of the
sandbox's LLM relay); ``POST /trajectories/{id}/close`` closes it, optionally with the trajectory's
:class:`Outcome`, and answers with the outcome the adapter *kept* (an infrastructure abort the
adapter recorded itself, e.g. no engine could serve a call, is never overwritten by a score)
and the record's counters. Every call carries the worker token (``adapter.worker_token`` at the
adapter, ``rollout.adapter_token`` here) when one is configured. See docs/adapter.md.

Transport failures and 502/503/504 answers are retried ``attempts`` times with a short backoff;
what remains is an :class:`AdapterUnavailableError`, which the runner reports as an
infrastructure failure (``aborted``), never as a reward.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import httpx
from pydantic import ValidationError

from services.protocol.trajectory import Outcome, TrajectoryMeta

_log = logging.getLogger("swerl.worker.adapter")

_RETRY_STATUSES = frozenset({502, 503, 504})


class AdapterError(RuntimeError):
    """The adapter refused a request (the message carries its error)."""


class AdapterUnavailableError(AdapterError):
    """The adapter could not be reached, or answered 5xx, on every attempt."""


class TrajectoryExistsError(AdapterError):
    """``open`` of an id that already has a record (a previous run of the same attempt)."""


class OpenReplyLostError(AdapterError):
    """``open`` created the record but its answer (with the trajectory token) was lost: the
    record is ours, yet its token cannot be recovered (only a digest is stored)."""


@dataclass(frozen=True)
class CloseResult:
    """What the adapter kept when closing: the stored outcome and the record's counters."""

    outcome: Outcome | None
    counters: dict[str, int] = field(default_factory=dict)

    @property
    def n_turns(self) -> int:
        return self.counters.get("turns", 0)

    @property
    def n_tokens(self) -> int:
        """Every token of the record: segment prompts, observations and generated tokens."""
        c = self.counters
        return (
            c.get("prompt_tokens", 0)
            + c.get("observation_tokens", 0)
            + c.get("generated_tokens", 0)
        )


@runtime_checkable
class TrajectoryRecords(Protocol):
    """What the trajectory runner needs of the adapter: open and close one record, release the
    connection. :class:`AdapterClient` is the real one; test doubles (the runner's unit tests'
    ``FakeAdapter``) are checked against this protocol by a conformance test."""

    def open(self, meta: TrajectoryMeta) -> str | None: ...

    def close(self, trajectory_id: str, outcome: Outcome | None = None) -> CloseResult: ...

    def healthy(self) -> bool: ...

    def close_connection(self) -> None: ...


def _error_text(response: httpx.Response) -> str:
    try:
        body = response.json()
        message = body["error"]["message"]
        return f"{response.status_code} {body['error'].get('code') or ''}: {message}".strip()
    except (ValueError, KeyError, TypeError):
        return f"{response.status_code}: {response.text[:300]}"


class AdapterClient:
    """Synchronous and thread-safe (one ``httpx.Client``); one per worker."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 30.0,
        attempts: int = 3,
        backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"adapter URL must be http(s), got {base_url!r}")
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.base_url = base_url.rstrip("/")
        self.attempts = attempts
        self.backoff_s = backoff_s
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(timeout=timeout_s, transport=transport, headers=headers)

    def close_connection(self) -> None:
        self._client.close()

    def healthy(self) -> bool:
        """Whether the adapter answers ``/health`` with 200 (an engine in rotation), as seen
        from this host: used to tell a failed LLM call the policy caused (from inside its
        sandbox) from one the infrastructure did."""
        try:
            return self._client.get(f"{self.base_url}/health").status_code == 200
        except httpx.HTTPError:
            return False

    def _post(self, path: str, body: dict[str, Any]) -> tuple[httpx.Response, bool]:
        """POST with retries; returns the response and whether an earlier try may have landed."""
        url = f"{self.base_url}{path}"
        maybe_applied = False
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                response = self._client.post(url, json=body)
            except httpx.TransportError as exc:
                # A request that failed after being sent may have been executed.
                maybe_applied = maybe_applied or not isinstance(exc, httpx.ConnectError)
                last = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code not in _RETRY_STATUSES:
                    return response, maybe_applied
                last = _error_text(response)
            if attempt < self.attempts:
                _log.warning("adapter %s failed (%s); retrying", path, last)
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise AdapterUnavailableError(
            f"LLM adapter at {self.base_url} unavailable ({self.attempts} attempts): {last}"
        )

    def open(self, meta: TrajectoryMeta) -> str | None:
        """Open the record and return its bearer token (None from an adapter that issues none);
        :class:`TrajectoryExistsError` if the id is taken."""
        path = "/trajectories"
        response, maybe_applied = self._post(path, meta.model_dump(mode="json"))
        if response.status_code == 201:
            try:
                token = response.json().get("token")
            except (ValueError, AttributeError) as exc:
                raise AdapterError(f"opening {meta.trajectory_id!r}: unreadable answer") from exc
            if token is not None and not isinstance(token, str):
                raise AdapterError(f"opening {meta.trajectory_id!r}: the token is not a string")
            return token
        if response.status_code == 409:
            if maybe_applied:  # our own earlier try created it; its reply was lost
                raise OpenReplyLostError(
                    f"trajectory {meta.trajectory_id!r} was opened but the answer carrying its "
                    "token was lost"
                )
            raise TrajectoryExistsError(
                f"trajectory {meta.trajectory_id!r} already has a record at the adapter"
            )
        raise AdapterError(f"opening trajectory {meta.trajectory_id!r}: {_error_text(response)}")

    def close(self, trajectory_id: str, outcome: Outcome | None = None) -> CloseResult:
        """Close the record (idempotent), storing ``outcome`` unless an abort is recorded."""
        body = {"outcome": outcome.model_dump(mode="json")} if outcome is not None else {}
        response, _ = self._post(f"/trajectories/{trajectory_id}/close", body)
        if response.status_code != 200:
            raise AdapterError(f"closing trajectory {trajectory_id!r}: {_error_text(response)}")
        try:
            data = response.json()
            kept = data.get("outcome")
            counters = {str(k): int(v) for k, v in (data.get("counters") or {}).items()}
            return CloseResult(Outcome.model_validate(kept) if kept else None, counters)
        except (ValueError, TypeError, AttributeError, ValidationError) as exc:
            raise AdapterError(
                f"closing trajectory {trajectory_id!r}: unreadable answer: {exc}"
            ) from exc
