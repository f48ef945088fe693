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
  ``config_error`` set as well: the failure is the same on every attempt (the configured
  choices cannot grade the row, ``row_grading.py``; no spec, profile or parser for it; an
  image that cannot hold it; a malformed test patch): the worker does not retry it.
* ``applied=False``: the patch does not apply (or is empty) -> not resolved, a legitimate
  reward 0, as in SWE-bench; also a patch refused before applying because applying it would
  write into ``.git``, outside the repository or through a symlink it creates
  (``patch_rejected``).
* test infrastructure the patch added, changed or deleted (``infra.py``: hook, ini and
  start-up files, plugins, test directories, symlinks, modules shadowing pytest or the
  standard library) is restored to the base before the tests run; ``protected_restored``
  lists each restored path and why.
* otherwise ``resolved`` as ``swebench.harness.grading`` decides (``grading="swebench"``), or,
  by default (``grading="structured"``, the training reward), only if *both* the official log
  parser and the structured report (``structured_report.py``: a pytest plugin writing JSON
  lines to a per-run random path outside the repository, plus an exit-status cross-check) say
  resolved. A test run that exceeds
  ``test_timeout_s`` (a patch that hangs the tests) is graded like the harness grades it: not
  resolved, ``tests_timed_out=True``.
"""

from __future__ import annotations

import logging
import random
import re
import secrets
import shlex
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandbox_worker.backends.base import (
    DiskQuotaError,
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
    STRICT_APPLY_CMDS,
    TESTS_TIMEOUT,
    ResolvedStatus,
)
from sandbox_worker.evaluation.grading import (
    get_eval_tests_report,
    get_logs_eval,
    parse_test_exit_code,
    resolution_status,
)
from sandbox_worker.evaluation.infra import (
    RestorePlan,
    TestInfraRule,
    TreeState,
    plan_restore,
    protected_at_base,
    rule_for,
)
from sandbox_worker.evaluation.log_parser import HARNESS_PARSERS, LOG_PARSERS, LogParser
from sandbox_worker.evaluation.patches import (
    PatchParseError,
    directives_of_test_patch,
    is_empty_patch,
    modified_files,
    new_files,
    patch_names_git_dir,
    strict_patch_refusal,
)
from sandbox_worker.evaluation.row_grading import (
    GradingChoice,
    GradingConfigError,
    ScriptChoice,
    row_grading,
)
from sandbox_worker.evaluation.script import (
    TIMEOUT_EXIT_CODE,
    EvalScriptSpec,
    PreludeSpec,
    capture_tree_script,
    eval_script,
    git_state_script,
    inspect_patched_tree_script,
    isolated,
    prelude_script,
    reset_script,
    restore_script,
    safe_pytest_command,
)
from sandbox_worker.evaluation.specs import (
    UnknownSpecError,
    harness_eval_script,
    harness_parser_name,
)
from sandbox_worker.evaluation.structured_report import (
    MAX_REPORT_BYTES,
    StructuredReport,
    parse_structured_report,
)
from sandbox_worker.evaluation.swesmith_profiles import (
    UnknownProfileError,
    graded_test_files,
    profile_test_command,
)
from sandbox_worker.task_state import TaskStateError, prepare_task
from services.protocol.instance import REPO_PATTERN, SWEInstance

if TYPE_CHECKING:
    from sandbox_worker.evaluation.canaries import CanaryPlan

log = logging.getLogger(__name__)

DEFAULT_TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"
_PLUGIN_SOURCE = (Path(__file__).parent / "pytest_report_plugin.py").read_bytes()
_LAUNCHER_SOURCE = (Path(__file__).parent / "safe_pytest.py").read_bytes()
# Free space and inodes under which a failed harness step after the apply is the patch's doing.
QUOTA_EXHAUSTED_BYTES = 1 << 20
QUOTA_EXHAUSTED_INODES = 64
ALREADY_APPLIED = "already applied (git apply --check --reverse)"


class EvalConfig(BaseModel):
    """Settings of one evaluation; defaults follow the SWE-bench harness where it has one."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workdir: str = "/testbed"  # the repository inside the sandbox
    scratch_dir: str = "/tmp"  # in-sandbox directory for the patch files, outside the repo
    test_cmd: str = Field(DEFAULT_TEST_CMD, min_length=1)  # used when the instance has none
    # "pytest" (swerl's), a harness parser name ("parse_log_django" ...), or "auto": the
    # harness's parser for each row (its log_parser field, else its repository's; specs.py).
    log_parser: str = Field("pytest", pattern=r"^(?:pytest|auto|parse_log_[a-z0-9_]+)$")
    # "swerl": swerl's eval script (script.py); "harness": exactly the official harness's
    # script for the row (the row's eval_script, else the harness's spec for its repository and
    # version; specs.py), for benchmark parity on the harness's images. Needs
    # grading="swebench" (the harness's script loads no structured-report plugin). "auto": per
    # row (row_grading.py): the harness's where the row has a harness spec, else swerl's.
    eval_script: ScriptChoice = "swerl"
    test_timeout_s: int = Field(1800, ge=1)  # harness default
    # Per-repository test timeouts ("owner/name" -> seconds) over test_timeout_s: a slow
    # suite (sympy, astropy...) gets more time without raising it for every repository.
    test_timeout_by_repo: dict[str, int] = Field(default_factory=dict)
    step_timeout_s: float = Field(120.0, gt=0)  # reset and each patch-apply attempt
    harness_grace_s: float = Field(60.0, gt=0)  # eval exec timeout = test timeout + grace
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    log_tail_chars: int = Field(8000, ge=0)
    # Keep the whole output of the test run (the harness's test_output.txt) on the report
    # (``test_output``): the evaluation script writes it to its per-instance logs.
    keep_test_output: bool = False
    # SWE-bench never runs tests for an empty patch (unresolved by definition); set this to
    # run them anyway and report their status (validation uses it to check the base state).
    grade_empty_patch: bool = False
    # "structured" (training rewards): resolved only if the structured report *and* the
    # official log parser say so; "swebench": the official log parser alone (benchmark parity);
    # "auto": structured where swerl's script runs, swebench where the harness's does.
    grading: GradingChoice = "structured"
    # Restore test infrastructure the patch touched (off only to grade predictions that
    # change it as the official harness does).
    restore_test_infra: bool = True
    # "strict" (training rewards, the hardened verdict): git-format unified diffs only, every
    # path checked (patches.strict_patch_refusal), applied with `git apply` alone; a refusal is
    # reward 0 (patch_rejected). "harness": the official harness's cascade, GNU `patch`
    # fallback included, nothing refused (leaderboard parity; tamper flags still reported).
    patch_policy: Literal["strict", "harness"] = "strict"
    # Structured grading plants canaries in the test files the run executes (canaries.py):
    # tests that must fail, indistinguishable from the instance's own.
    canary_test: bool = True
    canary_count: int = Field(3, ge=1, le=20)
    # Move .git out of the repository while swerl's script runs the tests (the code under test
    # cannot diff its way to the canaries); off for repositories whose tests read git.
    hide_git: bool = True
    # Start pytest through safe_pytest.py: no module of the repository runs before pytest
    # has loaded its plugins (swerl's script and a pytest runner only).
    safe_sys_path: bool = True
    # Test-infrastructure rules by repository ("owner/name"; "*" replaces the default rule),
    # over the built-in ones (sandbox_worker.evaluation.infra.REPO_RULES).
    infra_rules: dict[str, TestInfraRule] = Field(default_factory=dict)

    @field_validator("test_timeout_by_repo")
    @classmethod
    def _repo_timeouts(cls, value: dict[str, int]) -> dict[str, int]:
        for repo, seconds in value.items():
            if not re.fullmatch(REPO_PATTERN, repo):
                raise ValueError(f"test_timeout_by_repo: {repo!r} is not an owner/name repository")
            if seconds < 1:
                raise ValueError(f"test_timeout_by_repo[{repo!r}]: must be >= 1, got {seconds}")
        return value

    def for_repo(self, repo: str) -> EvalConfig:
        """This config with the test timeout of ``repo`` (its test_timeout_by_repo entry)."""
        seconds = self.test_timeout_by_repo.get(repo)
        if seconds is None or seconds == self.test_timeout_s:
            return self
        return self.model_copy(update={"test_timeout_s": seconds})

    def for_row(self, instance: SWEInstance) -> EvalConfig:
        """This config resolved for one row: no ``auto`` choice left, its repository's test
        timeout; :class:`GradingConfigError` when the choices cannot grade the row right."""
        chosen = row_grading(instance, self.eval_script, self.grading, self.log_parser)
        resolved = self.for_repo(instance.repo)
        update = {
            "eval_script": chosen.eval_script,
            "grading": chosen.grading,
            "log_parser": chosen.log_parser,
        }
        if all(getattr(resolved, key) == value for key, value in update.items()):
            return resolved
        return resolved.model_copy(update=update)

    @model_validator(mode="after")
    def _consistent(self) -> EvalConfig:
        if self.log_parser != "auto" and self.log_parser not in LOG_PARSERS:
            known = ", ".join(["auto", *sorted(LOG_PARSERS)])
            raise ValueError(f"unknown log_parser {self.log_parser!r} (known: {known})")
        if self.eval_script == "harness" and self.grading == "structured":
            raise ValueError('eval_script="harness" needs grading="swebench"')
        return self


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
    # The infra_error is deterministic (the configuration or the row cannot grade this
    # instance: the same on every attempt): the worker does not retry it.
    config_error: bool = False
    # Why the patch was refused before applying it (it writes into .git or through a symlink
    # it creates): graded like a patch that does not apply.
    patch_rejected: str | None = None
    # Test infrastructure the patch touched and the evaluation restored: path -> reason.
    protected_restored: dict[str, str] = Field(default_factory=dict)
    # Test infrastructure the patch touched (path -> reason), restored or not.
    infra_touched: dict[str, str] = Field(default_factory=dict)
    # Why the strict parser refuses the patch (filled under either patch policy).
    strict_refusal: str | None = None
    # .git differs after the patch from its state after the reset (or the patch names it).
    git_touched: bool = False
    # A failure after the patch was applied that the patch caused (the sandbox's disk quota
    # exhausted, the sandbox killed by the code under test): graded 0, never an abort.
    patch_caused_failure: str | None = None
    # Sorted tamper flags: test_infra_touched, git_touched, patch_refused_strict, canary_forged.
    tamper: list[str] = Field(default_factory=list)
    grading: str = "structured"
    log_resolved: bool | None = None  # the official log parser's verdict (structured mode)
    log_tests_status: dict[str, str] = Field(default_factory=dict)  # the log parser's map
    structured_problem: str | None = None  # why the structured report was not trusted
    test_output: str | None = None  # the test run's whole output (``keep_test_output``)

    @property
    def reward(self) -> float | None:
        """1.0 resolved, 0.0 not resolved, None when the infrastructure failed (abort)."""
        if self.infra_error is not None:
            return None
        return 1.0 if self.resolved else 0.0


