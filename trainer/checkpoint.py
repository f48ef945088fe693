"""Atomic checkpoint directories with a manifest of checksums.

:func:`write_checkpoint` writes every part with ``torch.save`` into a hidden sibling staging
directory, adds ``manifest.json`` (caller metadata + sha256 and size of every file), fsyncs, and
only then renames the staging directory into place. A process killed while writing leaves the
previous checkpoint untouched (at worst a ``.name.tmp-*`` directory to delete).
:func:`read_checkpoint` checks the manifest and every checksum before loading anything and
raises :class:`CheckpointError` naming the problem.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


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


def read_manifest(directory: str | Path) -> dict[str, Any]:
    """The checked manifest of a checkpoint directory (every file present, checksums equal)."""
    root = Path(directory)
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
        part = root / name
        if not part.is_file():
            raise CheckpointError(f"checkpoint {root}: part {name} is missing")
        try:
            expected = entry["sha256"]
        except (KeyError, TypeError) as exc:
            raise CheckpointError(f"corrupt manifest {path}: entry {name}: {exc!r}") from exc
        if _sha256(part) != expected:
            raise CheckpointError(f"checkpoint {root}: checksum mismatch in {name} (corrupt)")
    return manifest


def read_checkpoint(directory: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(manifest, parts)`` of a checked checkpoint; parts loaded with ``weights_only``."""
    manifest = read_manifest(directory)
    parts = {
        name: torch.load(Path(directory) / name, map_location="cpu", weights_only=True)
        for name in manifest["files"]
    }
    return manifest, parts


def keep_last(root: str | Path, keep: int, prefix: str = "step-") -> list[Path]:
    """Delete all but the ``keep`` newest checkpoints ``root/<prefix>N`` (by N); return them.

    Only complete checkpoints (a manifest present) count and are deleted; staging leftovers of
    a killed save (``.<name>.tmp-*``) are removed too.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    base = Path(root)
    if not base.is_dir():
        return []
    steps = []
    for path in base.iterdir():
        number = path.name[len(prefix) :]
        if path.name.startswith(prefix) and number.isdigit() and (path / MANIFEST).is_file():
            steps.append((int(number), path))
        elif path.name.startswith(".") and ".tmp-" in path.name and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
    steps.sort()
    doomed = [path for _, path in steps[:-keep]]
    for path in doomed:
        shutil.rmtree(path)
    return doomed
