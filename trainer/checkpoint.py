"""Atomic checkpoint directories with a manifest of checksums.

:func:`write_checkpoint` writes every part with ``torch.save`` into a hidden sibling staging
directory, adds ``manifest.json`` (caller metadata + sha256 and size of every file), fsyncs, and
only then renames the staging directory into place. A process killed while writing leaves the
previous checkpoint untouched (at worst a ``.name.tmp-*`` directory to delete).
:func:`read_checkpoint` checks the manifest and every checksum before loading anything and
raises :class:`CheckpointError` naming the problem.

:func:`write_sharded_checkpoint` / :func:`read_sharded_manifest` are the same protocol for a
checkpoint every data-parallel rank writes its own files into (torch.distributed.checkpoint
shards): one staging directory, one manifest, one rename. :func:`keep_last` prunes old
checkpoints without ever touching the newest complete one; :func:`latest_checkpoint` finds it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
# Hidden directories a killed save (.tmp-, .old-) or a killed deletion (.del-) leaves behind.
LEFTOVERS = (".tmp-", ".old-", ".del-")


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit what is loading it."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_directory(directory: str | Path) -> Iterator[Path]:
    """Yield a staging directory that replaces ``directory`` by rename when the block succeeds.

    A failure (or a kill) inside the block leaves ``directory`` as it was.
    """
    target = Path(directory).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield staging
        _fsync(staging)
        old = None
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
        os.replace(staging, target)
        _fsync(target.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def write_checkpoint(
    directory: str | Path, parts: Mapping[str, Any], meta: Mapping[str, Any]
) -> Path:
    """Write ``parts`` (file name -> object for ``torch.save``) and a manifest, atomically."""
    with atomic_directory(directory) as staging:
        files = {}
        for name, obj in parts.items():
            if "/" in name or name == MANIFEST:
                raise ValueError(f"bad checkpoint part name {name!r}")
            path = staging / name
            torch.save(obj, path)
            _fsync(path)
            files[name] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
        manifest = {"format": FORMAT_VERSION, **meta, "files": files}
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync(staging / MANIFEST)
    return Path(directory).resolve()


def _parse_manifest(root: Path) -> dict[str, Any]:
    """The manifest of ``root``, its structure checked (not yet the files it lists)."""
    path = root / MANIFEST
    if not path.is_file():
        raise CheckpointError(f"{root} is not a checkpoint: {MANIFEST} is missing")
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
        fmt = manifest["format"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"corrupt manifest {path}: {exc!r}") from exc
    if fmt != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {fmt!r}, expected {FORMAT_VERSION}")
    if not isinstance(files, dict):
        raise CheckpointError(f"corrupt manifest {path}: 'files' is not a mapping")
    for name, entry in files.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            raise CheckpointError(f"corrupt manifest {path}: entry {name}: no sha256")
        if name.startswith("/") or ".." in Path(name).parts:
            raise CheckpointError(f"corrupt manifest {path}: part {name!r} leaves the checkpoint")
    return manifest


def _file_problem(root: Path, name: str, entry: Mapping[str, Any]) -> str | None:
    part = root / name
    if not part.is_file():
        return f"checkpoint {root}: part {name} is missing"
    if _sha256(part) != entry["sha256"]:
        return f"checkpoint {root}: checksum mismatch in {name} (corrupt)"
    return None


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The checked manifest of a checkpoint directory (every file present, checksums equal)."""
    root = Path(directory)
    manifest = _parse_manifest(root)
    for name, entry in manifest["files"].items():
        problem = _file_problem(root, name, entry)
        if problem is not None:
            raise CheckpointError(problem)
    return manifest


def read_checkpoint(directory: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(manifest, parts)`` of a checked checkpoint; parts loaded with ``weights_only``."""
    manifest = read_manifest(directory)
    parts = {
        name: torch.load(Path(directory) / name, map_location="cpu", weights_only=True)
        for name in manifest["files"]
    }
    return manifest, parts


def _distributed() -> tuple[int, int]:
    """``(rank, world)`` of the default process group; ``(0, 1)`` without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _all_gather(obj: Any, world: int) -> list[Any]:
    if world == 1:
        return [obj]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, obj)
    return gathered


def _entry(path: Path) -> dict[str, Any]:
    return {"sha256": _sha256(path), "bytes": path.stat().st_size}


def _write_rank_files(staging: Path, write: Callable[[Path], Iterable[str]]) -> dict[str, Any]:
    """Run this rank's ``write`` and checksum what it wrote; every rank learns every outcome."""
    rank, world = _distributed()
    failure: Exception | None = None
    try:
        outcome: dict[str, Any] = {"files": {n: _entry(staging / n) for n in write(staging)}}
    except Exception as exc:
        if world == 1:
            raise
        failure, outcome = exc, {"error": f"rank {rank}: {exc!r}"}
    outcomes = _all_gather(outcome, world)
    if failure is not None:
        raise failure
    errors = [o["error"] for o in outcomes if "error" in o]
    if errors:
        raise CheckpointError(f"checkpoint save failed on another rank: {'; '.join(errors)}")
    return {name: entry for o in outcomes for name, entry in o["files"].items()}


def _finish_staging(staging: Path, files: dict[str, Any], meta: Mapping[str, Any]) -> None:
    """Rank 0: checksum the unclaimed files, write the manifest, fsync every directory."""
    for path in sorted(staging.rglob("*")):
        name = path.relative_to(staging).as_posix()
        if path.is_file() and name not in files:
            files[name] = _entry(path)
    manifest = {"format": FORMAT_VERSION, **meta, "files": dict(sorted(files.items()))}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    for path in (staging / MANIFEST, *(p for p in staging.rglob("*") if p.is_dir())):
        _fsync(path)


