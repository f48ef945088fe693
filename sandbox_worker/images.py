"""Task image naming, the bwrap root filesystem registry, and the one build entry point.

Naming follows the SWE-bench harness (``swebench.harness.test_spec.TestSpec.instance_image_key``
with a namespace): ``<namespace>/sweb.eval.<arch>.<instance id, lower-cased, "__" ->
"_1776_">:<tag>``. Production nodes pre-pull the official images under the ``swebench``
namespace (``deploy/images/prepull_swebench.sh``); images built locally for the mini task set use
the ``swerl`` namespace. ``SWERL_IMAGE_NAMESPACE`` switches the default.

Per dataset (tests/unit/sandbox_worker/test_images.py, one test per rule): SWE-bench
:func:`swebench_image` is exactly the harness's name; SWE-Gym :func:`swegym_image` (``__`` ->
``_s_``); SWE-smith :func:`swesmith_image`, one image per repository snapshot (so its label
check, :func:`label_mismatch`, compares repository + commit); images swerl builds for a dataset
:func:`local_image`, under ``swerl/<dataset>/`` so two datasets that reuse an id never collide.

bwrap root filesystems: the bwrap backend runs over the *same tree* as the docker image. Each
image the build registers has a JSON stamp ``<cache>/rootfs/<key>.json`` saying where its root
filesystem is and, when the image is the base image plus ``/testbed`` only, where its
``/testbed`` tree is (so the base tree is shared by all instances, see docs/sandboxes.md).

``python -m sandbox_worker.images build [--instances PATH]`` builds everything (base image,
instance images, bwrap root filesystems); it is idempotent and fast when nothing changed.
``python -m sandbox_worker.images pull --instances FILE --dataset swebench --docker-host URL``
pulls a whole dataset's published images (:mod:`sandbox_worker.image_pull`).
``python -m sandbox_worker.images add --instances FILE --name NAME`` builds, validates and
registers a task set of one's own in one command; ``list`` shows the registered sets and
``remove --name NAME`` undoes an ``add`` (:mod:`sandbox_worker.task_set_add`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sandbox_worker.backends.base import ImageNotFoundError

DEFAULT_DOCKER_HOST = "unix:///run/swerl/docker.sock"
DEFAULT_CACHE = "/var/cache/swerl"
DEFAULT_NAMESPACE = "swerl"
DEFAULT_ARCH = "x86_64"
REPO_ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = REPO_ROOT / "deploy" / "images"
DEFAULT_INSTANCES = REPO_ROOT / "tests" / "data" / "instances.jsonl"

_INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_NAMESPACE_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")


ENVIRONMENT_HELP = f"""environment:
  DOCKER_HOST            the Docker engine (default {DEFAULT_DOCKER_HOST})
  SWERL_IMAGE_NAMESPACE  image name prefix (default {DEFAULT_NAMESPACE}; e.g. swerl/mytasks for
                         a task set of your own: images swerl/mytasks/sweb.eval...)
  SWERL_BASE_IMAGE       the image instance images build FROM (default swerl/base:bookworm)
  SWERL_CACHE            bwrap trees, build caches and the task-set registry
                         ($SWERL_CACHE/tasksets; default {DEFAULT_CACHE})
"""


def docker_host() -> str:
    """The Docker endpoint every swerl component uses (``DOCKER_HOST`` overrides)."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def cache_dir() -> Path:
    return Path(os.environ.get("SWERL_CACHE") or DEFAULT_CACHE)


def base_image() -> str:
    return os.environ.get("SWERL_BASE_IMAGE") or "swerl/base:bookworm"