class _InfraFailure(Exception):
    """Internal: abort the evaluation as an infrastructure failure."""


class _ConfigFailure(_InfraFailure):
    """Internal: abort the evaluation for a deterministic reason (``config_error``)."""


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
    transcript: list[str] = []
    try:
        config = config.for_row(instance)
    except GradingConfigError as exc:
        return _infra(instance, str(exc), transcript, config, started, config_error=True)
    spec = SandboxSpec(
        image=image,
        node=node,
        sandbox_id=sandbox_id_for(instance.instance_id),
        workdir=config.workdir,
        limits=config.limits,
        network=NetworkPolicy.NONE,
        labels={"swerl.role": "eval", "swerl.instance": instance.instance_id},
    )
    try:
        sandbox = backend.create(spec)
    except (SandboxInfraError, OSError) as exc:
        return _infra(instance, f"sandbox creation failed: {exc}", transcript, config, started)
    fields: dict[str, object] = {"grading": config.grading}
    try:
        _evaluate_in(sandbox, instance, patch or "", config, transcript, fields)
    except (_InfraFailure, SandboxInfraError, OSError) as exc:
        cause = _patch_caused(backend, sandbox, image, config, fields, exc)
        if cause is None:
            deterministic = isinstance(exc, _ConfigFailure)
            prefix = "" if isinstance(exc, _InfraFailure) else "sandbox failed: "
            reason = f"{prefix}{exc}"
            return _infra(instance, reason, transcript, config, started, config_error=deterministic)
        transcript.append(f"graded 0: {cause} ({exc})")
        fields.update(resolved=False, patch_caused_failure=cause)
    except PatchParseError as exc:  # the instance's test patch, not the agent's patch
        reason = (
            f"the instance's test patch is malformed: {exc} (fix the row in the dataset file, "
            "worker.rollout.instances)"
        )
        return _infra(instance, reason, transcript, config, started, config_error=True)
    finally:
        try:
            sandbox.destroy()
        except (SandboxInfraError, OSError) as exc:
            log.warning("could not destroy evaluation sandbox %s: %s", spec.sandbox_id, exc)
    fields["tamper"] = _tamper_flags(fields)
    return EvalReport(
        instance_id=instance.instance_id,
        log_tail=_tail(transcript, config),
        duration_s=time.monotonic() - started,
        **fields,
    )


