"""The toy runner: a minimal agent loop playing "lookup then answer" against the adapter.

:class:`ToyTrajectoryRunner` implements :class:`sandbox_worker.runner.TrajectoryRunner` for
tasks of kind ``"toy"`` (the task is :mod:`services.protocol.toy`; docs/toy-task.md). It needs no
container: it talks OpenAI chat completions *with tools* to the adapter's per-trajectory URL
``<adapter>/t/<trajectory id>/v1/chat/completions`` with the trajectory's bearer token, exactly as
the OpenHands agent does through its sandbox relay, so recording, tool-call parsing, weight
refresh and policy lag are exercised on the real path. For one task:

1. **open** the trajectory record (:mod:`sandbox_worker.records`), draw the code from the task
   id and attempt (:func:`services.protocol.toy.draw_code`);
2. **turn 1**: system prompt + user message, the ``lookup`` tool offered; the answer must be
   exactly one tool call named ``lookup`` (as the adapter parsed it from the model's text);
3. **observation**: the tool result holds the code on 32 lines; with a latency model
   (``worker.rollout.toy_tool_latency``, off by default) the tool first takes a time drawn
   per task from a long-tailed lognormal (:func:`tool_latency_s`), so that agent steps, not
   the train step, dominate a run, as with SWE agents;
4. **turn 2**: the answer; reward 1 if it is exactly the code, else 0;
5. **close** the record with the outcome.

Endings: a well-formed episode is ``completed`` with reward 1 or 0. A first turn without a
well-formed ``lookup`` call (plain text, another tool, several calls, a cut-off call) or a second
turn that calls a tool instead of answering is the *policy's* fault: ``error`` with reward 0,
trained on. ``limits.max_steps`` < 2 or an exhausted ``limits.wall_time_s`` before a turn (or
during the tool's latency) is ``timeout`` with reward 0. The adapter or engine failing
(transport error, a non-200 answer, an unreadable body) and a cancel are ``aborted``: excluded
from training, never a 0.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import httpx

from sandbox_worker.adapter_client import TrajectoryRecords
from sandbox_worker.config import ToyToolLatencyConfig
from sandbox_worker.outcomes import aborted, graded
from sandbox_worker.records import OpenFailedError, close_record, open_record, trajectory_meta
from sandbox_worker.runner import CANCELLED, RunContext
from services.protocol.progress import ProgressPhase
from services.protocol.tasks import RolloutTask
from services.protocol.toy import (
    LOOKUP_TOOL,
    TOOL_NAME,
    draw_code,
    observation,
    prompt_messages,
    reward_for_answer,
)
from services.protocol.trajectory import Outcome, OutcomeStatus

# Why an episode ended (``test_report["ending"]``).
ANSWERED = "answered"  # two turns, the answer graded
NO_TOOL_CALL = "no_tool_call"  # turn 1 is not one well-formed lookup call
TOOL_CALL_AS_ANSWER = "tool_call_as_answer"  # turn 2 called a tool instead of answering
OUT_OF_STEPS = "out_of_steps"  # limits.max_steps < 2
OUT_OF_TIME = "out_of_time"  # limits.wall_time_s spent before a turn


# The standard normal quantile of 0.99: a lognormal's sigma is ln(p99 / median) / Z99.
Z99 = NormalDist().inv_cdf(0.99)


def latency_sigma(cfg: ToyToolLatencyConfig) -> float:
    """The lognormal's sigma for the configured median and p99 (0 when off)."""
    if not cfg.enabled:
        return 0.0
    return math.log(cfg.p99 / cfg.median_s) / Z99


def tool_latency_s(task_id: str, attempt: int, cfg: ToyToolLatencyConfig) -> float:
    """The ``lookup`` tool's latency of one trajectory in seconds: 0 when the model is off;
    else ``median * exp(sigma * z)``, capped at ``max_s``, with ``z`` the standard normal
    quantile of a uniform drawn as SHA-256 of ``"<task_id>#<attempt>#latency"`` (like the
    code's draw: reproducible, independent of the code, fresh per attempt)."""
    if not cfg.enabled:
        return 0.0
    digest = hashlib.sha256(f"{task_id}#{attempt}#latency".encode()).digest()
    u = (int.from_bytes(digest[:8], "big") + 0.5) / 2.0**64
    z = NormalDist().inv_cdf(u)
    return min(cfg.max_s, cfg.median_s * math.exp(latency_sigma(cfg) * z))


