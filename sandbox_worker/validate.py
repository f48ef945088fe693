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

A PASS_TO_PASS test that fails on gold (while every FAIL_TO_PASS test passes) says nothing
about a patch: it is reported, excluded from the instance (the gold check then holds and the
later checks grade without it), and ``--write-valid FILE`` writes the valid instances with such
tests removed, ready to train on.

The instances file is read collect-all (:func:`services.datasets.load_instances_collect`): a
bad row (bad JSON, a missing field, an unparseable gold patch, a duplicate id) is that row's
``load`` failure in the table, and every other instance is still validated.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sandbox_worker.backends.base import SandboxBackend
from sandbox_worker.evaluation.evaluate import EvalConfig, EvalReport, evaluate_patch
from sandbox_worker.tasks.checks import CheckPatchError, broken_patch, tampered_patch
from services.cli import positive_int, repo_timeout
from services.datasets import DatasetError, RowError, load_instances_collect
from services.datasets.denylist import apply_denylist, load_denylist
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
    load_error: str | None = None  # the row could not be loaded: nothing was run
    excluded_p2p: tuple[str, ...] = ()  # PASS_TO_PASS tests failing on gold, left out
    instance: SWEInstance | None = None  # as validated (without the excluded tests)

    @property
    def ok(self) -> bool:
        if self.load_error is not None:
            return False
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
        gold = run(instance.gold_patch)
        result.excluded_p2p = p2p_failing_on_gold(gold)
        if result.excluded_p2p:
            kept = [t for t in instance.PASS_TO_PASS if t not in result.excluded_p2p]
            instance = instance.model_copy(update={"PASS_TO_PASS": kept})
            result.checks.append(CheckResult("gold", True, "", gold))
        else:
            result.checks.append(_check_gold("gold", gold))
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
    result.instance = instance
    return result


def p2p_failing_on_gold(report: EvalReport) -> tuple[str, ...]:
    """The PASS_TO_PASS tests to exclude: failing on a gold run that otherwise holds (applied,
    a valid log, no timeout, every FAIL_TO_PASS test passing); () when the run failed for
    another reason (that is the gold check's failure, not a test to exclude)."""
    if report.infra_error is not None or not report.applied or not report.log_valid:
        return ()
    if report.tests_timed_out or report.f2p_failure or report.structured_problem:
        return ()
    return tuple(report.p2p_failure)


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
        try:
            image = image_for(instance.instance_id)
        except ValueError as exc:  # an id no image can be named for: this row's failure
            result = InstanceResult(instance.instance_id, load_error=f"no image name: {exc}")
            print(
                f"[{index}/{len(instances)}] {instance.instance_id}: {result.load_error}",
                file=progress,
                flush=True,
            )
            results.append(result)
            continue
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


def load_failures(errors: Sequence[RowError]) -> list[InstanceResult]:
    """A failed result per bad row, named by its id (or its place when it has none)."""
    return [
        InstanceResult(error.instance_id or f"<{error.where}>", load_error=error.message)
        for error in errors
    ]