def write_sharded_checkpoint(
    directory: str | Path, write: Callable[[Path], Iterable[str]], meta: Mapping[str, Any]
) -> Path:
    """A checkpoint written by every data-parallel rank, atomically (a collective).

    Rank 0 makes the hidden staging directory and tells the others; every rank calls
    ``write(staging)``, which writes that rank's files (its torch.distributed.checkpoint
    shards, its RNG states) and returns the names (relative to ``staging``) this rank
    checksums itself. Rank 0 then hashes whatever nobody claimed, writes ``manifest.json``
    (``meta`` + every file's sha256 and size), fsyncs every directory and renames the staging
    directory into place, and tells the others whether that worked. A failure or a kill
    anywhere before the rename leaves ``directory`` as it was. Without ``torch.distributed``
    it is the one-process case of the same protocol.
    """
    rank, world = _distributed()
    if rank != 0:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            raise CheckpointError(f"checkpoint save to {directory} failed on rank 0")
        _write_rank_files(Path(box[0]), write)
        dist.broadcast_object_list(box, src=0)
        if box[0] is not None:
            raise CheckpointError(f"checkpoint save to {directory} failed on rank 0: {box[0]}")
        return Path(directory).resolve()
    phase = "staging"  # what the other ranks wait for if rank 0 fails: the staging path
    try:
        with atomic_directory(directory) as staging:
            if world > 1:
                dist.broadcast_object_list([str(staging)], src=0)
            phase = "writing"  # a failure here is raised on every rank by _write_rank_files
            files = _write_rank_files(staging, write)
            phase = "finishing"  # the others wait for the outcome of the rename
            _finish_staging(staging, files, meta)
    except BaseException as exc:
        if world > 1 and phase != "writing":
            dist.broadcast_object_list([None if phase == "staging" else repr(exc)], src=0)
        raise
    if world > 1:
        dist.broadcast_object_list([None], src=0)
    return Path(directory).resolve()


def read_sharded_manifest(directory: str | Path) -> dict[str, Any]:
    """:func:`read_manifest` shared out: each rank checks every ``world``-th file (a collective).

    Every rank raises the same :class:`CheckpointError` naming every missing or corrupt file.
    """
    root = Path(directory)
    rank, world = _distributed()
    manifest = _parse_manifest(root)  # the same file on every rank: the same outcome
    names = sorted(manifest["files"])
    mine = [
        problem
        for name in names[rank::world]
        if (problem := _file_problem(root, name, manifest["files"][name])) is not None
    ]
    problems = sorted(p for ps in _all_gather(mine, world) for p in ps)
    if problems:
        raise CheckpointError("; ".join(problems))
    return manifest


def _numbered(base: Path, prefix: str) -> list[tuple[int, Path]]:
    """Complete checkpoints ``base/<prefix>N`` (a manifest present), oldest first."""
    steps = []
    for path in base.iterdir():
        number = path.name[len(prefix) :]
        if path.name.startswith(prefix) and number.isdigit() and (path / MANIFEST).is_file():
            steps.append((int(number), path))
    return sorted(steps)


def latest_checkpoint(root: str | Path, prefix: str = "step-") -> Path | None:
    """The newest complete checkpoint ``root/<prefix>N`` (largest N), or None."""
    base = Path(root)
    steps = _numbered(base, prefix) if base.is_dir() else []
    return steps[-1][1] if steps else None


def keep_last(root: str | Path, keep: int, prefix: str = "step-") -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints ``root/<prefix>N`` (by N); return them.

    Only complete checkpoints (a manifest present) count and are deleted, so the newest
    complete one always stays. Each doomed checkpoint is first renamed to a hidden
    ``.<name>.del-*`` (atomic), then removed: a kill half-way through a deletion never leaves a
    half-deleted checkpoint that still looks complete. Leftovers of killed saves and deletions
    (``.<name>.tmp-*``, ``.<name>.old-*``, ``.<name>.del-*``) are removed too. Call it from
    the process (rank 0) that saves, between saves.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    base = Path(root)
    if not base.is_dir():
        return []
    steps = _numbered(base, prefix)
    doomed = [path for _, path in steps[:-keep]]
    for path in doomed:
        path.rename(path.with_name(f".{path.name}.del-{os.getpid()}"))
    for path in base.iterdir():
        hidden = path.name.startswith(".")
        if hidden and path.is_dir() and any(t in path.name for t in LEFTOVERS):
            shutil.rmtree(path, ignore_errors=True)
    return doomed


class SavesCheckpoints(Protocol):
    """What :func:`save_and_prune` needs of a backend."""

    steps: int

    def save(self, directory: str | Path, extra: Mapping[str, Any] | None = None) -> Path: ...


def save_and_prune(
    backend: SavesCheckpoints,
    root: str | Path,
    keep: int,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """``backend.save(root/step-<steps>)`` (every rank calls), then rank 0 keeps the last ``keep``.

    ``keep`` is ``trainer.checkpoint.keep_last`` of the config. The pruning runs only after
    the new checkpoint is complete, so at least one complete checkpoint exists at every moment.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    path = backend.save(Path(root) / f"step-{backend.steps}", extra)
    if _distributed()[0] == 0:
        keep_last(root, keep)
    return path
