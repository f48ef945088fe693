"""Evaluate one patch for one instance in a fresh sandbox, with SWE-bench semantics.

Steps (the SWE-bench harness's ``run_instance`` + ``eval.sh``): create a sandbox from the
instance image with no network -> reset the checkout to the base -> apply the patch with the
harness's fallbacks (``git apply``, ``--3way``, ``--reject``, ``patch --fuzz=5``; pristine tree
between attempts; finally accept a patch that is already applied) -> restore the files the test
patch touches, apply the test patch, run the tests between markers -> grade the log -> destroy
the sandbox.

Outcomes:

* ``infra_error`` set: the infrastructure failed (sandbox not created, image missing, reset
  failed, a harness step or the whole eval run exceeded its exec timeout, the backend raised).
  The worker reports the trajectory as ``aborted``: excluded from training, never scored 0.
* ``applied=False``: the patch does not apply (or is empty) -> not resolved, a legitimate
  reward 0, as in SWE-bench.
* otherwise ``resolved`` as ``swebench.harness.grading`` decides. A test run that exceeds
  ``test_timeout_s`` (a patch that hangs the tests) is graded like the harness grades it: not
  resolved, ``tests_timed_out=True``.
"""

from __future__ import annotations

import logging
import re
import shlex
import time
import uuid

from pydantic import BaseModel, ConfigDict, Field

from sandbox_worker.backends.base import (
    ExecResult,
    NetworkPolicy,
    Sandbox,
    SandboxBackend,
    SandboxInfraError,
    SandboxLimits,
    SandboxSpec,
)
from sandbox_worker.evaluation.constants import (
    APPLY_PATCH_FAIL,
    APPLY_PATCH_PASS,
    GIT_APPLY_CMDS,
    RESTORE_TREE_CMD,
    REVERSE_CHECK_CMD,
    TESTS_TIMEOUT,
    ResolvedStatus,
)
from sandbox_worker.evaluation.grading import (
    get_eval_tests_report,
    get_logs_eval,
    parse_test_exit_code,
    resolution_status,
)
from sandbox_worker.evaluation.log_parser import LOG_PARSERS
from sandbox_worker.evaluation.patches import (
    PatchParseError,
    directives_of_test_patch,
    files_of_test_ids,
    is_empty_patch,
    modified_files,
    new_files,
)
from sandbox_worker.evaluation.script import EvalScriptSpec, eval_script, reset_script
from services.protocol.instance import SWEInstance

log = logging.getLogger(__name__)

DEFAULT_TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
ALREADY_APPLIED = "already applied (git apply --check --reverse)"


class EvalConfig(BaseModel):
    """Settings of one evaluation; defaults follow the SWE-bench harness where it has one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workdir: str = "/testbed"  # the repository inside the sandbox
    scratch_dir: str = "/tmp"  # in-sandbox directory for the patch files, outside the repo
    test_cmd: str = Field(DEFAULT_TEST_CMD, min_length=1)  # used when the instance has none
    log_parser: str = Field("pytest", pattern=r"^pytest$")
    test_timeout_s: int = Field(1800, ge=1)  # harness default
    step_timeout_s: float = Field(120.0, gt=0)  # reset and each patch-apply attempt
    harness_grace_s: float = Field(60.0, gt=0)  # eval exec timeout = test timeout + grace
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    log_tail_chars: int = Field(8000, ge=0)
    # SWE-bench never runs tests for an empty patch (unresolved by definition); set this to
    # run them anyway and report their status (validation uses it to check the base state).
    grade_empty_patch: bool = False


class EvalReport(BaseModel):
    """What the evaluation of one patch found."""

    model_config = ConfigDict(frozen=True)

    instance_id: str
    applied: bool = False
    apply_method: str | None = None
    resolved: bool = False
    tests_run: bool = False
    log_valid: bool = False  # the harness's "patch_successfully_applied" (log parseable)
    tests_timed_out: bool = False
    test_exit_code: int | None = None
    tests_status: dict[str, str] = Field(default_factory=dict)  # node id -> status
    f2p_success: list[str] = Field(default_factory=list)
    f2p_failure: list[str] = Field(default_factory=list)
    p2p_success: list[str] = Field(default_factory=list)
    p2p_failure: list[str] = Field(default_factory=list)
    log_tail: str = ""
    duration_s: float = 0.0
    infra_error: str | None = None

    @property
    def reward(self) -> float | None:
        """1.0 resolved, 0.0 not resolved, None when the infrastructure failed (abort)."""
        if self.infra_error is not None:
            return None
        return 1.0 if self.resolved else 0.0


class _InfraFailure(Exception):
    """Internal: abort the evaluation as an infrastructure failure."""


def sandbox_id_for(instance_id: str) -> str:
    """A unique sandbox id in the backend's alphabet ``[a-z0-9-]``."""
    # Short: a backend's state paths embed "<node>.<sandbox id>" and unix socket paths in
    # them are limited to 108 bytes; ids such as "scikit-learn__scikit-learn-13142" must fit.
    slug = re.sub(r"[^a-z0-9]+", "-", instance_id.lower()).strip("-")[:12].strip("-")
    return f"eval-{slug}-{uuid.uuid4().hex[:10]}"