def instance_image(
    instance_id: str,
    *,
    namespace: str | None = None,
    arch: str = DEFAULT_ARCH,
    tag: str = "latest",
) -> str:
    """The image of one task instance, SWE-bench's naming rule under ``namespace``.

    >>> instance_image("django__django-11099", namespace="swebench")
    'swebench/sweb.eval.x86_64.django_1776_django-11099:latest'
    """
    if not isinstance(instance_id, str) or not _INSTANCE_ID_RE.match(instance_id):
        raise ValueError(f"invalid instance id {instance_id!r}")
    ns = namespace if namespace is not None else os.environ.get("SWERL_IMAGE_NAMESPACE")
    ns = ns or DEFAULT_NAMESPACE
    if not _NAMESPACE_RE.match(ns):
        raise ValueError(f"invalid image namespace {ns!r}")
    if arch not in ("x86_64", "arm64"):
        raise ValueError(f"invalid arch {arch!r} (x86_64 or arm64)")
    if not _TAG_RE.match(tag):
        raise ValueError(f"invalid image tag {tag!r}")
    name = instance_id.lower().replace("__", "_1776_")
    return f"{ns}/sweb.eval.{arch}.{name}:{tag}"


# Published images per dataset (the names their own harnesses pull):
# SWE-bench: the harness's TestSpec.instance_image_key under the ``swebench`` namespace.
SWEBENCH_NAMESPACE = "swebench"
# SWE-Gym (OpenHands' SWE-Gym images): ``__`` -> ``_s_`` instead of the harness's ``_1776_``.
SWEGYM_NAMESPACE = "xingyaoww"
# SWE-smith: one image per repository snapshot, ``swesmith.x86_64.<owner>_1776_<repo>.<commit8>``
# (rows carry it as ``image_name``); the instance id is ``<owner>__<repo>.<commit8>.<mutation>``.
SWESMITH_NAMESPACE = "jyangballin"
LOCAL_PREFIX = "swerl"  # images swerl builds: swerl/<dataset>/..., so datasets never collide
_DATASET_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$")
_SWESMITH_ID_RE = re.compile(
    r"^(?P<owner>[^_]+(?:_[^_]+)*)__(?P<repo>[^.]+)\.(?P<commit>[0-9a-f]{8})\."
)


def _harness_key(instance_id: str, separator: str) -> str:
    if not isinstance(instance_id, str) or not _INSTANCE_ID_RE.match(instance_id):
        raise ValueError(f"invalid instance id {instance_id!r}")
    return instance_id.lower().replace("__", separator)


def swebench_image(instance_id: str, *, arch: str = DEFAULT_ARCH, tag: str = "latest") -> str:
    """Exactly the name the SWE-bench harness pulls for an instance.

    >>> swebench_image("django__django-11099")
    'swebench/sweb.eval.x86_64.django_1776_django-11099:latest'
    """
    return instance_image(instance_id, namespace=SWEBENCH_NAMESPACE, arch=arch, tag=tag)


def swegym_image(instance_id: str, *, tag: str = "latest") -> str:
    """SWE-Gym's published image of an instance.

    >>> swegym_image("Project-MONAI__MONAI-1121")
    'xingyaoww/sweb.eval.x86_64.project-monai_s_monai-1121:latest'
    """
    if not _TAG_RE.match(tag):
        raise ValueError(f"invalid image tag {tag!r}")
    return f"{SWEGYM_NAMESPACE}/sweb.eval.x86_64.{_harness_key(instance_id, '_s_')}:{tag}"


@dataclass(frozen=True)
class SwesmithSnapshot:
    """The repository snapshot a SWE-smith image holds (what its labels must say)."""

    repo: str  # owner/name
    commit8: str


def swesmith_snapshot(instance_id: str) -> SwesmithSnapshot:
    """``owner__repo.commit8.mutation`` -> (owner/repo, commit8)."""
    match = _SWESMITH_ID_RE.match(instance_id) if isinstance(instance_id, str) else None
    if match is None:
        raise ValueError(
            f"not a SWE-smith instance id (owner__repo.<8 hex>.<mutation>): {instance_id!r}"
        )
    return SwesmithSnapshot(f"{match['owner']}/{match['repo']}", match["commit"])


def swesmith_image(instance_id: str, *, image_name: str | None = None, tag: str = "latest") -> str:
    """SWE-smith's image of an instance: the row's ``image_name`` (namespaced if it is bare),
    else the one its id names.

    >>> swesmith_image("oauthlib__oauthlib.1fd52536.lm_rewrite__q9ve64pd")
    'jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536:latest'
    """
    if not _TAG_RE.match(tag):
        raise ValueError(f"invalid image tag {tag!r}")
    if image_name:
        name = image_name if "/" in image_name else f"{SWESMITH_NAMESPACE}/{image_name}"
        return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:{tag}"
    snap = swesmith_snapshot(instance_id)
    owner, repo = snap.repo.split("/", 1)
    key = f"{owner}_1776_{repo}.{snap.commit8}".lower()
    return f"{SWESMITH_NAMESPACE}/swesmith.x86_64.{key}:{tag}"


