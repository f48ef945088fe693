"""Pull a whole dataset's published images onto a node: ``python -m sandbox_worker.images pull``.

The ops step before training (workers never pull at run time, ``--pull=never``): for every
instance of a dataset file, the image its dataset publishes (:func:`image_name`: SWE-bench's
harness name, SWE-Gym's, SWE-smith's per-repository snapshot, one pull per distinct image),
pulled through the Docker engine at ``--docker-host`` (required: the node's engine, named on
purpose), ``--parallel`` at a time. Resumable: an image the engine already holds is not pulled
again, so a rerun after an interruption only pulls what is missing. ``--registry HOST[:PORT]``
prefixes every name (a mirror). At the end every image still missing is listed on stderr (and
in ``--missing-out``, one instance id per line); exit status 0 when every image is present,
1 when some are missing, 2 for bad arguments or an unreadable dataset.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sandbox_worker import images
from services.protocol.instance import SWEInstance

DATASETS = ("swebench", "swegym", "swesmith")
_REGISTRY_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$")


def image_name(instance: SWEInstance, dataset: str, registry: str | None = None) -> str:
    """The published image of ``instance`` in ``dataset`` (prefixed by ``registry``). A
    SWE-smith row (``is_swesmith``) has no other image than SWE-smith's: it gets that one
    whatever ``dataset`` says, so one worker (or pull) serves a SWE-Gym + SWE-smith mixture."""
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r} (one of {', '.join(DATASETS)})")
    if instance.is_swesmith:
        dataset = "swesmith"
    if dataset == "swebench":
        name = images.swebench_image(instance.instance_id)
    elif dataset == "swegym":
        name = images.swegym_image(instance.instance_id)
    elif dataset == "swesmith":
        extra = instance.model_extra or {}
        row_image = extra.get("image_name")
        name = images.swesmith_image(
            instance.instance_id, image_name=row_image if isinstance(row_image, str) else None
        )
    else:
        raise ValueError(f"unknown dataset {dataset!r} (one of {', '.join(DATASETS)})")
    if registry is None:
        return name
    if not _REGISTRY_RE.match(registry):
        raise ValueError(f"invalid registry {registry!r} (HOST or HOST:PORT)")
    return f"{registry}/{name}"


@dataclass(frozen=True)
class PullResult:
    image: str
    instance_ids: tuple[str, ...]
    state: str  # "present" (already there), "pulled", "missing"
    error: str = ""


def pull_all(
    client: object,
    wanted: dict[str, list[str]],
    *,
    parallel: int,
    progress: Callable[[str], None] = print,
) -> list[PullResult]:
    """Pull every image of ``wanted`` (image -> instance ids) the engine lacks."""
    import docker.errors

    def one(image: str) -> PullResult:
        ids = tuple(wanted[image])
        try:
            client.images.get(image)  # type: ignore[attr-defined]
            return PullResult(image, ids, "present")
        except docker.errors.ImageNotFound:
            pass
        except docker.errors.APIError as exc:
            return PullResult(image, ids, "missing", f"image lookup failed: {exc}")
        repository, _, tag = image.rpartition(":")
        try:
            client.images.pull(repository, tag=tag)  # type: ignore[attr-defined]
        except docker.errors.DockerException as exc:
            return PullResult(image, ids, "missing", str(exc).splitlines()[0][:300])
        return PullResult(image, ids, "pulled")

    results = []
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        for index, result in enumerate(pool.map(one, wanted), start=1):
            detail = f": {result.error}" if result.error else ""
            progress(f"[{index}/{len(wanted)}] {result.image}: {result.state}{detail}")
            results.append(result)
    return results


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "pull",
        help="pull a dataset's published images onto this node",
        description=__doc__.split("\n\n")[1],
    )
    p.add_argument(
        "--instances", type=Path, required=True, help="dataset file (JSONL/JSON/parquet)"
    )
    p.add_argument("--dataset", choices=DATASETS, required=True, help="whose image naming to use")
    p.add_argument(
        "--docker-host", required=True, help="the engine to pull into (unix:///... or tcp://...)"
    )
    p.add_argument("--registry", default=None, help="registry HOST[:PORT] prefixed to every name")
    p.add_argument("--parallel", type=int, default=4, help="concurrent pulls (default 4)")
    p.add_argument("--missing-out", type=Path, default=None, help="write missing instance ids here")


def run(args: argparse.Namespace, error: Callable[[str], None]) -> int:
    """The ``pull`` subcommand; ``error`` is the parser's (exit 2)."""
    import sys

    import docker

    from services.datasets import DatasetError, load_instances

    if args.parallel < 1:
        error(f"--parallel must be >= 1, got {args.parallel}")
    try:
        instances = load_instances(args.instances)
        names = [(image_name(i, args.dataset, args.registry), i.instance_id) for i in instances]
    except (DatasetError, ValueError) as exc:
        error(str(exc))
    wanted: dict[str, list[str]] = {}
    for image, iid in names:
        wanted.setdefault(image, []).append(iid)
    try:
        client = docker.DockerClient(base_url=args.docker_host, timeout=3600)
        client.ping()
    except docker.errors.DockerException as exc:
        print(f"error: no Docker engine at {args.docker_host}: {exc}", file=sys.stderr)
        return 1
    try:
        results = pull_all(client, wanted, parallel=args.parallel)
    finally:
        client.close()
    return report(results, args.missing_out)


def report(results: Sequence[PullResult], missing_out: Path | None) -> int:
    import sys

    missing = [r for r in results if r.state == "missing"]
    counts = {state: sum(r.state == state for r in results) for state in ("present", "pulled")}
    print(
        f"{len(results)} image(s): {counts['present']} present, {counts['pulled']} pulled, "
        f"{len(missing)} missing"
    )
    for result in missing:
        print(f"missing {result.image} ({', '.join(result.instance_ids)})", file=sys.stderr)
    if missing_out is not None:
        missing_out.write_text("".join(f"{iid}\n" for r in missing for iid in r.instance_ids))
    return 1 if missing else 0
