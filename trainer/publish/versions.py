"""The weights directory: ``<weights_dir>/v<version>/`` HF exports with a checksum manifest.

:func:`export_version` writes a version atomically: ``export_hf`` into a hidden staging
directory beside the target, a ``manifest.json`` (sha256 and size of every file, and
``weights_sha256`` over the safetensors files), fsync of every file and the directory, then one
rename. A kill at any point leaves no ``v<N>`` directory that is incomplete. Exporting a version
that exists already is idempotent when the weights are the same, and an error when they differ.
:func:`prune_versions` keeps the newest K and never deletes a protected (served) version.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from trainer.backends.base import TrainerBackend
from trainer.checkpoint import _fsync, _sha256
from trainer.publish.base import PublishError

MANIFEST = "manifest.json"
PREFIX = "v"


def version_dir(root: str | Path, version: int) -> Path:
    return Path(root).resolve() / f"{PREFIX}{version}"


def _manifest(directory: Path, version: int) -> dict[str, Any]:
    files = {}
    for path in sorted(directory.iterdir()):
        if path.is_file() and path.name != MANIFEST:
            _fsync(path)
            files[path.name] = {"sha256": _sha256(path), "bytes": path.stat().st_size}
    weights = hashlib.sha256()
    for name, entry in files.items():
        if name.endswith(".safetensors"):
            weights.update(f"{name}:{entry['sha256']}\n".encode())
    return {"version": version, "weights_sha256": weights.hexdigest(), "files": files}


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a published version, every checksum verified (PublishError if not)."""
    try:
        manifest: dict[str, Any] = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise PublishError(f"{directory}: no readable {MANIFEST}: {exc}") from exc
    for name, entry in manifest.get("files", {}).items():
        path = directory / name
        if not path.is_file() or _sha256(path) != entry["sha256"]:
            raise PublishError(f"{directory}: {name} is missing or does not match its checksum")
    return manifest


def weights_checksum(directory: Path) -> str:
    """``weights_sha256`` of an exported version's manifest (read, not re-verified: the
    adapter verifies every file before it loads them)."""
    try:
        value = json.loads((directory / MANIFEST).read_text())["weights_sha256"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PublishError(
            f"{directory}: no readable {MANIFEST} with weights_sha256: {exc}"
        ) from exc
    return str(value)


def directory_probes(directory: Path) -> list[dict[str, Any]]:
    """:func:`trainer.publish.base.weight_probes` of an exported version, read from its
    safetensors files (only the one-dimensional tensors, and of those only two are loaded)."""
    from safetensors import safe_open

    from trainer.publish.base import weight_probes

    flat: dict[str, Path] = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if len(handle.get_slice(name).get_shape()) == 1:
                    flat[name] = file
    names = sorted(flat)
    chosen = names if len(names) <= 2 else [names[0], names[-1]]

    def load(name: str) -> Any:
        with safe_open(str(flat[name]), framework="pt") as handle:
            return handle.get_tensor(name)

    return weight_probes((name, load(name)) for name in chosen)


def export_version(backend: TrainerBackend, root: str | Path, version: int) -> Path:
    """Export ``backend``'s actor as ``root/v<version>`` (atomic, manifest, idempotent)."""
    target = version_dir(root, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        exported = backend.export_hf(staging / "export")
        manifest = _manifest(exported, version)
        (exported / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync(exported / MANIFEST)
        _fsync(exported)
        if target.exists():
            existing = read_manifest(target)
            if existing.get("weights_sha256") != manifest["weights_sha256"]:
                raise PublishError(
                    f"{target} exists with other weights (sha256 {existing.get('weights_sha256')}"
                    f" != {manifest['weights_sha256']}): a published version is never replaced"
                )
            return target  # the same weights again: idempotent
        os.rename(exported, target)
        _fsync(target.parent)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def exported_versions(root: str | Path) -> list[int]:
    """The numbers of the ``v<N>`` directories under ``root``, ascending (none: ``[]``)."""
    base = Path(root)
    if not base.is_dir():
        return []
    return sorted(
        int(path.name[len(PREFIX) :])
        for path in base.iterdir()
        if path.name.startswith(PREFIX) and path.name[len(PREFIX) :].isdigit() and path.is_dir()
    )


def prune_versions(root: str | Path, keep: int, protect: set[int]) -> list[Path]:
    """Delete all but the ``keep`` newest ``v<N>`` directories, never a protected N.

    Staging leftovers of a killed export (``.v<N>.tmp-*``) are removed too.
    """
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    base = Path(root)
    if not base.is_dir():
        return []
    found: list[tuple[int, Path]] = []
    for path in base.iterdir():
        number = path.name[len(PREFIX) :]
        if path.name.startswith(PREFIX) and number.isdigit() and path.is_dir():
            found.append((int(number), path))
        elif path.name.startswith(".") and ".tmp-" in path.name and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
    found.sort()
    doomed = [path for n, path in found[:-keep] if n not in protect]
    for path in doomed:
        shutil.rmtree(path)
    return doomed