def _tamper_flags(fields: dict[str, object]) -> list[str]:
    flags = {
        "test_infra_touched": bool(fields.get("infra_touched")),
        "git_touched": bool(fields.get("git_touched")),
        "patch_refused_strict": fields.get("strict_refusal") is not None,
        "canary_forged": bool(fields.get("canary_forged")),
    }
    return sorted(name for name, raised in flags.items() if raised)


def _patch_caused(
    backend: SandboxBackend,
    sandbox: Sandbox,
    image: str,
    config: EvalConfig,
    fields: dict[str, object],
    exc: BaseException,
) -> str | None:
    """Why a failure after the patch was applied is the patch's doing, or None (then it is
    the infrastructure's). Only the patch and the code under test run after the apply: a
    full disk or inode quota (a compressed binary patch can expand to fill it) and a sandbox
    that died while the backend is healthy (the tests killed it) are theirs."""
    if not fields.get("applied") or isinstance(exc, _ConfigFailure):
        return None
    if isinstance(exc, DiskQuotaError):
        return "the patch exhausted the sandbox's disk quota"
    if isinstance(exc, _InfraFailure) and "timed out" in str(exc):
        return None  # a wedged harness step: the infrastructure's
    try:
        probe = sandbox.exec(
            f"stat -f -c '%a %S %d' {_q(config.workdir)}", timeout_s=config.step_timeout_s
        )
    except (SandboxInfraError, OSError):
        probe = None
    if probe is None or probe.timed_out or probe.exit_code != 0:
        try:
            healthy = backend.image_available(image)
        except (SandboxInfraError, OSError):
            healthy = False
        return "the sandbox died after the patch was applied" if healthy else None
    values = probe.output.split()
    if len(values) == 3 and all(v.isdigit() for v in values):
        free_blocks, block_size, free_inodes = (int(v) for v in values)
        if free_blocks * block_size < QUOTA_EXHAUSTED_BYTES or free_inodes < QUOTA_EXHAUSTED_INODES:
            return "the patch exhausted the sandbox's disk quota"
    return None


