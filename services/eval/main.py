"""``python -m services.eval`` / ``swerl eval``: grade SWE-bench predictions (docs/eval.md).

Everything the user gives is checked before a sandbox starts (dataset rows, every prediction,
instance ids, image naming, the run directory); then the instances are graded by ``--workers``
threads, each patch in its own fresh sandbox, and the run report is made from the files, as the
harness's ``make_run_report`` makes it. Each prediction is also graded as training rewards are
(unless ``--no-hardened``): the run report gains the hardened verdicts and tamper flags as new
keys (``hardened.py``); the harness's keys and verdicts stay exactly as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from sandbox_worker.backends import make_backend
from sandbox_worker.evaluation.run_report import (
    RUN_EVALUATION_LOG_DIR,
    instance_log_dir,
    is_completed,
    make_run_report,
    run_report_path,
)
from sandbox_worker.images import instance_image
from services.datasets import DatasetError, load_instances
from services.datasets.denylist import apply_denylist, load_denylist
from services.datasets.predictions import GOLD, Prediction, gold_predictions, load_predictions
from services.eval.generate import PREDICTIONS_FILE, StackError, generate
from services.eval.grade import Grader, Outcome
from services.eval.hardened import is_hardened, read_verdict, summary_keys
from services.eval.hardened import summary_lines as hardened_summary_lines
from services.protocol.instance import SWEInstance
from services.swerl_cli.eval_options import build_eval_parser

EXIT_OK, EXIT_INFRA, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,99}$")


class SetupError(ValueError):
    """The run cannot start (a usage error: exit 2)."""


@dataclass(frozen=True)
class RunPlan:
    """What one invocation grades."""

    root: Path
    run_id: str
    instances: list[SWEInstance]  # the selected part of the dataset (the report's total)
    predictions: dict[str, Prediction]  # every prediction of the file (the harness's submitted)
    images: dict[str, str]
    todo: list[str]  # ids to grade now (non-empty patch, not completed on --resume)
    denied: dict[str, str] = field(default_factory=dict)  # left out by --deny: id -> reason
    hardened: bool = True  # the hardened pass runs (not --no-hardened)


def build_parser() -> argparse.ArgumentParser:
    """``swerl eval``'s options (``services/swerl_cli/eval_options.py``, ``--no-hardened``
    included) under this module's program name."""
    return build_eval_parser("python -m services.eval")


def select_instances(args: argparse.Namespace) -> tuple[list[SWEInstance], dict[str, str]]:
    """The instances to run (``--instances``, less ``--deny``'s, then ``--max-instances``) and
    the selected ids the deny-list left out, with their reasons."""
    instances = load_instances(args.dataset, only=args.instances)
    denied: dict[str, str] = {}
    if args.deny is not None:
        listed = load_denylist(args.deny)
        instances, dropped = apply_denylist(instances, listed)
        denied = {inst.instance_id: listed[inst.instance_id] for inst in dropped}
        if not instances:
            raise SetupError(f"every selected instance is on the deny-list {args.deny}")
    if args.max_instances is not None:
        instances = instances[: args.max_instances]
    return instances, denied


def plan_run(args: argparse.Namespace) -> RunPlan:
    """Load and check every input; a :class:`DatasetError` / :class:`SetupError` otherwise."""
    instances, denied = select_instances(args)
    for iid, reason in denied.items():
        print(f"{iid}: skipped, on the deny-list ({reason or 'no reason given'})", file=sys.stderr)
    if args.predictions == GOLD:
        predictions = gold_predictions(instances)
    else:
        all_ids = [inst.instance_id for inst in load_instances(args.dataset)]
        predictions = load_predictions(args.predictions, all_ids)
    run_id = args.run_id or (GOLD if args.predictions == GOLD else Path(args.predictions).stem)
    if not RUN_ID_PATTERN.match(run_id):
        raise SetupError(f"run id {run_id!r} must match {RUN_ID_PATTERN.pattern} (give --run-id)")
    root = Path(args.report_dir)
    run_dir = root / RUN_EVALUATION_LOG_DIR / run_id
    if run_dir.exists() and not args.resume:
        raise SetupError(f"{run_dir} exists: pass --resume to continue that run, or a new --run-id")
    try:
        images = {
            inst.instance_id: instance_image(
                inst.instance_id, namespace=args.image_namespace, tag=args.image_tag
            )
            for inst in instances
        }
    except ValueError as exc:
        raise SetupError(f"image naming: {exc}") from None
    hardened = bool(args.hardened)
    todo = [
        inst.instance_id
        for inst in instances
        if (pred := predictions.get(inst.instance_id)) is not None
        and not pred.is_empty
        and not (args.resume and _is_done(root, run_id, pred, hardened))
    ]
    return RunPlan(root, run_id, instances, predictions, images, todo, denied, hardened)