def local_namespace(dataset: str) -> str:
    """The image namespace of the images swerl builds for ``dataset`` (a task set of one's
    own): ``swerl/<dataset>``; the one home of that rule (builds, workers, ``images remove``).

    >>> local_namespace("my-tasks")
    'swerl/my-tasks'
    """
    if not isinstance(dataset, str) or not _DATASET_RE.match(dataset):
        raise ValueError(f"invalid dataset name {dataset!r} (lower-case letters, digits, ._-)")
    return f"{LOCAL_PREFIX}/{dataset}"


def local_image(dataset: str, instance_id: str, *, tag: str = "latest") -> str:
    """An image swerl builds for an instance of ``dataset``: ``swerl/<dataset>/...``.

    >>> local_image("my-tasks", "acme__tool-7")
    'swerl/my-tasks/sweb.eval.x86_64.acme_1776_tool-7:latest'
    """
    return instance_image(instance_id, namespace=local_namespace(dataset), tag=tag)


def label_mismatch(
    image: str, labels: dict[str, str], *, repo: str, commit: str, swesmith: bool = False
) -> str | None:
    """Why ``image``'s labels do not describe the instance, or None when they do.

    SWE-bench / local images hold one instance: the base commit must match. SWE-smith images
    hold a repository snapshot shared by many instances: repository and commit (its 8-hex
    prefix) must match. Labels: ``swerl.repo`` and ``swerl.base_commit``.
    """
    have_repo, have_commit = labels.get("swerl.repo"), labels.get("swerl.base_commit")
    if not have_commit:
        return f"image {image} has no swerl.base_commit label (the instance wants {repo}@{commit})"
    if swesmith:
        matches = have_repo == repo and have_commit[:8] == commit[:8]
    else:
        matches = have_commit == commit and have_repo in (None, repo)
    if matches:
        return None
    return (
        f"image {image} holds {have_repo or '?'}@{have_commit} but the instance wants "
        f"{repo}@{commit}"
    )


def rootfs_key(image: str) -> str:
    """A file-name-safe, collision-free key for an image reference."""
    if not image:
        raise ValueError("empty image reference")
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", image)[:150]
    return f"{safe}-{hashlib.sha256(image.encode()).hexdigest()[:10]}"


@dataclass(frozen=True)
class RootfsInfo:
    """Where the bwrap backend finds an image's tree (written by the image build)."""

    image: str
    image_id: str
    root: Path  # the root filesystem (read-only in sandboxes)
    testbed: Path | None  # the image's /testbed tree when it is not root/testbed
    env: tuple[str, ...]  # the image's ENV, "KEY=value"
    workdir: str
    # the image's swerl.* labels (repository, base commit: the worker's label check); None in
    # a stamp written before trees carried them
    labels: dict[str, str] | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "image": self.image,
                "image_id": self.image_id,
                "root": str(self.root),
                "testbed": str(self.testbed) if self.testbed else None,
                "env": list(self.env),
                "workdir": self.workdir,
                "labels": self.labels,
            },
            indent=1,
        )


def rootfs_stamp(image: str, cache: Path | None = None) -> Path:
    return (cache or cache_dir()) / "rootfs" / f"{rootfs_key(image)}.json"


def swerl_labels(labels: Mapping[str, str] | None) -> dict[str, str]:
    """The ``swerl.*`` labels of an image (what a tree stamp keeps)."""
    return {k: v for k, v in (labels or {}).items() if k.startswith("swerl.")}


def _stamp_labels(value: object, stamp: Path) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ImageNotFoundError(f"unreadable root filesystem stamp {stamp}: bad labels")
    return dict(value)