def _evaluate_in(
    sandbox: Sandbox,
    instance: SWEInstance,
    patch: str,
    config: EvalConfig,
    transcript: list[str],
    fields: dict[str, object],
) -> None:
    if instance.is_swesmith:  # the task state first: bug applied, F2P tests hidden
        try:
            instance = prepare_task(
                sandbox,
                instance,
                config.workdir,
                scratch_dir=config.scratch_dir,
                timeout_s=config.step_timeout_s,
                prune=False,  # no agent sees this sandbox: the commit is what matters
            )
        except TaskStateError as exc:
            raise _ConfigFailure(
                f"wrong image: {exc} (check worker.rollout.image_dataset / image_namespace: "
                "the image must hold the row's repository)"
            ) from None
        transcript.append(f"$ task state of {instance.instance_id}: {instance.base_commit}")
    base = instance.base_ref
    result = sandbox.exec(
        isolated(reset_script(base)), workdir=config.workdir, timeout_s=config.step_timeout_s
    )
    transcript.append(f"$ reset to {base}\n{result.output}")
    if result.timed_out or result.exit_code != 0:
        raise _InfraFailure(f"reset to the base commit failed (exit {result.exit_code})")
    pinned = _pinned_commit(result.output, base)
    work = f"{config.scratch_dir}/swerl-{secrets.token_hex(8)}"
    applied = _put_patch(sandbox, instance, patch, work, config, transcript, fields)
    if applied is not None:
        _run_and_grade(sandbox, instance, pinned, work, applied, config, transcript, fields)


@dataclass(frozen=True)
class _Applied:
    """What the graded run needs to know about the applied patch (None fields: nothing
    applied, an empty patch graded on the base)."""

    rule: TestInfraRule
    base_tree: _BaseTree | None
    git_before: str | None


def _put_patch(
    sandbox: Sandbox,
    instance: SWEInstance,
    patch: str,
    work: str,
    config: EvalConfig,
    transcript: list[str],
    fields: dict[str, object],
) -> _Applied | None:
    """Check and apply the patch (into ``fields``); None when no test is to run (nothing
    applied, a refused patch, or an empty patch that is not graded)."""
    rule = rule_for(instance.repo, config.infra_rules)
    if is_empty_patch(patch):
        transcript.append("empty patch: nothing to apply")
        return _Applied(rule, None, None) if config.grade_empty_patch else None
    refusal = strict_patch_refusal(patch)
    fields["strict_refusal"] = refusal
    fields["git_touched"] = patch_names_git_dir(patch)
    if refusal is not None and config.patch_policy == "strict":
        transcript.append(f"{APPLY_PATCH_FAIL}: rejected: {refusal}")
        fields["patch_rejected"] = refusal
        return None
    base_tree = _capture_base(sandbox, work, rule, config, transcript)
    git_before = _git_state(sandbox, config, transcript)
    method = _apply(sandbox, patch, config, transcript)
    if method is None:
        return None
    fields.update(applied=True, apply_method=method)
    return _Applied(rule, base_tree, git_before)


