"""The real trajectory runner: one rollout task from sandbox to reward.

:class:`SandboxTrajectoryRunner` implements :class:`sandbox_worker.runner.TrajectoryRunner`;
:func:`sandbox_worker.factory.build_runner` wires it from the worker's config.

For one :class:`RolloutTask` (see docs/tasks-and-rewards.md, "Trajectory runs"):

1. **open** the trajectory at the adapter with its identifiers (task, batch, group, instance);
   Before that, the image's labels (``swerl.repo`` / ``swerl.base_commit``, written by the
   image build) are checked against the instance: a mismatch is a wrong image, aborted
   (not retried) with a reason naming both;
2. **create** the agent sandbox from the instance image: no network but the LLM relay to the
   adapter, the configured limits, the read-only agent-server bundle, ownership labels;
3. **make the task state** of a SWE-smith row (its bug applied, its failing tests hidden:
   :mod:`sandbox_worker.task_state`; other images already are the task), then
   **pin the diff base**: the repository's ``HEAD`` when the sandbox starts. For the images
   built here it *is* ``base_commit``; official SWE-bench images commit their environment setup
   on top of the base, so the agent's work is diffed against that start commit (the evaluation
   keeps such a descendant ``HEAD`` too). A ``HEAD`` that is not ``base_commit`` and does not
   descend from it means a wrong image: aborted before the agent starts;
4. **run the agent**: the OpenHands agent server inside the sandbox, the SWE prompt built from
   the problem statement, the task's limits and sampling, the cancel token;
5. **extract the patch** on the host (:mod:`sandbox_worker.patch_extract`: the working tree
   copied out, ``git add -A && git diff --cached --binary <base>`` by the host's git with none
   of the agent's configuration, attributes drivers or hooks; at most
   ``settings.max_patch_bytes``, else graded 0 with ``patch_too_large``) and **destroy** the
   agent sandbox;
6. **evaluate** the patch in a **fresh** sandbox (SWE-bench semantics);
7. **close** the trajectory at the adapter with the :class:`Outcome` (the record then carries it).

The status comes from how the agent ended and the reward from the tests
(:mod:`sandbox_worker.outcomes`); every infrastructure failure, and a cancel, is ``aborted``
with its reason, never a reward of 0. ``run`` never raises for such failures, is thread-safe
(one call per worker slot) and returns soon after ``ctx.cancel`` is set, except that an
evaluation already running is allowed to finish (it is bounded by the test timeout).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sandbox_worker import images
from sandbox_worker.adapter_client import AdapterError, CloseResult, TrajectoryRecords
from sandbox_worker.backends.base import (
    ImageNotFoundError,
    LlmRelay,
    NetworkPolicy,
    Sandbox,
    SandboxBackend,
    SandboxInfraError,
    SandboxLimits,
    SandboxSpec,
)
from sandbox_worker.evaluation import EvalConfig, EvalReport, evaluate_patch
from sandbox_worker.evaluation.row_grading import GradingConfigError
from sandbox_worker.openhands.config import OpenHandsConfig
from sandbox_worker.openhands.prompt import build_swe_prompt
from sandbox_worker.openhands.result import AgentRunResult, EndReason
from sandbox_worker.openhands.server import AgentServerBundle, run_agent_in_sandbox
from sandbox_worker.outcomes import abort_reason_of_end, aborted, graded
from sandbox_worker.patch_extract import (
    DEFAULT_MAX_PATCH_BYTES,
    HostExtractionError,
    PatchRefusedError,
    PatchTooLargeError,
    extract_patch,
)
from sandbox_worker.progress import tool_callback
from sandbox_worker.records import OpenFailedError, close_record, open_record, trajectory_meta
from sandbox_worker.relay.host_relay import RelayHub
from sandbox_worker.runner import CANCELLED, RunContext
from sandbox_worker.sandbox_names import agent_sandbox_id, sandbox_node_name
from sandbox_worker.task_state import TaskStateError, prepare_task
from services.protocol.instance import SWEInstance
from services.protocol.progress import ProgressPhase
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome, OutcomeStatus

_log = logging.getLogger("swerl.worker.trajectory")

# Where the worker's evaluation.* keys live (appended to deterministic evaluation failures).
CONFIG_HINT = (
    " [worker config: worker.rollout.evaluation.<key>, environment "
    "SWERL_WORKER__ROLLOUT__EVALUATION__<KEY>]"
)
DIFF_BASE_COMMIT = "base_commit"  # HEAD at start == the instance's base_commit
DIFF_START_HEAD = "start_head"  # HEAD at start descends from base_commit (or there is none)


class AgentFn(Protocol):
    """:func:`sandbox_worker.openhands.server.run_agent_in_sandbox`'s signature."""

    def __call__(
        self,
        sandbox: Sandbox,
        hub: RelayHub,
        bundle: AgentServerBundle,
        trajectory_id: str,
        task_prompt: str,
        limits: Any,
        sampling: Any,
        *,
        config: OpenHandsConfig | None = ...,
        cancel: Any = ...,
        callbacks: Sequence[Callable[[Any], None]] = ...,
        startup_timeout_s: float = ...,
    ) -> AgentRunResult: ...