class LLMCallError(RuntimeError):
    """A chat completion at the adapter failed (infrastructure: the run is aborted)."""


class ChatEndpoint:
    """POSTs chat completions to the adapter's per-trajectory OpenAI routes (thread-safe)."""

    def __init__(
        self,
        adapter_url: str,
        *,
        timeout_s: float = 120.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not adapter_url.startswith(("http://", "https://")):
            raise ValueError(f"adapter URL must be http(s), got {adapter_url!r}")
        self.base_url = adapter_url.rstrip("/")
        self.timeout_s = timeout_s
        self._client = httpx.Client(timeout=timeout_s, transport=transport)

    def url(self, trajectory_id: str) -> str:
        """The trajectory's OpenAI base URL, as OpenHands is given it."""
        return f"{self.base_url}/t/{trajectory_id}/v1"

    def complete(
        self,
        trajectory_id: str,
        token: str | None,
        body: dict[str, Any],
        *,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """The first choice (``message``, ``finish_reason``) of one chat completion."""
        headers = {"authorization": f"Bearer {token}"} if token else {}
        url = f"{self.url(trajectory_id)}/chat/completions"
        try:
            response = self._client.post(
                url, json=body, headers=headers, timeout=timeout_s or self.timeout_s
            )
        except httpx.HTTPError as exc:
            raise LLMCallError(f"chat completion failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise LLMCallError(
                f"chat completion answered {response.status_code}: {response.text[:500]}"
            )
        try:
            choice = response.json()["choices"][0]
            if not isinstance(choice["message"], dict):
                raise TypeError("message is not an object")
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LLMCallError(f"unreadable chat completion: {exc}") from exc
        return dict(choice)

    def close(self) -> None:
        self._client.close()


class _Abort(Exception):
    """Internal: stop here; the trajectory is aborted with this reason."""


class _OutOfTime(Exception):
    """Internal: ``limits.wall_time_s`` is spent before a turn."""


@dataclass
class _Episode:
    task: RolloutTask
    ctx: RunContext
    token: str | None
    code: str
    deadline: float
    durations: dict[str, float] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)


def lookup_call(message: dict[str, Any]) -> dict[str, Any] | None:
    """The message's tool call if it is exactly one well-formed call of ``lookup``, else None."""
    calls = message.get("tool_calls") or []
    if len(calls) != 1 or not isinstance(calls[0], dict):
        return None
    function = calls[0].get("function") or {}
    if function.get("name") != TOOL_NAME or not calls[0].get("id"):
        return None
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        return None
    return calls[0] if isinstance(arguments, dict) else None


def sampling_body(task: RolloutTask) -> dict[str, Any]:
    """The request fields for the task's sampling settings (``top_k`` -1: not sent)."""
    s = task.sampling
    body: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "max_tokens": s.max_tokens,
    }
    if s.top_k >= 0:
        body["top_k"] = s.top_k
    return body