def _after_apply_checks(
    sandbox: Sandbox,
    instance: SWEInstance,
    pinned: str,
    work: str,
    applied: _Applied,
    config: EvalConfig,
    transcript: list[str],
    fields: dict[str, object],
    harness_written: set[str],
) -> bool:
    """After the last git command before the tests: ``.git`` against its state after the
    reset, then the test infrastructure the patch touched (restored if configured). False
    when the strict policy stops here (``.git`` changed)."""
    git_now = None if applied.git_before is None else _git_state(sandbox, config, transcript)
    if git_now is not None and git_now != applied.git_before:
        fields["git_touched"] = True
        if config.patch_policy == "strict":
            reason = "the patch changed .git"
            transcript.append(f"{APPLY_PATCH_FAIL}: rejected: {reason}")
            fields.update(patch_rejected=reason, applied=False)
            return False
    if applied.base_tree is not None:
        plan = _inspect_infra(
            sandbox, instance, pinned, work, applied, config, transcript, harness_written
        )
        fields["infra_touched"] = plan.reasons
        if plan and config.restore_test_infra:
            _restore_infra(sandbox, pinned, work, plan, config, transcript)
            fields["protected_restored"] = plan.reasons
    return True


def _run_and_grade(
    sandbox: Sandbox,
    instance: SWEInstance,
    pinned: str,
    work: str,
    applied: _Applied,
    config: EvalConfig,
    transcript: list[str],
    fields: dict[str, object],
) -> None:
    """Run the tests and grade them into ``fields`` (the log, the structured report and the
    canaries)."""
    structured = config.grading == "structured"
    parser = _log_parser(instance, config)  # an unknown parser aborts before the run
    plan: CanaryPlan | None = None
    if config.eval_script == "harness" and not instance.is_swesmith:
        if not _after_apply_checks(
            sandbox, instance, pinned, work, applied, config, transcript, fields, set()
        ):
            return
        output = _run_harness_script(sandbox, instance, config, transcript)
    else:
        run = _prepare_swerl_run(
            sandbox, instance, pinned, work, applied, config, transcript, fields
        )
        if run is None:
            return
        plan = run.canaries
        output = _run_tests(sandbox, run, config, transcript, work if structured else None)
    if config.keep_test_output:
        fields["test_output"] = output
    # An invalid log comes back as an empty status map: every listed test then fails.
    status_map, log_valid = get_logs_eval(output, parser)
    canary_problem = _check_canaries(status_map, plan)
    status_map = _without_canaries(status_map, plan)
    report = get_eval_tests_report(status_map, instance.FAIL_TO_PASS, instance.PASS_TO_PASS)
    resolved = (
        bool(fields.get("applied"))
        and log_valid
        and resolution_status(report) is ResolvedStatus.FULL
    )
    test_exit_code = parse_test_exit_code(output)
    if structured:
        fields.update(log_resolved=resolved, log_tests_status=status_map)
        parsed = _read_structured(sandbox, work, config, transcript)
        problem = parsed.problem
        if problem is None and plan is not None:
            problem = (
                plan_problem(plan) or _check_canaries(parsed.status_map, plan) or canary_problem
            )
            if problem is not None and plan.problem is None:
                fields["canary_forged"] = True
        fields["structured_problem"] = problem
        status_map = _without_canaries(parsed.status_map, plan) if problem is None else {}
        test_exit_code = _read_exit_code(sandbox, work)
        report = get_eval_tests_report(status_map, instance.FAIL_TO_PASS, instance.PASS_TO_PASS)
        resolved = resolved and problem is None and resolution_status(report) is ResolvedStatus.FULL
    fields.update(
        resolved=resolved,
        tests_run=True,
        log_valid=log_valid,
        tests_timed_out=TESTS_TIMEOUT in output,
        test_exit_code=test_exit_code,
        tests_status=status_map,
        **report.model_dump(),
    )


def _check_canaries(status_map: dict[str, str], plan: CanaryPlan | None) -> str | None:
    from sandbox_worker.evaluation.canaries import check_canaries

    return None if plan is None or plan.problem else check_canaries(status_map, plan)


def plan_problem(plan: CanaryPlan) -> str | None:
    """Why a run without canaries cannot be trusted for a training reward."""
    return plan.problem  # "canary_unavailable: <why>"


def _without_canaries(status_map: dict[str, str], plan: CanaryPlan | None) -> dict[str, str]:
    """The status map without the planted tests (canaries and mutants, parameters included)."""
    if plan is None:
        return status_map
    planted = [*plan.canaries, *(mutant for _, mutant in plan.mutations)]
    return {
        test: status
        for test, status in status_map.items()
        if not any(test == p or test.startswith(f"{p}[") for p in planted)
    }


