"""Run one OpenHands conversation against the adapter and say why it ended.

:func:`run_agent` is the whole contract between the sandbox worker and OpenHands:

* the agent (terminal + file editor, built-in finish/think) calls the LLM at ``llm_base_url``,
  the adapter's per-trajectory URL ``http://<adapter>/t/<trajectory_id>/v1``, so every call
  lands in that trajectory's token record;
* the task's sampling parameters go into every request, ``limits.max_steps`` becomes the SDK's
  ``max_iteration_per_run`` and ``limits.wall_time_s`` is enforced by a watchdog thread that
  pauses the conversation (between agent steps) when time is up or ``cancel`` is set;
* the conversation runs either in this process on a local directory (``LocalWorkspace``: tests
  and the bwrap-less dev path) or on an OpenHands agent server (``RemoteWorkspace``: the agent
  server runs inside the task's sandbox, see :mod:`sandbox_worker.openhands.server`);
* the result is an :class:`AgentRunResult` whose ``end_reason`` separates the agent's own end
  (finished, no tool call), limits (steps, wall time, context), agent errors and infrastructure
  failures (LLM endpoint unreachable, agent server lost, cancelled).

The function blocks; it is safe to call from several threads at once (one conversation each).
"""

from __future__ import annotations

import abc
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sandbox_worker.openhands.env import local_inputrc, prepare_sdk_environment

prepare_sdk_environment()

import httpx  # noqa: E402
from openhands.sdk import (  # noqa: E402
    Conversation,
    LocalWorkspace,
    RemoteConversation,
    RemoteWorkspace,
)
from openhands.sdk.conversation.base import BaseConversation  # noqa: E402
from openhands.sdk.conversation.exceptions import (  # noqa: E402
    ConversationRunError,
    WebSocketConnectionError,
)

from sandbox_worker.openhands.config import OpenHandsConfig  # noqa: E402
from sandbox_worker.openhands.result import (  # noqa: E402
    AgentRunResult,
    ConversationError,
    EndReason,
    EventSummary,
    StopCause,
    classify,
)
from sandbox_worker.openhands.sdk import build_agent, summarize_events  # noqa: E402
from services.protocol.tasks import AgentLimits, SamplingConfig  # noqa: E402

_log = logging.getLogger("swerl.openhands")


class _CancelledBeforeRun(Exception):
    """Internal: the cancel signal was set before ``run()`` started."""


class CancelSignal(Protocol):
    """Anything with ``is_set()``: a ``threading.Event`` or the worker's ``CancelToken``."""

    def is_set(self) -> bool: ...


REMOTE_TITLE = "swerl trajectory"
EventCallback = Callable[[Any], None]

# How often the watchdog checks the clock and the cancel signal, and re-sends a pause that a
# run starting at the same moment may have overwritten.
_POLL_S = 0.25
_REPAUSE_S = 1.0
_ALIVE_EVERY_S = 2.0  # checking a sandboxed process is an API call (docker exec inspect)