class ToyTrajectoryRunner:
    """Plays toy tasks against the adapter (see the module docstring); thread-safe."""

    def __init__(
        self,
        adapter: TrajectoryRecords,
        chat: ChatEndpoint,
        *,
        latency: ToyToolLatencyConfig | None = None,
    ) -> None:
        self.adapter = adapter
        self.chat = chat
        self.latency = latency or ToyToolLatencyConfig()

    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        started = time.monotonic()
        if task.kind != "toy":
            return aborted(f"the toy runner cannot run a {task.kind!r} task", retryable=False)
        try:
            token = open_record(self.adapter, trajectory_meta(task, ctx.node))
        except OpenFailedError as exc:
            outcome = aborted(exc.reason)
            if exc.opened:
                outcome = close_record(self.adapter, task.trajectory_id, outcome)
            return outcome
        ctx.progress.phase(ProgressPhase.AGENT)
        code = draw_code(task.task_id, task.attempt)
        ep = _Episode(task, ctx, token, code, started + task.limits.wall_time_s)
        ep.report["code"] = code
        try:
            outcome = self._play(ep)
        except _OutOfTime:
            outcome = self._graded(ep, OutcomeStatus.TIMEOUT, OUT_OF_TIME, 0.0)
        except (_Abort, LLMCallError) as exc:
            outcome = aborted(str(exc), test_report=ep.report)
        except Exception as exc:  # a bug must still close the record and free the slot
            ctx.log.exception("toy runner failed")
            outcome = aborted(f"runner failed: {type(exc).__name__}: {exc}", test_report=ep.report)
        outcome = close_record(self.adapter, task.trajectory_id, outcome)
        ep.durations["total"] = round(time.monotonic() - started, 3)
        ctx.log.info(
            "toy trajectory %s: %s reward=%s ending=%s%s",
            task.trajectory_id,
            outcome.status,
            outcome.reward,
            ep.report.get("ending"),
            f" reason={outcome.abort_reason!r}" if outcome.abort_reason else "",
        )
        return outcome.model_copy(update={"durations": dict(ep.durations)})

    def _play(self, ep: _Episode) -> Outcome:
        messages = prompt_messages(ep.task.instance_id)
        first = self._turn(ep, messages, "turn1")
        call = lookup_call(first["message"])
        if call is None:
            ep.report["first_turn"] = str(first["message"].get("content") or "")[:500]
            return self._graded(ep, OutcomeStatus.ERROR, NO_TOOL_CALL, 0.0)
        if ep.task.limits.max_steps < 2:
            return self._graded(ep, OutcomeStatus.TIMEOUT, OUT_OF_STEPS, 0.0)
        self._tool_wait(ep)
        messages += [
            {
                "role": "assistant",
                "content": first["message"].get("content"),
                "tool_calls": first["message"]["tool_calls"],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": observation(ep.code)},
        ]
        second = self._turn(ep, messages, "turn2")
        if second["message"].get("tool_calls"):
            return self._graded(ep, OutcomeStatus.ERROR, TOOL_CALL_AS_ANSWER, 0.0)
        answer = second["message"].get("content")
        ep.report["answer"] = str(answer or "")[:500]
        return self._graded(
            ep, OutcomeStatus.COMPLETED, ANSWERED, reward_for_answer(answer, ep.code)
        )

    def _tool_wait(self, ep: _Episode) -> None:
        """The ``lookup`` tool's simulated latency (nothing when the model is off): the drawn
        time is ``durations["tool"]``; a cancel ends the wait at once (aborted), the wall-time
        deadline ends it as a timeout."""
        delay = tool_latency_s(ep.task.task_id, ep.task.attempt, self.latency)
        if delay <= 0.0:
            return
        ep.durations["tool"] = round(delay, 3)
        left = ep.deadline - time.monotonic()
        ep.ctx.progress.tool(TOOL_NAME)
        try:
            if ep.ctx.cancel.wait(max(0.0, min(delay, left))):
                raise _Abort(ep.ctx.cancel.reason or CANCELLED)
        finally:
            ep.ctx.progress.tool(None)
        if delay >= left:
            raise _OutOfTime

    def _turn(self, ep: _Episode, messages: list[dict[str, Any]], name: str) -> dict[str, Any]:
        """One chat completion with the ``lookup`` tool offered (cancel and time checked)."""
        if ep.ctx.cancel.is_set():
            raise _Abort(ep.ctx.cancel.reason or CANCELLED)
        left = ep.deadline - time.monotonic()
        if left <= 0:
            raise _OutOfTime
        body = {"messages": messages, "tools": [LOOKUP_TOOL], **sampling_body(ep.task)}
        t0 = time.monotonic()
        try:
            choice = self.chat.complete(
                ep.task.trajectory_id, ep.token, body, timeout_s=min(left, self.chat.timeout_s)
            )
        finally:
            ep.durations[name] = round(time.monotonic() - t0, 3)
        ep.report[f"{name}_finish_reason"] = choice.get("finish_reason")
        return choice

    def _graded(self, ep: _Episode, status: OutcomeStatus, ending: str, reward: float) -> Outcome:
        ep.report["ending"] = ending
        return graded(status, reward, patch="", test_report=ep.report, durations=ep.durations)