@dataclass(frozen=True)
class _SwerlRun:
    test_command: str
    canaries: CanaryPlan | None
    launcher: str | None


def _prepare_swerl_run(
    sandbox: Sandbox,
    instance: SWEInstance,
    pinned: str,
    work: str,
    applied: _Applied,
    config: EvalConfig,
    transcript: list[str],
    fields: dict[str, object],
) -> _SwerlRun | None:
    """swerl's steps before the tests: the harness's git prelude (test files restored, test
    patch applied), then the checks of the tree, then the canaries; None when the strict
    policy stops the run."""
    config = config.for_repo(instance.repo)
    command = None
    if config.eval_script == "harness":  # SWE-smith under its harness: its profile's command
        try:
            command = profile_test_command(instance)
        except UnknownProfileError as exc:
            raise _ConfigFailure(str(exc)) from None
    test_patch_path = None
    if instance.test_patch:
        test_patch_path = f"{config.scratch_dir}/swerl-test.diff"
        sandbox.write_file(test_patch_path, instance.test_patch.encode())
    modified, created = modified_files(instance.test_patch), new_files(instance.test_patch)
    prelude = prelude_script(
        PreludeSpec(config.workdir, instance.base_ref, test_patch_path, modified, created)
    )
    _step(sandbox, prelude, config, transcript)
    if not _after_apply_checks(
        sandbox, instance, pinned, work, applied, config, transcript, fields, {*modified, *created}
    ):
        return None
    if instance.test_patch and not instance.is_swesmith:
        files = directives_of_test_patch(instance.test_patch)
    else:  # SWE-smith's test patch holds the hidden F2P files only: run every graded file
        f2p_files, p2p_files = graded_test_files(instance)
        files = list(dict.fromkeys(f2p_files + p2p_files))
    structured = config.grading == "structured" and command is None
    plan = None
    if structured and config.canary_test:
        plan = _plant_canaries(sandbox, instance, files, config, transcript)
    runner = instance.test_cmd or config.test_cmd
    command = command or " ".join([runner, *(shlex.quote(f) for f in files)])
    launcher = None
    if config.safe_sys_path and structured:
        launcher = f"{work}/safe_pytest.py"
        safe = safe_pytest_command(command, launcher, config.workdir)
        if safe is None:
            launcher = None
        else:
            command = safe
    return _SwerlRun(command, plan, launcher)


MAX_CANARY_SOURCE_BYTES = 4 << 20


def _plant_canaries(
    sandbox: Sandbox,
    instance: SWEInstance,
    files: list[str],
    config: EvalConfig,
    transcript: list[str],
) -> CanaryPlan:
    """Read the test files of the run, plant the canaries (host side), write them back."""
    from sandbox_worker.evaluation.canaries import plant_canaries

    sources: dict[str, str] = {}
    for path in files:
        try:
            raw = sandbox.read_file(f"{config.workdir}/{path}")
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            continue
        if len(raw) <= MAX_CANARY_SOURCE_BYTES:
            try:
                sources[path] = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
    plan = plant_canaries(
        sources, list(instance.FAIL_TO_PASS), random.SystemRandom(), config.canary_count
    )
    for path, text in plan.files.items():
        sandbox.write_file(f"{config.workdir}/{path}", text.encode("utf-8"))
    transcript.append(
        f"planted {len(plan.canaries)} canaries and {len(plan.mutations)} mutants"
        + (f" (problem: {plan.problem})" if plan.problem else "")
    )
    return plan


def _git_state(sandbox: Sandbox, config: EvalConfig, transcript: list[str]) -> str:
    result = sandbox.exec(
        git_state_script(config.workdir), workdir=config.workdir, timeout_s=config.step_timeout_s
    )
    if result.timed_out:
        raise _InfraFailure(f"harness step timed out after {config.step_timeout_s}s: .git state")
    return f"{result.exit_code}\n{result.output}"


def _pinned_commit(reset_output: str, base: str) -> str:
    """The commit the reset left checked out (its last output line), else ``base``."""
    lines = [line.strip() for line in reset_output.splitlines() if line.strip()]
    if lines and re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", lines[-1]):
        return lines[-1]
    return base