def _is_done(root: Path, run_id: str, prediction: Prediction, hardened: bool) -> bool:
    """The harness's "already run" (``report.json`` exists) and, when the hardened pass is on,
    a hardened verdict (a run graded with ``--no-hardened``, or whose hardened pass hit an
    infrastructure failure, is graded again)."""
    if not is_completed(root, run_id, prediction):
        return False
    return not hardened or is_hardened(read_verdict(instance_log_dir(root, run_id, prediction)))


def grade_all(
    grader: Grader, plan: RunPlan, workers: int, progress: TextIO | None = None
) -> list[Outcome]:
    """Grade ``plan.todo`` with ``workers`` threads, one progress line per instance (default:
    to stderr)."""
    progress = progress or sys.stderr
    by_id = {inst.instance_id: inst for inst in plan.instances}
    lock = threading.Lock()
    outcomes: list[Outcome] = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="eval") as pool:
        futures = {
            pool.submit(grader.grade, by_id[iid], plan.predictions[iid], plan.images[iid]): iid
            for iid in plan.todo
        }
        try:
            for future in as_completed(futures):
                outcome = future.result()
                with lock:
                    outcomes.append(outcome)
                    print(
                        f"[{len(outcomes)}/{len(futures)}] {progress_line(outcome)}",
                        file=progress,
                        flush=True,
                    )
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return outcomes


def progress_line(outcome: Outcome) -> str:
    """``ID: STATUS[: why][; hardened: STATUS[: why]][; tamper: FLAG, ...] (S s)``."""
    line = f"{outcome.instance_id}: {outcome.status}"
    line += f": {outcome.detail}" if outcome.detail else ""
    if (second := outcome.hardened) is not None:
        if second.hardened_status != "not_run":
            line += f"; hardened: {second.hardened_status}"
            line += f": {second.hardened_detail}" if second.hardened_detail else ""
        if second.tamper:
            line += f"; tamper: {', '.join(second.tamper)}"
    return f"{line} ({outcome.duration_s:.1f} s)"


def summary_lines(report: dict[str, object]) -> list[str]:
    """The harness's final lines, then the resolved rate (of all selected instances)."""
    total = int(report["total_instances"])  # type: ignore[call-overload]
    resolved = int(report["resolved_instances"])  # type: ignore[call-overload]
    rate = 100.0 * resolved / total if total else 0.0
    return [
        f"Total instances: {total}",
        f"Instances submitted: {report['submitted_instances']}",
        f"Instances completed: {report['completed_instances']}",
        f"Instances incomplete: {len(report['incomplete_ids'])}",  # type: ignore[arg-type]
        f"Instances resolved: {resolved}",
        f"Instances unresolved: {report['unresolved_instances']}",
        f"Instances with likely infrastructure failures: {report['infra_failure_instances']}",
        f"Instances with ambiguous failures: {report['ambiguous_failure_instances']}",
        f"Instances with empty patches: {report['empty_patch_instances']}",
        f"Instances with errors: {report['error_instances']}",
        f"Resolved: {resolved}/{total} ({rate:.1f}%)",
    ]