def evaluate_patch(
    backend: SandboxBackend,
    instance: SWEInstance,
    patch: str | None,
    image: str,
    *,
    node: str = "eval",
    config: EvalConfig | None = None,
) -> EvalReport:
    """Evaluate ``patch`` for ``instance`` in a fresh sandbox from ``image``; never raises
    for infrastructure failures (they come back as ``infra_error``)."""
    config = config or EvalConfig()
    started = time.monotonic()
    spec = SandboxSpec(
        image=image,
        node=node,
        sandbox_id=sandbox_id_for(instance.instance_id),
        workdir=config.workdir,
        limits=config.limits,
        network=NetworkPolicy.NONE,
        labels={"swerl.role": "eval", "swerl.instance": instance.instance_id},
    )
    transcript: list[str] = []
    try:
        sandbox = backend.create(spec)
    except (SandboxInfraError, OSError) as exc:
        return _infra(instance, f"sandbox creation failed: {exc}", transcript, config, started)
    try:
        fields = _evaluate_in(sandbox, instance, patch or "", config, transcript)
    except _InfraFailure as exc:
        return _infra(instance, str(exc), transcript, config, started)
    except PatchParseError as exc:  # the instance's test patch, not the agent's patch
        reason = f"the instance's test patch is malformed: {exc}"
        return _infra(instance, reason, transcript, config, started)
    except (SandboxInfraError, OSError) as exc:
        return _infra(instance, f"sandbox failed: {exc}", transcript, config, started)
    finally:
        try:
            sandbox.destroy()
        except (SandboxInfraError, OSError) as exc:
            log.warning("could not destroy evaluation sandbox %s: %s", spec.sandbox_id, exc)
    return EvalReport(
        instance_id=instance.instance_id,
        log_tail=_tail(transcript, config),
        duration_s=time.monotonic() - started,
        **fields,
    )


def _evaluate_in(
    sandbox: Sandbox,
    instance: SWEInstance,
    patch: str,
    config: EvalConfig,
    transcript: list[str],
) -> dict[str, object]:
    base = instance.base_ref
    result = sandbox.exec(
        reset_script(base), workdir=config.workdir, timeout_s=config.step_timeout_s
    )
    transcript.append(f"$ reset to {base}\n{result.output}")
    if result.timed_out or result.exit_code != 0:
        raise _InfraFailure(f"reset to the base commit failed (exit {result.exit_code})")

    fields: dict[str, object] = {}
    if is_empty_patch(patch):
        transcript.append("empty patch: nothing to apply")
        if not config.grade_empty_patch:
            return fields
    else:
        method = _apply(sandbox, patch, config, transcript)
        if method is None:
            return fields
        fields.update(applied=True, apply_method=method)

    output = _run_tests(sandbox, instance, config, transcript)
    # An invalid log comes back as an empty status map: every listed test then fails.
    status_map, log_valid = get_logs_eval(output, LOG_PARSERS[config.log_parser])
    report = get_eval_tests_report(status_map, instance.FAIL_TO_PASS, instance.PASS_TO_PASS)
    resolved = (
        bool(fields.get("applied"))
        and log_valid
        and resolution_status(report) is ResolvedStatus.FULL
    )
    fields.update(
        resolved=resolved,
        tests_run=True,
        log_valid=log_valid,
        tests_timed_out=TESTS_TIMEOUT in output,
        test_exit_code=parse_test_exit_code(output),
        tests_status=status_map,
        **report.model_dump(),
    )
    return fields