class _Watchdog:
    """Stops a running conversation at its deadline or on cancel: pause, then force."""

    def __init__(
        self,
        conversation: BaseConversation,
        deadline: float,
        cancel: CancelSignal | None,
        grace_s: float,
        force_stop: Callable[[], None] | None,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        self._conv = conversation
        self._deadline = deadline
        self._cancel = cancel
        self._grace_s = grace_s
        self._force_stop = force_stop
        self._alive = alive
        self._alive_checked = time.monotonic()
        self._done = threading.Event()
        self.cause: StopCause | None = None
        self._thread = threading.Thread(target=self._watch, name="openhands-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._grace_s + 10)

    def _due(self) -> StopCause | None:
        if self._cancel is not None and self._cancel.is_set():
            return StopCause.CANCELLED
        now = time.monotonic()
        if now >= self._deadline:
            return StopCause.TIMEOUT
        if self._alive is not None and now - self._alive_checked >= _ALIVE_EVERY_S:
            self._alive_checked = now
            with contextlib.suppress(Exception):
                if not self._alive():
                    return StopCause.SERVER_LOST
        return None

    def _watch(self) -> None:
        while (cause := self._due()) is None:
            if self._done.wait(_POLL_S):
                return
        self.cause = cause
        _log.info("stopping the conversation: %s", self.cause)
        if cause is StopCause.SERVER_LOST:
            # Nothing to pause: end the host side's wait at once.
            self._force()
            return
        stopped_at = time.monotonic()
        forced = False
        pausing: threading.Thread | None = None
        while True:
            # pause() takes effect between agent steps and blocks until the current step ends
            # (it waits for the conversation's state lock), so it runs in its own thread. It is
            # re-sent because a run that was just starting may have switched a paused
            # conversation back to running.
            if pausing is None or not pausing.is_alive():
                pausing = threading.Thread(target=self._pause, name="openhands-pause", daemon=True)
                pausing.start()
            if self._done.wait(_REPAUSE_S):
                return
            if not forced and time.monotonic() - stopped_at > self._grace_s:
                forced = True
                _log.warning("no pause after %.0fs; forcing the stop", self._grace_s)
                self._force()

    def _force(self) -> None:
        if self._force_stop is not None:
            with contextlib.suppress(Exception):
                self._force_stop()

    def _pause(self) -> None:
        with contextlib.suppress(Exception):
            self._conv.pause()


def _validate(task_prompt: str, limits: AgentLimits, sampling: SamplingConfig) -> None:
    if not isinstance(task_prompt, str) or not task_prompt.strip():
        raise ValueError("task_prompt must be a non-empty string")
    if not isinstance(limits, AgentLimits):
        raise TypeError(f"limits must be an AgentLimits, got {type(limits).__name__}")
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a SamplingConfig, got {type(sampling).__name__}")


Workspace = LocalWorkspace | RemoteWorkspace
# What talking to an agent server can raise (a local conversation talks to nothing).
_CONNECTION_ERRORS = (httpx.HTTPError, WebSocketConnectionError, ConnectionError)


class AgentTarget(abc.ABC):
    """Where a conversation runs. The two targets differ only through these methods."""

    @abc.abstractmethod
    def workspace(self) -> Workspace:
        """The SDK workspace (validates the target's fields: bad ones raise ``ValueError``)."""

    @abc.abstractmethod
    def agent_config(self, cfg: OpenHandsConfig, llm_api_key: str | None) -> OpenHandsConfig:
        """``cfg`` with the trajectory's bearer token, where this target may hold it."""

    @abc.abstractmethod
    def terminal_env(self) -> dict[str, str] | None:
        """Extra environment of the agent's terminal."""

    @abc.abstractmethod
    def force_stop(
        self, workspace: Workspace, conversation: BaseConversation
    ) -> Callable[[], None]:
        """What the watchdog calls when a pause did not stop the run in time."""

    def server_alive(self) -> Callable[[], bool] | None:
        """Whether the process running the conversation still runs (None: not watched)."""
        return None

    @abc.abstractmethod
    def prepare(self, conversation: BaseConversation) -> None:
        """Set-up before the task is sent."""

    @abc.abstractmethod
    def run(self, conversation: BaseConversation, limits: AgentLimits, grace_s: float) -> None:
        """Block until the conversation's run ends (it raises ``ConversationRunError``)."""

    @abc.abstractmethod
    def lost_server(self, exc: ConversationRunError) -> bool:
        """Whether a failed run means the agent server is gone."""

    @abc.abstractmethod
    def connection_failed(self, exc: Exception) -> ConversationError:
        """A connection error outside ``run`` (one of :data:`_CONNECTION_ERRORS`): the server is
        lost (remote), or a bug that is raised (local)."""

    @abc.abstractmethod
    def release(self, workspace: Workspace) -> None:
        """Free what the workspace still holds once the conversation is closed."""


@dataclass(frozen=True)
class LocalTarget(AgentTarget):
    """Run the agent in this process; its tools act on ``workspace_dir`` of this machine."""

    workspace_dir: Path

    def workspace(self) -> Workspace:
        path = Path(self.workspace_dir)
        if not path.is_dir():
            raise ValueError(f"workspace_dir {path} is not a directory")
        return LocalWorkspace(working_dir=str(path.resolve()))

    def agent_config(self, cfg: OpenHandsConfig, llm_api_key: str | None) -> OpenHandsConfig:
        return cfg if llm_api_key is None else cfg.model_copy(update={"api_key": llm_api_key})

    def terminal_env(self) -> dict[str, str] | None:
        # Given explicitly so that the user's own ~/.inputrc is neither needed nor touched.
        return {"INPUTRC": local_inputrc()}

    def force_stop(
        self, workspace: Workspace, conversation: BaseConversation
    ) -> Callable[[], None]:
        return conversation.close  # kills its terminal, which ends a stuck tool call

    def run(self, conversation: BaseConversation, limits: AgentLimits, grace_s: float) -> None:
        conversation.run()

    def prepare(self, conversation: BaseConversation) -> None:
        pass

    def lost_server(self, exc: ConversationRunError) -> bool:
        return False

    def connection_failed(self, exc: Exception) -> ConversationError:
        raise exc

    def release(self, workspace: Workspace) -> None:
        pass


@dataclass(frozen=True)
class RemoteTarget(AgentTarget):
    """Run the agent on an OpenHands agent server reachable from here at ``server_url``.

    ``working_dir`` is the repository's path as the server sees it (``/testbed`` in a sandbox).
    """

    server_url: str
    working_dir: str = "/testbed"
    api_key: str | None = None
    # Whether the server process still runs (e.g. ``BackgroundProcess.is_running``): a server
    # that dies mid-run (OOM in the sandbox...) then ends the run at once as infrastructure
    # instead of looking like a wall-time timeout.
    alive: Callable[[], bool] | None = None

    def workspace(self) -> Workspace:
        if not self.server_url.startswith(("http://", "https://")):
            raise ValueError(f"server_url must be an http(s) URL, got {self.server_url!r}")
        if not self.working_dir.startswith("/"):
            raise ValueError(f"working_dir must be absolute, got {self.working_dir!r}")
        return RemoteWorkspace(
            host=self.server_url, working_dir=self.working_dir, api_key=self.api_key
        )

    def agent_config(self, cfg: OpenHandsConfig, llm_api_key: str | None) -> OpenHandsConfig:
        # The LLM settings are sent to the server inside the sandbox, where no credential may go
        # (there, the host side of the relay adds the token).
        if llm_api_key is not None:
            raise ValueError("llm_api_key is for local runs only: it would enter the sandbox")
        return cfg

    def terminal_env(self) -> dict[str, str] | None:
        return None  # the agent server's $HOME (/tmp) holds the inputrc (see .server)

    def force_stop(
        self, workspace: Workspace, conversation: BaseConversation
    ) -> Callable[[], None]:
        # Closing the workspace's HTTP client makes the host-side wait in run() fail at its next
        # poll (the caller then destroys the sandbox).
        def close() -> None:
            workspace.client.close()  # type: ignore[union-attr]

        return close

    def server_alive(self) -> Callable[[], bool] | None:
        return self.alive

    def prepare(self, conversation: BaseConversation) -> None:
        if isinstance(conversation, RemoteConversation):
            # The agent server titles a conversation with an extra LLM call on its first user
            # message unless it already has a title; that call would land in the trajectory.
            conversation.set_title(REMOTE_TITLE)

    def run(self, conversation: BaseConversation, limits: AgentLimits, grace_s: float) -> None:
        conversation.run(timeout=limits.wall_time_s + 2 * grace_s)  # type: ignore[call-arg]

    def lost_server(self, exc: ConversationRunError) -> bool:
        return isinstance(exc.original_exception, httpx.HTTPError | WebSocketConnectionError)

    def connection_failed(self, exc: Exception) -> ConversationError:
        return ConversationError(type(exc).__name__, str(exc))

    def release(self, workspace: Workspace) -> None:
        if isinstance(workspace, RemoteWorkspace):
            # The conversation leaves the workspace's HTTP client open (one keep-alive socket
            # and one relay splice per trajectory in a long-running worker): close it here.
            with contextlib.suppress(Exception):
                workspace.reset_client()


def _status_of(conversation: BaseConversation) -> str | None:
    with contextlib.suppress(Exception):
        status = conversation.state.execution_status
        return str(getattr(status, "value", status))
    return None


def _summary_of(conversation: BaseConversation) -> EventSummary:
    # A remote conversation whose server is gone (or whose client was closed to force a stop)
    # may fail to list its events; the stop cause then explains the end on its own.
    try:
        return summarize_events(conversation.state.events)
    except Exception as exc:
        _log.warning("cannot read the conversation's events: %r", exc)
        return EventSummary()


def _run_error(exc: ConversationRunError) -> ConversationError:
    if exc.conversation_error is not None:
        return ConversationError(exc.conversation_error.code, exc.conversation_error.detail)
    original = exc.original_exception
    return ConversationError(type(original).__name__, str(original))


@dataclass
class _RunEnd:
    """How the conversation's run ended, before classification."""

    run_error: ConversationError | None = None
    server_lost: bool = False
    status: str | None = None
    summary: EventSummary = field(default_factory=EventSummary)


def run_agent(
    target: AgentTarget,
    llm_base_url: str,
    task_prompt: str,
    limits: AgentLimits,
    sampling: SamplingConfig,
    *,
    config: OpenHandsConfig | None = None,
    cancel: CancelSignal | None = None,
    callbacks: Sequence[EventCallback] = (),
    llm_api_key: str | None = None,
) -> AgentRunResult:
    """Run one agent conversation to its end; see the module docstring.

    ``llm_api_key`` is the trajectory's bearer token for an adapter in training mode, local
    mode only: a remote agent's LLM settings are sent to the agent server inside the sandbox,
    where no credential may go (there, the host side of the relay adds the token).
    ``callbacks`` receive every SDK event as it happens (in remote mode: as the server streams
    it). Bad arguments raise ``ValueError``/``TypeError``; everything that goes wrong once the
    conversation exists is reported in the result, never raised.
    """
    _validate(task_prompt, limits, sampling)
    if not isinstance(target, AgentTarget):
        raise TypeError(
            f"target must be a LocalTarget or RemoteTarget, got {type(target).__name__}"
        )
    workspace = target.workspace()
    cfg = target.agent_config(config or OpenHandsConfig(), llm_api_key)
    agent = build_agent(llm_base_url, sampling, limits, cfg, target.terminal_env())
    t0 = time.monotonic()

    def result(reason: EndReason, error: str | None, **kw: Any) -> AgentRunResult:
        return AgentRunResult(reason, kw.pop("n_steps", 0), time.monotonic() - t0, error, **kw)

    if cancel is not None and cancel.is_set():
        return result(EndReason.CANCELLED, "the run was cancelled before it started")
    try:
        conversation = _new_conversation(agent, workspace, limits, callbacks)
    except _CONNECTION_ERRORS as exc:
        # Only a remote conversation talks to anything while being created.
        return result(EndReason.AGENT_SERVER_ERROR, f"cannot open the conversation: {exc!r}")
    watchdog = _Watchdog(
        conversation,
        deadline=t0 + limits.wall_time_s,
        cancel=cancel,
        grace_s=cfg.stop_grace_s,
        force_stop=target.force_stop(workspace, conversation),
        alive=target.server_alive(),
    )
    end = _drive(target, workspace, conversation, watchdog, task_prompt, limits, cfg, cancel)
    reason, error = classify(
        end.status, end.summary, watchdog.cause, end.run_error, end.server_lost
    )
    n_steps = end.summary.n_steps
    _log.info("agent run ended: %s after %d steps (%s)", reason, n_steps, error or "no error")
    return result(reason, error, n_steps=n_steps, status=end.status, summary=end.summary)


def _new_conversation(
    agent: Any, workspace: Workspace, limits: AgentLimits, callbacks: Sequence[EventCallback]
) -> BaseConversation:
    return Conversation(
        agent=agent,
        workspace=workspace,
        max_iteration_per_run=limits.max_steps,
        stuck_detection=False,
        visualizer=None,
        callbacks=list(callbacks) or None,
        delete_on_close=True,
    )


def _drive(
    target: AgentTarget,
    workspace: Workspace,
    conversation: BaseConversation,
    watchdog: _Watchdog,
    task_prompt: str,
    limits: AgentLimits,
    cfg: OpenHandsConfig,
    cancel: CancelSignal | None,
) -> _RunEnd:
    """Send the task and run under the watchdog; always closes the conversation."""
    end = _RunEnd()
    try:
        target.prepare(conversation)
        conversation.send_message(task_prompt)
        watchdog.start()
        if cancel is not None and cancel.is_set():
            # Do not start a run that is already cancelled (a pause sent before run() starts
            # would be overwritten by it).
            raise _CancelledBeforeRun
        try:
            target.run(conversation, limits, cfg.stop_grace_s)
        except ConversationRunError as exc:
            end.run_error = _run_error(exc)
            end.server_lost = target.lost_server(exc)
        watchdog.stop()
        end.status = _status_of(conversation)
        end.summary = _summary_of(conversation)
    except _CancelledBeforeRun:
        watchdog.cause = StopCause.CANCELLED
    except _CONNECTION_ERRORS as exc:
        end.run_error = target.connection_failed(exc)  # local: raised
        end.server_lost = True
    finally:
        watchdog.stop()
        with contextlib.suppress(Exception):
            conversation.close()
        target.release(workspace)
    return end