def write_report(plan: RunPlan) -> tuple[Path, dict[str, object]]:
    """The harness's run report plus swerl's keys (``denied_ids``, the hardened verdicts and
    tamper flags): new keys only, the harness's keys stay as they are."""
    ids = [inst.instance_id for inst in plan.instances]
    report = make_run_report(plan.predictions, ids, plan.root, plan.run_id)
    if plan.denied:  # not part of the total; the harness's keys stay as they are
        report["denied_ids"] = sorted(plan.denied)
    graded = {  # every selected instance with a non-empty patch -> its hardened verdict
        iid: read_verdict(instance_log_dir(plan.root, plan.run_id, pred))
        for iid in ids
        if (pred := plan.predictions.get(iid)) is not None and not pred.is_empty
    }
    report |= summary_keys(graded, report["resolved_ids"], plan.hardened)  # type: ignore[arg-type]
    path = run_report_path(plan.root, plan.run_id, plan.predictions)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=4) + "\n")
    return path, report


def generate_first(args: argparse.Namespace) -> int | None:
    """Generation mode: write ``predictions.jsonl`` into the report directory and point
    ``args.predictions`` at it; an exit status when the run cannot go on, else None."""
    root = Path(args.report_dir)
    if args.model_url:
        if not args.upstream_model:
            raise SetupError("--model-url needs --upstream-model (the endpoint's model name)")
        if not args.model_url.startswith(("http://", "https://")):
            raise SetupError(f"--model-url must start with http:// or https://: {args.model_url}")
        if args.api_key_env and not os.environ.get(args.api_key_env):
            raise SetupError(f"--api-key-env: ${args.api_key_env} is not set")
    elif not Path(args.model).is_dir():
        raise SetupError(f"--model {args.model}: no such checkpoint directory")
    run_dir = root / RUN_EVALUATION_LOG_DIR / (args.run_id or Path(PREDICTIONS_FILE).stem)
    for existing in (root / PREDICTIONS_FILE, run_dir):
        if existing.exists() and not args.resume:
            raise SetupError(f"{existing} exists: pass --resume to continue that run")
    instances, _ = select_instances(args)
    try:
        path, aborted = generate(args, instances, root)
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_INFRA
    if not path.read_text().strip():
        print(f"error: no prediction was generated ({aborted} aborted); see {root}/*.log",
              file=sys.stderr)  # fmt: skip
        return EXIT_INFRA
    args.predictions = str(path)
    args.resume = True  # grading continues the same run
    args.generation_aborted = aborted
    return None


def backend_settings(args: argparse.Namespace) -> dict[str, object]:
    """The sandbox backend's settings from the options (``--state-root``)."""
    return {"state_root": Path(args.state_root)} if args.state_root else {}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.state_root:  # the generation's sandbox worker reads its backend settings from here
        os.environ["SWERL_WORKER__ROLLOUT__BACKEND__STATE_ROOT"] = args.state_root
    try:
        generates = args.model is not None or args.model_url is not None
        if generates and (code := generate_first(args)) is not None:
            return code
        plan = plan_run(args)
    except (DatasetError, SetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    skipped = sum(
        1 for p in plan.predictions.values() if not p.is_empty and p.instance_id in plan.images
    ) - len(plan.todo)
    passes = "official and hardened passes" if plan.hardened else "official pass only"
    print(
        f"run {plan.run_id}: {len(plan.instances)} instance(s), {len(plan.todo)} to grade "
        f"({skipped} already graded) with the {args.backend} backend, {args.workers} worker(s), "
        f"{passes}",
        file=sys.stderr,
    )
    node = f"eval-{secrets.token_hex(4)}"
    try:
        backend = make_backend(args.backend, **backend_settings(args))
    except Exception as exc:  # the backend's own error family (docker, bwrap set-up)
        print(f"error: the {args.backend} backend is not available: {exc}", file=sys.stderr)
        return EXIT_INFRA
    grader = Grader(
        backend,
        plan.root,
        plan.run_id,
        node,
        args.eval_script,
        args.timeout,
        dict(args.repo_timeout or []),
        plan.hardened,
    )
    try:
        outcomes = grade_all(grader, plan, args.workers)
    except KeyboardInterrupt:
        print("interrupted: finished instances are kept (--resume continues)", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        backend.cleanup_node(node)
    path, report = write_report(plan)
    print("\n".join([*summary_lines(report), *hardened_summary_lines(report)]))
    print(f"Report written to {path}")
    aborted = getattr(args, "generation_aborted", 0)
    return EXIT_INFRA if aborted or any(o.infra for o in outcomes) else EXIT_OK
