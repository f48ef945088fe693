"""A task set of one's own: ``python -m sandbox_worker.images add|list|remove``.

One command from a file of rows (``repo_path`` / ``repo_url``, ``base_commit``, gold ``patch``,
``test_patch``, ``FAIL_TO_PASS`` / ``PASS_TO_PASS``; docs/tasks-and-rewards.md) to a dataset a
training run can use:

1. the rows are read collect-all: a bad row is that instance's failure, the rest go on;
2. the base image, then each instance's image under ``swerl/<name>/`` (one build per
   instance, so one that fails to build fails only itself; deploy/images/build_instances.py);
3. each built instance is validated in sandboxes (sandbox_worker/validate.py: the gold patch
   resolves, the empty patch does not);
4. the set is registered in the task-set directory (``--task-sets-dir``, default
   ``$SWERL_CACHE/tasksets``; sandbox_worker/task_sets.py): the valid rows (PASS_TO_PASS tests
   failing on gold removed) as ``<name>.jsonl`` (none when no row is valid), every image built
   in the manifest ``<name>.json``. A worker on this node resolves ``<name>/<instance_id>``
   keys from there, with the ``swerl/<name>/`` images, with nothing to set; ``--out FILE``
   also writes a copy of the rows (for a trainer on another host). How to roll it out by name
   is printed.

A table reports every instance (build, validation); exit status 0 when every instance is
valid, 1 when some are not (the valid ones are still registered), 2 for bad arguments.

``list`` prints the registered sets. ``remove --name N [--keep-images]`` undoes ``add``: the
set's registration, its images (every ``swerl/<name>/...`` tag on the engine, never the shared
base image) and their bwrap trees. Rerunning it finishes a removal that failed half-way; a name
with neither a registration nor images is an unknown set (exit 2, listing the known ones).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
    out: Path | None
    registry: Path
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
                   help="also write the valid rows here (a copy, e.g. for a trainer on "
                   "another host); the set is registered either way")  # fmt: skip
    _registry_argument(p)
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
    return AddSettings(args.instances, name, args.out, registry_dir(args), args.backend,
                       not args.no_bwrap, args.test_timeout)  # fmt: skip


def _registry_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task-sets-dir", type=Path, default=None, metavar="DIR",
                   help="the task-set registry (default $SWERL_CACHE/tasksets, where "
                   "workers on this node read; worker.rollout.task_sets_dir)")  # fmt: skip


def registry_dir(args: argparse.Namespace) -> Path:
    return args.task_sets_dir or task_sets.default_task_sets_dir()


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
               "SWERL_IMAGE_NAMESPACE": images.local_namespace(name)}  # fmt: skip
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
    built: list[str] = []
    for index, inst in enumerate(instances, start=1):
        where = f"[{index}/{len(instances)}] {inst.instance_id}"
        problem = build_one(inst, cfg.instances, cfg.name, cfg.bwrap)
        if problem is not None:
            print(f"{where}: build failed: {problem}", file=sys.stderr, flush=True)
            results.append(InstanceResult(inst.instance_id, load_error=f"build: {problem}"))
            continue
        image = images.local_image(cfg.name, inst.instance_id)
        built.append(image)
        result = validate_instance(backend, inst, image, config=config, checks=CHECKS,
                                   node=f"add-{cfg.name}")  # fmt: skip
        summary = ", ".join(f"{c.name} {'ok' if c.ok else 'FAIL'}" for c in result.checks)
        print(f"{where}: {image} built; {summary}", file=sys.stderr, flush=True)
        results.append(result)
    print(format_table(results))
    register(cfg, results, built)
    return 0 if results and all(r.ok for r in results) else 1


def register(cfg: AddSettings, results: list[InstanceResult], built: list[str]) -> int:
    """Write the set's rows and manifest to the registry (and ``--out``); print how to use it."""
    rows = task_sets.rows_path(cfg.registry, cfg.name)
    cfg.registry.mkdir(parents=True, exist_ok=True)
    valid = write_valid(results, rows)
    if not valid:  # an empty rows file would stop every worker reading the directory
        rows.unlink(missing_ok=True)
    manifest = task_sets.TaskSetManifest(name=cfg.name, source=str(cfg.instances.resolve()),
                                         images=tuple(built), valid=valid)  # fmt: skip
    task_sets.write_manifest(cfg.registry, manifest)
    if cfg.out is not None and valid:
        cfg.out.parent.mkdir(parents=True, exist_ok=True)
        write_valid(results, cfg.out)
    if valid:
        print(usage_lines(cfg.name, rows, results))
    else:
        print(f"no valid instance: nothing to roll out (undo: python -m sandbox_worker.images "
              f"remove --name {cfg.name})")  # fmt: skip
    return valid