EvalFn = Callable[..., EvalReport]


class _Abort(Exception):
    """Internal: stop the run here; the trajectory is aborted with this reason."""

    def __init__(self, reason: str, *, retryable: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable  # False: configuration error, no retry can fix it


@dataclass(frozen=True)
class DiffBase:
    commit: str  # full sha the patch is taken against
    kind: str  # DIFF_BASE_COMMIT or DIFF_START_HEAD


@dataclass
class RunnerSettings:
    """Per-deployment settings of the runner (built from ``WorkerConfig.rollout``)."""

    adapter_host: str
    adapter_port: int
    relay_port: int = 18080
    workdir: str = "/testbed"
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    openhands: OpenHandsConfig = field(default_factory=OpenHandsConfig)
    evaluation: EvalConfig = field(default_factory=EvalConfig)
    agent_server_startup_s: float = 300.0
    # images hold a repository snapshot shared by many instances (SWE-smith,
    # rollout.image_dataset "swesmith"): the label check compares repository + snapshot commit
    snapshot_images: bool = False
    # the longest patch graded (worker.rollout.max_patch_bytes): longer is reward 0 with the
    # reason patch_too_large, never truncated, never a failure at close
    max_patch_bytes: int = DEFAULT_MAX_PATCH_BYTES


@dataclass
class _Run:
    task: RolloutTask
    ctx: RunContext
    node: str  # the backends' node name
    durations: dict[str, float] = field(default_factory=dict)
    report: dict[str, Any] = field(default_factory=dict)
    patch: str = ""
    opened: bool = False
    token: str | None = field(default=None, repr=False)  # the trajectory's, for the relay only
    counts: CloseResult | None = None

    def timed(self, name: str, started: float) -> None:
        self.durations[name] = round(time.monotonic() - started, 3)

    def check_cancel(self) -> None:
        if self.ctx.cancel.is_set():
            raise _Abort(self.ctx.cancel.reason or CANCELLED)


def resolve_diff_base(sandbox: Sandbox, instance: SWEInstance, workdir: str) -> DiffBase:
    """The commit the agent's patch is taken against (see the module docstring, step 3)."""
    res = sandbox.exec("git rev-parse --verify -q HEAD", workdir=workdir, timeout_s=60)
    head = res.output.strip().splitlines()[-1].strip() if res.output.strip() else ""
    if res.exit_code != 0 or len(head) < 40:
        raise _Abort(f"wrong image: {workdir} is not a git checkout ({res.output[-300:]!r})")
    base = instance.base_commit
    if base is None:
        return DiffBase(head, DIFF_START_HEAD)
    if head == base or (len(base) < 40 and head.startswith(base)):
        return DiffBase(head, DIFF_BASE_COMMIT)
    res = sandbox.exec(
        f"git merge-base --is-ancestor {shlex.quote(base)} HEAD", workdir=workdir, timeout_s=60
    )
    if res.exit_code == 0:
        return DiffBase(head, DIFF_START_HEAD)
    if res.exit_code == 1:
        raise _Abort(
            f"wrong image: its HEAD {head} is neither base_commit {base} nor a descendant of it"
        )
    raise _Abort(f"wrong image: base_commit {base} is not in its repository ({res.output[-300:]})")


# The repository layout the host-side patch extraction needs, checked before the agent runs:
# what it finds missing at the end (a .git that is no directory, objects reached only through
# alternates or another git dir) is then the agent's doing, not the image's.
_OWN_OBJECT_STORE = (
    "test -d .git && test ! -L .git && test -d .git/objects && test ! -L .git/objects"
    " && test ! -e .git/commondir && test ! -s .git/objects/info/alternates"
)


def check_own_object_store(sandbox: Sandbox, workdir: str) -> None:
    """The image's repository must hold its own objects in a plain ``.git`` directory (see
    :data:`_OWN_OBJECT_STORE`); else it is a wrong image, aborted before the agent starts."""
    res = sandbox.exec(_OWN_OBJECT_STORE, workdir=workdir, timeout_s=60)
    if res.exit_code != 0:
        raise _Abort(
            f"wrong image: {workdir}/.git must be a plain directory holding its own objects (no "
            "gitdir file, symlink, commondir or alternates): the worker takes the patch from a "
            "copy of it",
            retryable=False,
        )


class SandboxTrajectoryRunner:
    """Runs rollout tasks in sandboxes of one backend (see the module docstring)."""

    def __init__(
        self,
        backend: SandboxBackend,
        hub: RelayHub,
        bundle: AgentServerBundle,
        adapter: TrajectoryRecords,
        instances: Mapping[str, SWEInstance],
        settings: RunnerSettings,
        *,
        image_for: Callable[[str], str],
        agent_fn: AgentFn = run_agent_in_sandbox,
        eval_fn: EvalFn = evaluate_patch,
    ) -> None:
        self.backend = backend
        self.hub = hub
        self.bundle = bundle
        self.adapter = adapter
        self.instances = dict(instances)
        self.settings = settings
        self.image_for = image_for
        self.agent_fn = agent_fn
        self.eval_fn = eval_fn

    # ------------------------------------------------------------------ entry point
    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        started = time.monotonic()
        run = _Run(task, ctx, sandbox_node_name(ctx.node))
        try:
            outcome = self._pipeline(run)
        except _Abort as exc:
            outcome = aborted(
                exc.reason, patch=run.patch, test_report=run.report, retryable=exc.retryable
            )
        except Exception as exc:  # a bug must still close the record and free the slot
            ctx.log.exception("trajectory runner failed")
            reason = f"runner failed: {type(exc).__name__}: {exc}"
            outcome = aborted(reason, patch=run.patch, test_report=run.report)
        if run.opened:
            outcome = self._close(run, outcome)
        run.timed("total", started)
        outcome = outcome.model_copy(update={"durations": dict(run.durations)})
        ctx.log.info(
            "trajectory %s: %s reward=%s%s (%s)",
            task.trajectory_id,
            outcome.status,
            outcome.reward,
            f" reason={outcome.abort_reason!r}" if outcome.abort_reason else "",
            " ".join(f"{k}={v:.1f}s" for k, v in run.durations.items()),
        )
        return outcome

    # ------------------------------------------------------------------ phases
    def _pipeline(self, run: _Run) -> Outcome:
        task = run.task
        run.check_cancel()
        instance = self.instances.get(task.instance_id)
        if instance is None:
            raise _Abort(
                f"unknown instance {task.instance_id!r}: not in the worker's task files (a "
                "plain id: set worker.rollout.instances / SWERL_WORKER__ROLLOUT__INSTANCES to "
                "the dataset files that hold it; a <dataset>/<id> key: worker.rollout.datasets "
                "or a <dataset>.jsonl in worker.rollout.task_sets_dir)",
                retryable=False,
            )
        self._check_grading(instance)
        try:
            image = task.image or self.image_for(task.instance_id)
        except ValueError as exc:
            raise _Abort(
                f"no image for {task.instance_id!r}: {exc} (check worker.rollout.image_namespace)",
                retryable=False,
            ) from exc
        run.report["image"] = image
        self._check_labels(image, instance)
        self._open(run)
        result = self._agent_phase(run, instance, image)
        run.report["record"] = dict(run.counts.counters) if run.counts else {}
        run.check_cancel()
        run.ctx.progress.phase(ProgressPhase.GRADING)
        t0 = time.monotonic()
        report = self.eval_fn(
            self.backend, instance, run.patch, image, node=run.node, config=self.settings.evaluation
        )
        run.timed("eval", t0)
        run.report["evaluation"] = report.model_dump(mode="json")
        if report.infra_error is not None:
            if report.config_error:  # the same on every attempt
                raise _Abort(f"cannot evaluate: {report.infra_error}{CONFIG_HINT}", retryable=False)
            raise _Abort(f"evaluation infrastructure failed: {report.infra_error}")
        status = result.outcome_status
        assert status is not OutcomeStatus.ABORTED  # aborted endings left in _agent_phase
        reward = report.reward
        assert reward is not None
        counts = run.counts
        return graded(
            status,
            reward,
            patch=run.patch,
            test_report=run.report,
            durations=run.durations,
            n_turns=counts.n_turns if counts else 0,
            n_tokens=counts.n_tokens if counts else 0,
        )

    def _check_grading(self, instance: SWEInstance) -> None:
        """Choices that cannot grade the row right (``evaluation.*``: swerl's pytest script on
        a django row ...) fail the task before the agent runs, final at once."""
        try:
            self.settings.evaluation.for_row(instance)
        except GradingConfigError as exc:
            raise _Abort(f"cannot grade: {exc}{CONFIG_HINT}", retryable=False) from exc

    def _check_labels(self, image: str, instance: SWEInstance) -> None:
        """An image labelled for another repository or base commit (images swerl builds carry
        ``swerl.repo`` / ``swerl.base_commit``) is a wrong image: aborted before anything runs.
        A SWE-smith snapshot image (``settings.snapshot_images``) must hold the repository and
        commit its instance id names. Images without the labels (the official ones) are checked
        by their HEAD instead."""
        try:
            labels = self.backend.image_labels(image)
        except (SandboxInfraError, OSError) as exc:
            raise _Abort(f"image label lookup failed: {exc}") from exc
        snapshot = self.settings.snapshot_images or instance.is_swesmith
        if not labels or "swerl.base_commit" not in labels:
            return
        if not snapshot and not instance.base_commit:
            return
        if snapshot:  # SWE-smith: the id names the snapshot
            try:
                snap = images.swesmith_snapshot(instance.instance_id)
            except ValueError as exc:
                raise _Abort(f"wrong image naming: {exc}", retryable=False) from exc
            problem = images.label_mismatch(
                image, labels, repo=snap.repo, commit=snap.commit8, swesmith=True
            )
        else:
            problem = images.label_mismatch(
                image, labels, repo=instance.repo, commit=instance.base_commit
            )
        if problem is not None:
            raise _Abort(f"wrong image: {problem}", retryable=False)

    def _open(self, run: _Run) -> None:
        t0 = time.monotonic()
        try:
            run.token = open_record(self.adapter, trajectory_meta(run.task, run.ctx.node))
        except OpenFailedError as exc:
            run.opened = exc.opened
            raise _Abort(exc.reason) from exc
        run.opened = True
        run.timed("open", t0)

    def agent_spec(
        self, task: RolloutTask, node: str, image: str, token: str | None = None
    ) -> SandboxSpec:
        """The agent sandbox of ``task`` on backend node ``node``: the LLM relay to the adapter,
        bound to the task's trajectory and adding its ``token`` on the host, is its only
        network; the agent-server bundle is mounted read-only."""
        s = self.settings
        return SandboxSpec(
            image=image,
            node=node,
            sandbox_id=agent_sandbox_id(task.trajectory_id),
            workdir=s.workdir,
            limits=s.limits,
            network=NetworkPolicy.LLM_RELAY_ONLY,
            llm_relay=LlmRelay(
                s.adapter_host,
                s.adapter_port,
                s.relay_port,
                trajectory_id=task.trajectory_id,
                token=token,
            ),
            ro_mounts=self.bundle.ro_mounts,
            labels={
                "swerl.role": "agent",
                "swerl.trajectory": task.trajectory_id,
                "swerl.task": task.task_id,
                "swerl.batch": task.batch_id,
                "swerl.instance": task.instance_id,
            },
        )

    def _agent_phase(self, run: _Run, instance: SWEInstance, image: str) -> AgentRunResult:
        """Sandbox -> diff base -> agent -> patch -> destroy; then freeze the record."""
        spec = self.agent_spec(run.task, run.node, image, run.token)
        run.ctx.progress.phase(ProgressPhase.SANDBOX_START)
        t0 = time.monotonic()
        try:
            sandbox = self.backend.create(spec)
        except ImageNotFoundError as exc:
            raise _Abort(
                f"sandbox creation failed: {exc} (images are never pulled at run time: build or "
                "pull it on this node, or fix worker.rollout.image_namespace / image_tag)",
                retryable=False,
            ) from exc
        except (SandboxInfraError, OSError) as exc:
            raise _Abort(f"sandbox creation failed: {exc}") from exc
        run.timed("sandbox_create", t0)
        try:
            result = self._agent_in(sandbox, run, instance)
        finally:
            t0 = time.monotonic()
            try:
                sandbox.destroy()
            except (SandboxInfraError, OSError) as exc:  # cleanup_node removes it later
                run.ctx.log.warning("could not destroy agent sandbox %s: %s", spec.sandbox_id, exc)
            run.timed("sandbox_destroy", t0)
        self._freeze_record(run)
        return result

    def _agent_in(self, sandbox: Sandbox, run: _Run, instance: SWEInstance) -> AgentRunResult:
        """Diff base -> agent -> patch in the agent sandbox; an aborted ending raises."""
        s = self.settings
        try:
            # SWE-smith: the bug applied, the F2P tests hidden (sandbox_worker.task_state)
            instance = prepare_task(
                sandbox, instance, s.workdir, scratch_dir=s.evaluation.scratch_dir
            )
            base = resolve_diff_base(sandbox, instance, s.workdir)
            check_own_object_store(sandbox, s.workdir)
        except TaskStateError as exc:
            raise _Abort(f"wrong image: {exc}", retryable=False) from exc
        except SandboxInfraError as exc:
            raise _Abort(f"sandbox failed: {exc}") from exc
        run.report["diff_base"] = {"commit": base.commit, "kind": base.kind}
        run.check_cancel()
        run.ctx.progress.phase(ProgressPhase.AGENT)
        t0 = time.monotonic()
        result = self.agent_fn(
            sandbox,
            self.hub,
            self.bundle,
            run.task.trajectory_id,
            build_swe_prompt(instance.problem_statement, s.workdir),
            run.task.limits,
            run.task.sampling,
            config=s.openhands,
            cancel=run.ctx.cancel,
            callbacks=[tool_callback(run.ctx.progress)],  # the running tool, for progress
            startup_timeout_s=s.agent_server_startup_s,
        )
        run.timed("agent", t0)
        run.durations["conversation"] = round(result.duration_s, 3)
        run.report["agent"] = _agent_report(result)
        result = self._attribute_server_loss(sandbox, result, run)
        result = self._attribute_llm_loss(sandbox, result, run)
        run.check_cancel()
        if result.is_infrastructure:
            raise _Abort(abort_reason_of_end(result.end_reason, result.error))
        t0 = time.monotonic()
        run.patch = self._extract_patch(sandbox, base, run)
        run.timed("patch", t0)
        return result

    def _freeze_record(self, run: _Run) -> None:
        """Close the record before evaluation (no call can land after this) and learn its
        counters; an abort the adapter recorded itself (no engine could serve a call) makes
        the run aborted."""
        try:
            run.counts = self.adapter.close(run.task.trajectory_id)
        except AdapterError as exc:
            run.ctx.log.warning(
                "could not close %s before evaluation: %s", run.task.trajectory_id, exc
            )
            return
        kept = run.counts.outcome
        if kept is not None and kept.status is OutcomeStatus.ABORTED:
            raise _Abort(f"adapter: {kept.abort_reason}")

    def _attribute_server_loss(
        self, sandbox: Sandbox, result: AgentRunResult, run: _Run
    ) -> AgentRunResult:
        """An agent server lost *after* the policy ran tools, in a sandbox that still answers, is
        the policy's doing: its shell shares the sandbox with the server and can kill, stop or
        starve it. Excluding such runs as infrastructure failures would teach the policy to
        kill its server whenever a trajectory goes badly (a 0 turned into an excluded abort),
        so they are graded like an agent error on whatever patch exists. A server that never
        ran a tool call, or a sandbox that no longer answers, stays an infrastructure abort."""
        if result.end_reason is not EndReason.AGENT_SERVER_ERROR:
            return result
        if result.summary.n_tool_calls == 0 or not _sandbox_alive(sandbox):
            return result
        run.report["agent"]["attributed_to_policy"] = True
        return replace(
            result,
            end_reason=EndReason.AGENT_ERROR,
            error=f"agent server lost after the policy's tool calls: {result.error}",
        )

    def _attribute_llm_loss(
        self, sandbox: Sandbox, result: AgentRunResult, run: _Run
    ) -> AgentRunResult:
        """An LLM call that failed *after* the policy ran tools, while the adapter answers
        healthy from the host and the sandbox still answers, is the policy's doing: from its
        shell it can hold every relay connection (the relay answers 503 over its cap) or starve
        the agent server's process. Failures the adapter itself saw are recorded there as
        aborts and keep the last word at close."""
        if result.end_reason is not EndReason.LLM_UNAVAILABLE or result.summary.n_tool_calls == 0:
            return result
        if not _sandbox_alive(sandbox) or not self.adapter.healthy():
            return result
        run.report["agent"]["attributed_to_policy"] = True
        return replace(
            result,
            end_reason=EndReason.AGENT_ERROR,
            error=f"LLM call failed after the policy's tool calls, adapter healthy: {result.error}",
        )

    def _extract_patch(self, sandbox: Sandbox, base: DiffBase, run: _Run) -> str:
        """The agent's patch, taken on the host (:mod:`sandbox_worker.patch_extract`).

        What the agent left decides a refusal: a broken repository (``.git`` replaced, the base
        commit's objects deleted), a tree git cannot read, a patch over the cap: an empty patch
        graded 0, the reason in ``report["patch_error"]`` (its code in ``patch_refused``).
        The base commit existed in a plain ``.git`` when the agent started
        (:func:`check_own_object_store`), so its absence now is the agent's doing. A snapshot
        that fails in a sandbox that still answers is the agent's too (its tree); a sandbox
        that no longer answers, or this host failing, is an infrastructure abort."""
        try:
            return extract_patch(
                sandbox, base.commit, self.settings.workdir, max_bytes=self.settings.max_patch_bytes
            )
        except PatchRefusedError as exc:
            run.report["patch_refused"] = exc.code
            why = str(exc) if isinstance(exc, PatchTooLargeError) else f"git diff failed: {exc}"
            run.report["patch_error"] = why[:1000]
            return ""
        except HostExtractionError as exc:
            raise _Abort(f"patch extraction failed on the worker host: {exc}") from exc
        except (SandboxInfraError, OSError, tarfile.TarError) as exc:
            if not _sandbox_alive(sandbox):
                raise _Abort(f"sandbox lost before the patch was extracted: {exc}") from exc
            run.report["patch_refused"] = "snapshot_failed"
            run.report["patch_error"] = f"snapshot_failed: {type(exc).__name__}: {exc}"[:1000]
            return ""

    def _close(self, run: _Run, outcome: Outcome) -> Outcome:
        """Close the record with the outcome; what the adapter kept has the last word."""
        t0 = time.monotonic()
        outcome = close_record(self.adapter, run.task.trajectory_id, outcome)
        run.timed("close", t0)
        return outcome

    def close(self) -> None:
        """Release the adapter connection pool (the hub and backend belong to the caller)."""
        with contextlib.suppress(Exception):
            self.adapter.close_connection()


def _sandbox_alive(sandbox: Sandbox) -> bool:
    """Whether the sandbox still runs a command (the runner's test for "sandbox lost")."""
    try:
        return sandbox.exec("true", timeout_s=30).exit_code == 0
    except (SandboxInfraError, OSError):
        return False


def _agent_report(result: AgentRunResult) -> dict[str, Any]:
    s = result.summary
    return {
        "end_reason": result.end_reason.value,
        "n_steps": result.n_steps,
        "error": result.error,
        "sdk_status": result.status,
        "n_tool_calls": s.n_tool_calls,
        "n_agent_errors": s.n_agent_errors,
        "n_condensations": s.n_condensations,
        "finish_called": s.finish_called,
        "tools_called": list(s.tools_called),
    }
