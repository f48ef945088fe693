"""Validate task instances with the real reward evaluation: ``python -m sandbox_worker.validate``.

For every instance, four evaluations through a sandbox backend, each in a fresh sandbox:

=========  =====================================  ==========================================
check      patch                                  must hold
=========  =====================================  ==========================================
gold       the gold patch                         applied and resolved
empty      no patch (tests run anyway)            not resolved; every FAIL_TO_PASS test
                                                  fails and every PASS_TO_PASS test passes
tampered   gold + a hunk breaking a protected     applied and resolved (protected files are
           test file                              restored before the test patch)
broken     gold hunks aimed at missing files      not applied, not resolved
=========  =====================================  ==========================================

Prints a progress line per instance (stderr) and a table (stdout); exit status 0 only if every
check of every instance holds, 1 otherwise (including infrastructure failures), 2 for bad
arguments or an unreadable instances file.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sandbox_worker.backends.base import SandboxBackend
from sandbox_worker.evaluation.evaluate import EvalConfig, EvalReport, evaluate_patch
from sandbox_worker.tasks.checks import CheckPatchError, broken_patch, tampered_patch
from services.datasets import DatasetError, load_instances
from services.protocol.instance import SWEInstance

DEFAULT_INSTANCES = Path(__file__).resolve().parents[1] / "tests" / "data" / "instances.jsonl"
CHECKS = ("gold", "empty", "tampered", "broken")


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str  # why it failed ("" when ok)
    report: EvalReport | None = None


@dataclass
class InstanceResult:
    instance_id: str
    wanted: tuple[str, ...] = CHECKS
    checks: list[CheckResult] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        done = {check.name for check in self.checks}
        return done == set(self.wanted) and all(check.ok for check in self.checks)


def validate_instance(
    backend: SandboxBackend,
    instance: SWEInstance,
    image: str,
    *,
    config: EvalConfig,
    node: str = "validate",
    checks: Sequence[str] = CHECKS,
) -> InstanceResult:
    """Run the checks of one instance (all four unless ``checks`` names a subset)."""
    unknown = set(checks) - set(CHECKS)
    if unknown or not checks:
        raise ValueError(f"checks must be a non-empty subset of {CHECKS}, got {list(checks)}")
    started = time.monotonic()
    result = InstanceResult(instance.instance_id, wanted=tuple(c for c in CHECKS if c in checks))

    def run(patch: str, eval_config: EvalConfig = config) -> EvalReport:
        return evaluate_patch(backend, instance, patch, image, node=node, config=eval_config)

    if "gold" in checks:
        result.checks.append(_check_gold("gold", run(instance.patch)))
    if "empty" in checks:
        empty_config = config.model_copy(update={"grade_empty_patch": True})
        result.checks.append(_check_empty(run("", empty_config)))
    if "tampered" in checks:
        try:
            result.checks.append(_check_gold("tampered", run(tampered_patch(instance))))
        except CheckPatchError as exc:
            result.checks.append(CheckResult("tampered", False, f"cannot build: {exc}"))
    if "broken" in checks:
        try:
            result.checks.append(_check_broken(run(broken_patch(instance))))
        except CheckPatchError as exc:
            result.checks.append(CheckResult("broken", False, f"cannot build: {exc}"))
    result.duration_s = time.monotonic() - started
    return result


def _infra(name: str, report: EvalReport) -> CheckResult | None:
    if report.infra_error is not None:
        return CheckResult(name, False, f"infrastructure failure: {report.infra_error}", report)
    return None


def _check_gold(name: str, report: EvalReport) -> CheckResult:
    if failed := _infra(name, report):
        return failed
    if not report.applied:
        return CheckResult(name, False, "patch did not apply", report)
    if not report.resolved:
        why = _failures(report) or ("invalid test log" if not report.log_valid else "?")
        return CheckResult(name, False, f"not resolved: {why}", report)
    return CheckResult(name, True, "", report)


def _check_empty(report: EvalReport) -> CheckResult:
    if failed := _infra("empty", report):
        return failed
    if report.resolved:
        return CheckResult("empty", False, "resolved without a patch", report)
    if not report.log_valid:
        return CheckResult("empty", False, "the base-state test log is invalid", report)
    problems = []
    if report.f2p_success:
        problems.append(f"FAIL_TO_PASS passing at base: {report.f2p_success}")
    if report.p2p_failure:
        problems.append(f"PASS_TO_PASS failing at base: {report.p2p_failure}")
    if problems:
        return CheckResult("empty", False, "; ".join(problems), report)
    return CheckResult("empty", True, "", report)


def _check_broken(report: EvalReport) -> CheckResult:
    if failed := _infra("broken", report):
        return failed
    if report.applied or report.resolved:
        method = report.apply_method
        return CheckResult("broken", False, f"a broken patch was applied ({method})", report)
    return CheckResult("broken", True, "", report)


def _failures(report: EvalReport) -> str:
    parts = []
    if report.f2p_failure:
        parts.append(f"FAIL_TO_PASS failing: {report.f2p_failure}")
    if report.p2p_failure:
        parts.append(f"PASS_TO_PASS failing: {report.p2p_failure}")
    return "; ".join(parts)


def validate_all(
    backend: SandboxBackend,
    instances: Sequence[SWEInstance],
    image_for: Callable[[str], str],
    *,
    config: EvalConfig,
    progress: TextIO | None = None,
    node: str = "validate",
    checks: Sequence[str] = CHECKS,
) -> list[InstanceResult]:
    """Validate every instance, printing one progress line per instance to ``progress``
    (default: stderr)."""
    progress = progress or sys.stderr
    results = []
    for index, instance in enumerate(instances, start=1):
        image = image_for(instance.instance_id)
        result = validate_instance(
            backend, instance, image, config=config, node=node, checks=checks
        )
        summary = ", ".join(f"{c.name} {'ok' if c.ok else 'FAIL'}" for c in result.checks)
        print(
            f"[{index}/{len(instances)}] {instance.instance_id}: {summary} "
            f"({result.duration_s:.1f} s)",
            file=progress,
            flush=True,
        )
        results.append(result)
    return results


def format_table(results: Sequence[InstanceResult]) -> str:
    """The result table, then one line per failed check with its reason."""
    width = max([len("instance"), *(len(r.instance_id) for r in results)])
    header = f"{'instance':<{width}}  " + "  ".join(f"{name:<8}" for name in CHECKS) + "  time"
    lines = [header, "-" * len(header)]
    for result in results:
        marks = {c.name: "ok" if c.ok else "FAIL" for c in result.checks}
        cells = "  ".join(f"{marks.get(name, '-'):<8}" for name in CHECKS)
        lines.append(f"{result.instance_id:<{width}}  {cells}  {result.duration_s:.1f} s")
    valid = sum(result.ok for result in results)
    lines.append(f"{valid}/{len(results)} instances valid")
    for result in results:
        for check in result.checks:
            if not check.ok:
                lines.append(f"  {result.instance_id} {check.name}: {check.detail}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_worker.validate",
        description="Check every instance: gold resolves, empty does not, a tampered test "
        "file is restored, a broken patch does not apply.",
    )
    parser.add_argument(
        "--backend",
        choices=("docker", "bwrap"),
        default="docker",
        help="sandbox backend (docker uses $DOCKER_HOST; `make setup` starts a private engine)",
    )
    parser.add_argument(
        "--instances",
        type=Path,
        default=DEFAULT_INSTANCES,
        help="SWE-bench-format dataset file (default: the mini set)",
    )
    parser.add_argument("--only", action="append", metavar="ID", help="validate only this id")
    parser.add_argument(
        "--test-timeout",
        type=int,
        default=300,
        metavar="S",
        help="seconds each test run may take (300)",
    )
    parser.add_argument("--node", default="validate", help="node name owning the sandboxes")
    args = parser.parse_args(argv)
    try:
        instances = load_instances(args.instances, only=args.only)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from sandbox_worker.backends import make_backend
    from sandbox_worker.images import instance_image

    backend = make_backend(args.backend)
    config = EvalConfig(test_timeout_s=args.test_timeout)
    print(
        f"validating {len(instances)} instance(s) with the {args.backend} backend",
        file=sys.stderr,
    )
    results = validate_all(backend, instances, instance_image, config=config, node=args.node)
    print(format_table(results))
    return 0 if results and all(result.ok for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