def usage_lines(name: str, rows: Path, results: list[InstanceResult]) -> str:
    """How to roll the registered set out by name (printed by ``add``)."""
    first = next(r.instance_id for r in results if r.ok)
    key = task_sets.task_set_key(name, first)
    return "\n".join([
        f"registered task set {name}: {rows.resolve()}",
        f"  images {images.local_namespace(name)}/..., instance keys {name}/<instance_id>",
        f"  roll out: swerl submit rollout --instances {key}",
        f"  demo:     python -m services.demo --instances {name}",
        f"  train on it: --dataset {name}={rows.resolve()}",
        f"  undo:     python -m sandbox_worker.images remove --name {name}",
    ])  # fmt: skip


def list_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("list", help="list the registered task sets",
                       description="The task sets `add` registered: name, valid rows, images "
                       "built, source file.")  # fmt: skip
    _registry_argument(p)


def run_list(args: argparse.Namespace) -> int:
    """The ``list`` subcommand."""
    directory = registry_dir(args)
    names = task_sets.registered_sets(directory)
    if not names:
        print(f"no task sets in {directory}")
        return 0
    print(f"{'name':<24} {'valid':>5} {'images':>6}  source")
    for name in names:
        try:
            manifest = task_sets.read_manifest(directory, name)
        except task_sets.TaskSetError as exc:
            print(f"{name:<24} {'?':>5} {'?':>6}  {exc}")
            continue
        if manifest is None:  # a rows file put there by hand
            print(f"{name:<24} {'?':>5} {'?':>6}  (no manifest: not added by `images add`)")
            continue
        print(f"{name:<24} {manifest.valid:>5} {len(manifest.images):>6}  {manifest.source}")
    return 0


def remove_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "remove", help="undo `add`: the set's registration, images and bwrap trees",
        description="Remove a task set `add` registered: its rows and manifest, its images\n"
        "(every swerl/<name>/... tag on $DOCKER_HOST's engine; never the shared base image)\n"
        "and their bwrap trees. Rerun it to finish a removal that failed half-way.",
        epilog=images.ENVIRONMENT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--name", required=True, help="the task set's name (see `list`)")
    p.add_argument("--keep-images", action="store_true",
                   help="remove the registration only; keep the images and trees")  # fmt: skip
    _registry_argument(p)


def set_images(name: str, manifest: task_sets.TaskSetManifest | None) -> tuple[list[str], str]:
    """Every image of set ``name``: the manifest's and the engine's ``swerl/<name>/`` tags;
    and why the engine could not be asked ('' when it could)."""
    import docker

    found = set(manifest.images if manifest else ())
    prefix = images.local_namespace(name) + "/"
    try:
        client = docker.DockerClient(base_url=images.docker_host())
        try:
            tags = [t for image in client.images.list() for t in image.tags]
        finally:
            client.close()
    except docker.errors.DockerException as exc:
        return sorted(found), f"the Docker engine {images.docker_host()} is unreachable: {exc}"
    return sorted(found | {t for t in tags if t.startswith(prefix)}), ""


def remove_image(image: str) -> str | None:
    """Untag/delete one image and delete its bwrap tree; why it failed, or None."""
    import docker

    try:
        client = docker.DockerClient(base_url=images.docker_host())
        try:
            client.images.remove(image)
        finally:
            client.close()
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.DockerException as exc:
        return f"{image}: {exc}"
    return remove_tree(image)


def remove_tree(image: str) -> str | None:
    """Delete ``image``'s bwrap stamp and tree (``rootfs/<key>*``; the base tree is shared)."""
    root = images.rootfs_stamp(image).parent
    key = images.rootfs_key(image)
    try:
        for path in (root / key, root / f"{key}.testbed"):
            if path.is_dir():
                shutil.rmtree(path)
        (root / f"{key}.json").unlink(missing_ok=True)
    except OSError as exc:
        return f"{image}: its bwrap tree: {exc}"
    return None


def run_remove(args: argparse.Namespace) -> int:
    """The ``remove`` subcommand: exit 0 removed, 1 something left (rerun), 2 unknown set."""
    directory, name = registry_dir(args), args.name
    prog = "python -m sandbox_worker.images remove"
    try:
        manifest = task_sets.read_manifest(directory, name)
    except task_sets.TaskSetError as exc:
        manifest = None
        print(f"warning: {exc} (removing it)", file=sys.stderr)
    registered = name in task_sets.registered_sets(directory)
    targets, unreachable = ([], "") if args.keep_images else set_images(name, manifest)
    if not registered and not targets:
        why = f"; {unreachable}" if unreachable else ""
        print(f"{prog}: error: unknown task set {name!r}{why}; "
              f"{task_sets.known_sets_hint(directory)}", file=sys.stderr)  # fmt: skip
        return 2
    problems = [p for p in map(remove_image, targets) if p is not None]
    if unreachable:
        problems.append(unreachable)
    for problem in problems:
        print(f"{prog}: error: {problem}", file=sys.stderr)
    if problems:  # keep the registration: a rerun finds the images again
        print(f"{prog}: {name} is still registered; fix the above and rerun, or pass "
              "--keep-images to drop the registration only", file=sys.stderr)  # fmt: skip
        return 1
    task_sets.unregister(directory, name)
    kept = " (images kept)" if args.keep_images else f"; {len(targets)} image(s) removed"
    print(f"removed task set {name} from {directory}{kept}")
    return 0
