"""A task set of one's own: ``python -m sandbox_worker.images add --instances FILE --name N``.

One command from a file of rows (``repo_path`` / ``repo_url``, ``base_commit``, gold ``patch``,
``test_patch``, ``FAIL_TO_PASS`` / ``PASS_TO_PASS``; docs/tasks-and-rewards.md) to a dataset a
training run can use:

1. the rows are read collect-all: a bad row is that instance's failure, the rest go on;
2. the base image, then each instance's image under ``swerl/<name>/`` (one build per
   instance, so one that fails to build fails only itself; deploy/images/build_instances.py);
3. each built instance is validated in sandboxes (sandbox_worker/validate.py: the gold patch
   resolves, the empty patch does not);
4. the valid rows (PASS_TO_PASS tests failing on gold removed) are written to ``--out``
   (default ``$SWERL_CACHE/tasksets/<name>.jsonl``: a worker on this node resolves
   ``<name>/<instance_id>`` keys from there, with its ``swerl/<name>/`` images, with nothing to
   set), and the ``--dataset`` value to train on is printed.

A table reports every instance (build, validation); exit status 0 when every instance is
valid, 1 when some are not (the valid ones are still written), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandbox_worker import images, task_sets
from sandbox_worker.validate import (
    InstanceResult,
    format_table,
    load_failures,
    validate_instance,
    validation_config,
    write_valid,
)
from services.datasets import DatasetError, load_instances_collect
from services.datasets.mixture import DATASET_NAME_PATTERN
from services.protocol.instance import SWEInstance

CHECKS = ("gold", "empty")


@dataclass(frozen=True)
class AddSettings:
    instances: Path
    name: str
    out: Path
    backend: str
    bwrap: bool
    test_timeout_s: int


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "add",
        help="build, validate and register a task set of your own (one command)",
        description=__doc__.split("\n\n", 1)[1],
        epilog=images.ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--instances", type=Path, required=True,
                   help="dataset file of the rows (JSONL/JSON/parquet)")  # fmt: skip
    p.add_argument("--name", required=True,
                   help="the task set's name: images swerl/<name>/..., keys "
                   "<name>/<id>")  # fmt: skip
    p.add_argument("--out", type=Path, default=None,
                   help="where the valid rows go (default "
                   "$SWERL_CACHE/tasksets/<name>.jsonl)")  # fmt: skip
    p.add_argument("--backend", choices=("docker", "bwrap"), default="docker",
                   help="sandbox backend of the validation (docker: $DOCKER_HOST)")  # fmt: skip
    p.add_argument("--no-bwrap", action="store_true", help="build no bwrap trees")
    p.add_argument("--test-timeout", type=int, default=300, metavar="S",
                   help="seconds each test run may take (300)")  # fmt: skip


def settings(args: argparse.Namespace, error: object) -> AddSettings:
    """The checked arguments (``error``: the parser's, exit 2)."""
    name = args.name
    if not DATASET_NAME_PATTERN.match(name) or name != name.lower():
        error(f"--name {name!r}: lower-case letters, digits and . _ - (an image namespace)")  # type: ignore[operator]
    if not args.instances.is_file():
        error(f"--instances: no such file {args.instances}")  # type: ignore[operator]
    if args.test_timeout < 1:
        error("--test-timeout must be >= 1")  # type: ignore[operator]
    out = args.out or task_sets.default_task_sets_dir() / f"{name}.jsonl"
    return AddSettings(args.instances, name, out, args.backend, not args.no_bwrap,
                       args.test_timeout)  # fmt: skip


def build_one(instance: SWEInstance, source: Path, name: str, bwrap: bool) -> str | None:
    """Build one instance's image under ``swerl/<name>/``; why it failed, or None."""
    with tempfile.TemporaryDirectory(prefix="swerl-add-") as tmp:
        row_file = Path(tmp) / "row.jsonl"
        row = instance.to_swebench_dict() | dict(instance.model_extra or {})
        repo_path = row.get("repo_path")
        if isinstance(repo_path, str) and not Path(repo_path).expanduser().is_absolute():
            row["repo_path"] = str((source.parent / repo_path).resolve())
        row_file.write_text(json.dumps(row) + "\n")
        cmd = [sys.executable, str(images.IMAGES_DIR / "build_instances.py"),
               "--instances", str(row_file)]  # fmt: skip
        if not bwrap:
            cmd.append("--no-bwrap")
        env = {**os.environ, "DOCKER_HOST": images.docker_host(),
               "SWERL_IMAGE_NAMESPACE": f"{images.LOCAL_PREFIX}/{name}"}  # fmt: skip
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode == 0:
        return None
    lines = (res.stderr or res.stdout).strip().splitlines()
    return lines[-1] if lines else f"build exit {res.returncode}"


def run(args: argparse.Namespace, error: object) -> int:
    """The ``add`` subcommand."""
    cfg = settings(args, error)
    try:
        instances, bad_rows = load_instances_collect(cfg.instances)
    except DatasetError as exc:
        error(str(exc))  # type: ignore[operator]
        return 2
    env = {**os.environ, "DOCKER_HOST": images.docker_host()}
    base = subprocess.run(["bash", str(images.IMAGES_DIR / "build_base.sh")], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if base.returncode != 0:
        print(f"error: the base image cannot be built: {base.stderr.strip()[-500:]}",
              file=sys.stderr)  # fmt: skip
        return 1
    from sandbox_worker.backends import make_backend

    backend = make_backend(cfg.backend)
    config = validation_config(cfg.test_timeout_s, {})  # graded as the worker grades
    results: list[InstanceResult] = load_failures(bad_rows)
    for index, inst in enumerate(instances, start=1):
        where = f"[{index}/{len(instances)}] {inst.instance_id}"
        problem = build_one(inst, cfg.instances, cfg.name, cfg.bwrap)
        if problem is not None:
            print(f"{where}: build failed: {problem}", file=sys.stderr, flush=True)
            results.append(InstanceResult(inst.instance_id, load_error=f"build: {problem}"))
            continue
        image = images.local_image(cfg.name, inst.instance_id)
        result = validate_instance(backend, inst, image, config=config, checks=CHECKS,
                                   node=f"add-{cfg.name}")  # fmt: skip
        summary = ", ".join(f"{c.name} {'ok' if c.ok else 'FAIL'}" for c in result.checks)
        print(f"{where}: {image} built; {summary}", file=sys.stderr, flush=True)
        results.append(result)
    print(format_table(results))
    cfg.out.parent.mkdir(parents=True, exist_ok=True)
    if write_valid(results, cfg.out):
        print(f"train on it: --dataset {cfg.name}={cfg.out.resolve()}")
        print(f"  (prompts {cfg.name}/<instance_id>; images {images.LOCAL_PREFIX}/{cfg.name}/...)")
    return 0 if results and all(r.ok for r in results) else 1