def rootfs_info(image: str, cache: Path | None = None) -> RootfsInfo:
    """The registered tree of ``image``; :class:`ImageNotFoundError` if it was never built."""
    stamp = rootfs_stamp(image, cache)
    try:
        data = json.loads(stamp.read_text())
    except FileNotFoundError:
        raise ImageNotFoundError(
            f"no bwrap root filesystem for image {image!r} (expected {stamp}); build it with "
            "`python -m sandbox_worker.images build`"
        ) from None
    except (OSError, ValueError) as exc:
        raise ImageNotFoundError(f"unreadable root filesystem stamp {stamp}: {exc}") from exc
    info = RootfsInfo(
        image=data["image"],
        image_id=data["image_id"],
        root=Path(data["root"]),
        testbed=Path(data["testbed"]) if data.get("testbed") else None,
        env=tuple(data.get("env") or ()),
        workdir=data.get("workdir") or "/",
        labels=_stamp_labels(data.get("labels"), stamp),
    )
    if not (info.root / "usr").is_dir() or (info.testbed and not info.testbed.is_dir()):
        raise ImageNotFoundError(f"root filesystem of {image!r} is incomplete: {info.root}")
    return info


def build(instances: Path, *, bwrap: bool = True, force: bool = False) -> None:
    """Base image, instance images and bwrap trees; every stage is skipped when up to date."""
    env = {**os.environ, "DOCKER_HOST": docker_host()}
    if force:
        env["FORCE"] = "1"
    subprocess.run(["bash", str(IMAGES_DIR / "build_base.sh")], check=True, env=env)
    cmd = [sys.executable, str(IMAGES_DIR / "build_instances.py"), "--instances", str(instances)]
    if not bwrap:
        cmd.append("--no-bwrap")
    if force:
        cmd.append("--force")
    subprocess.run(cmd, check=True, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox_worker.images",
        description="Task images: build the base image, one image per instance and their bwrap\n"
        "trees on this node's Docker engine ($DOCKER_HOST), pull a dataset's published images\n"
        "(ops, before training), or print image names. Images are never pulled at run time.",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser(
        "build",
        help="build base + instance images + bwrap trees",
        description="Build what is missing or out of date (content-hashed; reruns are fast).\n"
        "A row's repository is cloned at base_commit with nothing after it (the fix cannot be\n"
        "read from its history); builds have no network.",
        epilog=ENVIRONMENT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p_build.add_argument(
        "--instances",
        type=Path,
        default=DEFAULT_INSTANCES,
        help="dataset file of the instances (JSONL/JSON/parquet; rows may name repo_path or "
        "repo_url and setup_script, see docs/tasks-and-rewards.md; default: the mini set)",
    )
    p_build.add_argument("--no-bwrap", action="store_true", help="skip the bwrap trees")
    p_build.add_argument("--force", action="store_true", help="rebuild everything")
    p_name = sub.add_parser(
        "name",
        help="print the image name of instance ids",
        description="Print the image each instance id runs in (one per line).",
    )
    p_name.add_argument("instance_ids", nargs="+", help="instance ids, e.g. owner__repo-123")
    p_name.add_argument(
        "--namespace",
        default=None,
        help="image namespace (default: $SWERL_IMAGE_NAMESPACE or swerl)",
    )
    from sandbox_worker import (
        image_pull,  # the pull subcommand (ops, a whole dataset)
        task_set_add,  # the add subcommand (a task set of one's own)
    )

    image_pull.add_parser(sub)
    task_set_add.add_parser(sub)
    task_set_add.list_parser(sub)
    task_set_add.remove_parser(sub)
    args = parser.parse_args(argv)
    if args.cmd == "pull":
        return image_pull.run(args, parser.error)
    if args.cmd == "add":
        return task_set_add.run(args, parser.error)
    if args.cmd == "list":
        return task_set_add.run_list(args)
    if args.cmd == "remove":
        return task_set_add.run_remove(args)
    if args.cmd == "name":
        try:
            names = [instance_image(iid, namespace=args.namespace) for iid in args.instance_ids]
        except ValueError as exc:
            parser.error(str(exc))
        print("\n".join(names))
        return 0
    if not args.instances.is_file():
        parser.error(f"instances file not found: {args.instances}")
    try:
        build(args.instances, bwrap=not args.no_bwrap, force=args.force)
    except subprocess.CalledProcessError as exc:
        print(f"image build failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