def format_table(results: Sequence[InstanceResult]) -> str:
    """The result table, then one line per failed check with its reason."""
    width = max([len("instance"), *(len(r.instance_id) for r in results)])
    header = f"{'instance':<{width}}  " + "  ".join(f"{name:<8}" for name in CHECKS) + "  time"
    lines = [header, "-" * len(header)]
    for result in results:
        marks = {c.name: "ok" if c.ok else "FAIL" for c in result.checks}
        if result.load_error is not None:
            marks = dict.fromkeys(CHECKS, "LOAD")
        cells = "  ".join(f"{marks.get(name, '-'):<8}" for name in CHECKS)
        lines.append(f"{result.instance_id:<{width}}  {cells}  {result.duration_s:.1f} s")
    valid = sum(result.ok for result in results)
    lines.append(f"{valid}/{len(results)} instances valid")
    for result in results:
        if result.load_error is not None:
            lines.append(f"  {result.instance_id} load: {result.load_error}")
        if result.excluded_p2p:
            tests = ", ".join(result.excluded_p2p)
            lines.append(f"  {result.instance_id} PASS_TO_PASS failing on gold, excluded: {tests}")
        for check in result.checks:
            if not check.ok:
                lines.append(f"  {result.instance_id} {check.name}: {check.detail}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_worker.validate",
        description="Check every instance: gold resolves, empty does not, a tampered test "
        "file is restored, a broken patch does not apply. A bad row of the instances file is "
        "that instance's failure; the others still run.",
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
        "--deny",
        type=Path,
        default=None,
        metavar="FILE",
        help="instance deny-list (one id per line, '# reason'); those instances are skipped",
    )
    parser.add_argument(
        "--write-valid",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the valid instances (PASS_TO_PASS tests failing on gold removed) as JSONL",
    )
    parser.add_argument(
        "--test-timeout",
        type=positive_int,
        default=300,
        metavar="S",
        help="seconds each test run may take (300)",
    )
    parser.add_argument(
        "--repo-timeout",
        type=repo_timeout,
        action="append",
        default=[],
        metavar="OWNER/NAME=S",
        help="seconds the test runs of one repository may take, over --test-timeout "
        "(repeatable, e.g. --repo-timeout sympy/sympy=1800; the worker's "
        "evaluation.test_timeout_by_repo)",
    )
    parser.add_argument("--node", default="validate", help="node name owning the sandboxes")
    return parser


def _selected(args: argparse.Namespace) -> tuple[list[SWEInstance], list[RowError]]:
    """The instances and bad rows to report, after ``--only`` and ``--deny``; a
    :class:`DatasetError` for an unusable file or an unknown ``--only`` id."""
    instances, bad_rows = load_instances_collect(args.instances)
    denied = load_denylist(args.deny) if args.deny is not None else {}
    if args.only:
        known = {inst.instance_id for inst in instances} | {r.instance_id for r in bad_rows}
        missing = [iid for iid in dict.fromkeys(args.only) if iid not in known]
        if missing:
            raise DatasetError(
                f"{args.instances}: no instance with id {', '.join(map(repr, missing))}"
            )
        instances = [inst for inst in instances if inst.instance_id in args.only]
        bad_rows = [row for row in bad_rows if row.instance_id in args.only]
    instances, dropped = apply_denylist(instances, denied)
    for inst in dropped:
        reason = denied[inst.instance_id] or "no reason given"
        print(f"{inst.instance_id}: skipped, on the deny-list ({reason})", file=sys.stderr)
    return instances, [row for row in bad_rows if row.instance_id not in denied]


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        instances, bad_rows = _selected(args)
    except DatasetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    from sandbox_worker.backends import make_backend
    from sandbox_worker.images import instance_image

    backend = make_backend(args.backend)
    config = validation_config(args.test_timeout, dict(args.repo_timeout))
    print(
        f"validating {len(instances)} instance(s) with the {args.backend} backend",
        file=sys.stderr,
    )
    results = load_failures(bad_rows)
    for failure in results:
        print(f"{failure.instance_id}: not loaded: {failure.load_error}", file=sys.stderr)
    results += validate_all(backend, instances, instance_image, config=config, node=args.node)
    print(format_table(results))
    if args.write_valid is not None:
        write_valid(results, args.write_valid)
    return 0 if results and all(result.ok for result in results) else 1


def validation_config(test_timeout_s: int, by_repo: dict[str, int]) -> EvalConfig:
    """The worker's default grading (per row: sandbox_worker/evaluation/row_grading.py) with
    the given test timeouts."""
    return EvalConfig(
        eval_script="auto",
        grading="auto",
        log_parser="auto",
        test_timeout_s=test_timeout_s,
        test_timeout_by_repo=by_repo,
    )


def write_valid(results: Sequence[InstanceResult], path: Path) -> int:
    """The valid instances as they were validated (excluded tests removed), as JSONL."""
    rows = [r.instance.to_swebench_dict() for r in results if r.ok and r.instance is not None]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} valid instance(s) to {path}", file=sys.stderr)
    return len(rows)


if __name__ == "__main__":
    sys.exit(main())