def _apply(sandbox: Sandbox, patch: str, config: EvalConfig, transcript: list[str]) -> str | None:
    """Apply ``patch`` with the harness's fallbacks; the command that worked, or None."""
    path = f"{config.scratch_dir}/swerl-model.diff"
    sandbox.write_file(path, patch.encode())
    for attempt, command in enumerate(GIT_APPLY_CMDS):
        if attempt:
            _step(sandbox, RESTORE_TREE_CMD, config, transcript)
        result = _step(sandbox, f"{command} {shlex.quote(path)}", config, transcript)
        if result.exit_code == 0:
            transcript.append(f"{APPLY_PATCH_PASS}: {command}")
            return command
    result = _step(sandbox, f"{REVERSE_CHECK_CMD} {shlex.quote(path)}", config, transcript)
    if result.exit_code == 0:
        transcript.append(f"{APPLY_PATCH_PASS}: {ALREADY_APPLIED}")
        return ALREADY_APPLIED
    transcript.append(APPLY_PATCH_FAIL)
    return None


def _step(sandbox: Sandbox, command: str, config: EvalConfig, transcript: list[str]) -> ExecResult:
    result = sandbox.exec(command, workdir=config.workdir, timeout_s=config.step_timeout_s)
    transcript.append(f"$ {command}\n{result.output}")
    if result.timed_out:
        raise _InfraFailure(f"harness step timed out after {config.step_timeout_s}s: {command}")
    return result


def _run_tests(
    sandbox: Sandbox, instance: SWEInstance, config: EvalConfig, transcript: list[str]
) -> str:
    test_patch_path = None
    if instance.test_patch:
        test_patch_path = f"{config.scratch_dir}/swerl-test.diff"
        sandbox.write_file(test_patch_path, instance.test_patch.encode())
        files = directives_of_test_patch(instance.test_patch)
    else:
        files = files_of_test_ids(instance.FAIL_TO_PASS + instance.PASS_TO_PASS)
    runner = instance.test_cmd or config.test_cmd
    script = eval_script(
        EvalScriptSpec(
            workdir=config.workdir,
            base_ref=instance.base_ref,
            test_patch_path=test_patch_path,
            modified_files=modified_files(instance.test_patch),
            new_files=new_files(instance.test_patch),
            test_command=" ".join([runner, *(shlex.quote(f) for f in files)]),
            test_timeout_s=config.test_timeout_s,
        )
    )
    script_path = f"{config.scratch_dir}/swerl-eval.sh"
    sandbox.write_file(script_path, script.encode(), mode=0o755)
    result = sandbox.exec(
        f"/bin/bash {shlex.quote(script_path)}",
        workdir=config.workdir,
        timeout_s=config.test_timeout_s + config.harness_grace_s,
    )
    transcript.append(f"$ eval script\n{result.output}")
    if result.timed_out:
        raise _InfraFailure(
            f"the evaluation run exceeded its exec timeout "
            f"({config.test_timeout_s + config.harness_grace_s:.0f}s)"
        )
    return result.output


def _tail(transcript: list[str], config: EvalConfig) -> str:
    text = "\n".join(transcript)
    return text[-config.log_tail_chars :] if config.log_tail_chars else ""


def _infra(
    instance: SWEInstance, reason: str, transcript: list[str], config: EvalConfig, started: float
) -> EvalReport:
    log.warning("evaluation of %s aborted: %s", instance.instance_id, reason)
    return EvalReport(
        instance_id=instance.instance_id,
        infra_error=reason,
        log_tail=_tail(transcript, config),
        duration_s=time.monotonic() - started,
    )