def _capture_base(
    sandbox: Sandbox, work: str, rule: TestInfraRule, config: EvalConfig, transcript: list[str]
) -> _BaseTree:
    """Record the base tree (every non-directory entry, which are tracked) and snapshot the
    protected files git cannot restore (untracked at the base: egg-info, caches...)."""
    _checked(sandbox, capture_tree_script(work, "before", tracked=True), config, transcript)
    before = TreeState.parse(sandbox.read_file(f"{work}/before"))
    tracked = _nul_paths(sandbox.read_file(f"{work}/tracked"))
    untracked = [p for p in protected_at_base(before, rule) if p not in tracked]
    sandbox.write_file(f"{work}/snaplist", _nul_join(untracked))
    if untracked:
        _checked(
            sandbox,
            f"tar --null -T {_q(work)}/snaplist -cf {_q(work)}/snap.tar"
            f" && xargs -0 -r sha256sum -z -- < {_q(work)}/snaplist > {_q(work)}/before.sha",
            config,
            transcript,
        )
    return _BaseTree(before, tracked, set(untracked))


@dataclass(frozen=True)
class _BaseTree:
    tree: TreeState  # every non-directory entry before the patch
    tracked: set[str]  # paths git tracks at the base
    snapshot: set[str]  # protected untracked paths saved in snap.tar


def _inspect_infra(
    sandbox: Sandbox,
    instance: SWEInstance,
    pinned: str,
    work: str,
    applied: _Applied,
    config: EvalConfig,
    transcript: list[str],
    harness_written: set[str],
) -> RestorePlan:
    """The test infrastructure the patch touched (see ``infra.py``); ``harness_written``: the
    files the harness itself just wrote (the test patch's), never the patch's doing."""
    base = applied.base_tree
    assert base is not None
    script = inspect_patched_tree_script(work, pinned, hash_snapshot=bool(base.snapshot))
    _checked(sandbox, script, config, transcript)
    after = TreeState.parse(sandbox.read_file(f"{work}/after"))
    changed_tracked = _nul_paths(sandbox.read_file(f"{work}/changed"))
    changed_untracked: set[str] = set()
    if base.snapshot:
        before_sha = _sha_lines(sandbox.read_file(f"{work}/before.sha"))
        after_sha = _sha_lines(sandbox.read_file(f"{work}/after.sha"))
        changed_untracked = {p for p in base.snapshot if before_sha.get(p) != after_sha.get(p)}
    exempt = set(harness_written)
    if instance.patch:
        gold = instance.gold_patch
        exempt |= set(modified_files(gold)) | set(new_files(gold))
    return plan_restore(
        base.tree,
        after,
        tracked=base.tracked,
        changed_tracked=changed_tracked,
        changed_untracked=changed_untracked,
        rule=applied.rule,
        exempt=exempt,
    )


def _restore_infra(
    sandbox: Sandbox,
    pinned: str,
    work: str,
    plan: RestorePlan,
    config: EvalConfig,
    transcript: list[str],
) -> None:
    """Undo the patch's changes to test infrastructure (see ``infra.py``)."""
    lists = {"rm": plan.remove, "checkout": plan.checkout, "extract": plan.extract}
    for name, paths in lists.items():
        sandbox.write_file(f"{work}/{name}", _nul_join(paths))
    transcript.append(
        "restoring test infrastructure the patch changed:\n"
        + "\n".join(f"  {path}: {why}" for path, why in plan.reasons.items())
    )
    _checked(sandbox, restore_script(work, pinned), config, transcript)


def _checked(sandbox: Sandbox, command: str, config: EvalConfig, transcript: list[str]) -> None:
    result = _step(sandbox, command, config, transcript)
    if result.exit_code != 0:
        raise _InfraFailure(f"harness step failed (exit {result.exit_code}): {command[:200]}")


def _nul_paths(raw: bytes) -> set[str]:
    return {p.decode("utf-8", "surrogateescape") for p in raw.split(b"\0") if p}


def _nul_join(paths: list[str]) -> bytes:
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)


def _sha_lines(raw: bytes) -> dict[str, str]:
    """``sha256sum -z`` output: ``<hash>  <path>\\0`` records."""
    result = {}
    for record in raw.split(b"\0"):
        if len(record) > 66 and record[64:66] == b"  ":
            result[record[66:].decode("utf-8", "surrogateescape")] = record[:64].decode()
    return result


def _read_structured(
    sandbox: Sandbox, work: str, config: EvalConfig, transcript: list[str]
) -> StructuredReport:
    path = f"{work}/report.jsonl"
    size = sandbox.exec(f"stat -c %s {_q(path)}", timeout_s=config.step_timeout_s)
    if size.exit_code != 0 or not size.output.strip().isdigit():
        return StructuredReport(problem="the structured report is missing")
    if int(size.output.strip()) > MAX_REPORT_BYTES:
        return StructuredReport(problem="the structured report is too large")
    text = sandbox.read_file(path).decode("utf-8", "replace")
    parsed = parse_structured_report(text, _read_exit_code(sandbox, work))
    if parsed.problem:
        transcript.append(f"structured report not trusted: {parsed.problem}")
    return parsed


