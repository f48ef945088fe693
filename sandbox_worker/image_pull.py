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

A transient pull failure (the registry unreachable, a timeout, a 5xx answer) is retried up to
``--retries`` times, waiting ``--retry-backoff`` seconds, doubled after each try (at most 60 s);
a permanent one (the image or manifest not found, unauthorized, access denied, a bad reference)
is reported at once (:func:`is_permanent`).
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sandbox_worker import images
from services.protocol.instance import SWEInstance

DATASETS = ("swebench", "swegym", "swesmith")
_REGISTRY_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?$")
# What the engine says (in its 500 answer) when a retry cannot help: the image is not there or
# this node may not read it.
PERMANENT_MARKERS = (
    "manifest unknown",
    "not found",
    "unauthorized",
    "authentication required",
    "denied",
    "does not exist",
    "invalid reference format",
)
PERMANENT_STATUSES = (400, 401, 403, 404)
MAX_BACKOFF_S = 60.0


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of a transient pull failure: ``retries`` more tries, ``backoff_s`` before the
    first, doubled before each next one, at most ``max_backoff_s``."""

    retries: int = 3
    backoff_s: float = 2.0
    max_backoff_s: float = MAX_BACKOFF_S

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"retries and backoffs must be >= 0, got {self}")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        return min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1))


def is_permanent(exc: Exception) -> bool:
    """Whether a pull failure is one a retry cannot fix (see :data:`PERMANENT_MARKERS`)."""
    status = getattr(exc, "status_code", None)
    if status in PERMANENT_STATUSES:
        return True
    text = str(getattr(exc, "explanation", None) or exc).lower()
    return any(marker in text for marker in PERMANENT_MARKERS)


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
    attempts: int = 0  # pulls tried (0: the engine had it)


def pull_all(
    client: object,
    wanted: dict[str, list[str]],
    *,
    parallel: int,
    progress: Callable[[str], None] = print,
    retry: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[PullResult]:
    """Pull every image of ``wanted`` (image -> instance ids) the engine lacks; a transient
    failure is retried by ``retry`` (default :class:`RetryPolicy`), a permanent one is not."""
    import docker.errors

    policy = retry or RetryPolicy()

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
        for attempt in range(1, policy.retries + 2):
            try:
                client.images.pull(repository, tag=tag)  # type: ignore[attr-defined]
            except docker.errors.DockerException as exc:
                error = str(exc).splitlines()[0][:300]
                if is_permanent(exc) or attempt > policy.retries:
                    return PullResult(image, ids, "missing", error, attempt)
                wait = policy.delay(attempt)
                progress(f"{image}: try {attempt} failed ({error}); retrying in {wait:g} s")
                sleep(wait)
                continue
            return PullResult(image, ids, "pulled", attempts=attempt)
        raise AssertionError("unreachable: the last try returns")

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
    p.add_argument("--retries", type=int, default=RetryPolicy.retries,
                   help="retries of a transient pull failure (unreachable, timeout, 5xx; "
                   f"default {RetryPolicy.retries}); not found / unauthorized: never "
                   "retried")  # fmt: skip
    p.add_argument("--retry-backoff", type=float, default=RetryPolicy.backoff_s, metavar="S",
                   help=f"seconds before the first retry, doubled each time, at most "
                   f"{MAX_BACKOFF_S:g} (default {RetryPolicy.backoff_s:g})")  # fmt: skip


def run(args: argparse.Namespace, error: Callable[[str], None]) -> int:
    """The ``pull`` subcommand; ``error`` is the parser's (exit 2)."""
    import sys

    import docker

    from services.datasets import DatasetError, load_instances

    if args.parallel < 1:
        error(f"--parallel must be >= 1, got {args.parallel}")
    if args.retries < 0 or not 0 <= args.retry_backoff <= MAX_BACKOFF_S:
        error(f"--retries must be >= 0 and --retry-backoff in [0, {MAX_BACKOFF_S:g}]")
    policy = RetryPolicy(args.retries, args.retry_backoff)
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
        results = pull_all(client, wanted, parallel=args.parallel, retry=policy)
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