def _read_exit_code(sandbox: Sandbox, work: str) -> int | None:
    try:
        text = sandbox.read_file(f"{work}/exit_code").decode().strip()
    except (SandboxInfraError, OSError):
        return None
    return int(text) if re.fullmatch(r"-?\d+", text) else None


def _q(value: str) -> str:
    return shlex.quote(value)


def _apply(sandbox: Sandbox, patch: str, config: EvalConfig, transcript: list[str]) -> str | None:
    """Apply ``patch`` with the harness's fallbacks (without GNU ``patch`` under the strict
    policy); the command that worked, or None."""
    path = f"{config.scratch_dir}/swerl-model.diff"
    sandbox.write_file(path, patch.encode())
    commands = STRICT_APPLY_CMDS if config.patch_policy == "strict" else GIT_APPLY_CMDS
    for attempt, command in enumerate(commands):
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
    result = sandbox.exec(
        isolated(command), workdir=config.workdir, timeout_s=config.step_timeout_s
    )
    transcript.append(f"$ {command}\n{result.output}")
    if result.timed_out:
        raise _InfraFailure(f"harness step timed out after {config.step_timeout_s}s: {command}")
    return result


def _log_parser(instance: SWEInstance, config: EvalConfig) -> LogParser:
    if config.log_parser != "auto":
        return LOG_PARSERS[config.log_parser]
    try:
        return HARNESS_PARSERS[harness_parser_name(instance)]
    except ValueError as exc:
        raise _ConfigFailure(f"{exc} (evaluation.log_parser, or the row's log_parser)") from None


def _run_harness_script(
    sandbox: Sandbox, instance: SWEInstance, config: EvalConfig, transcript: list[str]
) -> str:
    """Run the official harness's eval script for the row; a run past ``test_timeout_s`` is
    the harness's "Tests Timed Out" (graded, not an infrastructure failure)."""
    try:
        script = harness_eval_script(instance)
    except (UnknownSpecError, ValueError) as exc:
        raise _ConfigFailure(f"{exc} (evaluation.eval_script)") from None
    script_path = f"{config.scratch_dir}/eval.sh"
    sandbox.write_file(script_path, script.encode(), mode=0o755)
    result = sandbox.exec(
        f"timeout -k 10 {config.test_timeout_s} /bin/bash {shlex.quote(script_path)} 2>&1",
        workdir=config.workdir,
        timeout_s=config.test_timeout_s + config.harness_grace_s,
    )
    transcript.append(f"$ harness eval script\n{result.output}")
    if result.timed_out:
        raise _InfraFailure(
            f"the evaluation run exceeded its exec timeout "
            f"({config.test_timeout_s + config.harness_grace_s:.0f}s)"
        )
    if result.exit_code == TIMEOUT_EXIT_CODE:
        return f"{result.output}\n{TESTS_TIMEOUT}\n"
    return result.output


def _run_tests(
    sandbox: Sandbox,
    run: _SwerlRun,
    config: EvalConfig,
    transcript: list[str],
    report_dir: str | None,
) -> str:
    """Run swerl's eval script (the tests only) and return its output."""
    plugin = None
    if report_dir is not None:
        plugin = f"swerl_report_{secrets.token_hex(6)}"
        sandbox.write_file(f"{report_dir}/{plugin}.py", _PLUGIN_SOURCE)
    if run.launcher is not None:
        sandbox.write_file(run.launcher, _LAUNCHER_SOURCE)
    scratch = f"{config.scratch_dir}/swerl-run-{secrets.token_hex(8)}"
    script = eval_script(
        EvalScriptSpec(
            workdir=config.workdir,
            test_command=run.test_command,
            test_timeout_s=config.test_timeout_s,
            output_path=f"{scratch}/test_output",
            report_dir=report_dir,
            report_plugin=plugin,
            hidden_git=f"{scratch}/git" if config.hide_git else None,
            # The harness's patch files would show the code under test where the unplanted
            # text sits (the canaries are what the test patch does not have).
            remove_before=[
                f"{config.scratch_dir}/swerl-test.diff",
                f"{config.scratch_dir}/swerl-model.diff",
            ],
        )
    )
    script_path = f"{scratch}/swerl-eval.sh"
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
    instance: SWEInstance,
    reason: str,
    transcript: list[str],
    config: EvalConfig,
    started: float,
    *,
    config_error: bool = False,
) -> EvalReport:
    log.warning("evaluation of %s aborted: %s", instance.instance_id, reason)
    return EvalReport(
        instance_id=instance.instance_id,
        infra_error=reason,
        config_error=config_error,
        log_tail=_tail(transcript, config),
        duration_s=time.monotonic() - started,
    )
