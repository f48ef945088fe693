"""Checking a checkpoint directory before a weight refresh drains anything.

``POST /admin/weights`` closes the admission gate, drains the agent steps in flight and has every
engine load ``model_path``. A path that cannot load would take every engine out of rotation
after all that, so the adapter checks it first, on its own filesystem (the engines read the same
shared path), and refuses a bad one with a 400 while nothing has changed:

* an absolute path to a directory (what SGLang's ``update_weights_from_disk`` loads; a relative
  path would be resolved against each engine's working directory);
* ``config.json`` readable and a JSON object;
* weights: ``*.safetensors`` (every shard named by ``model.safetensors.index.json`` when there
  is one) or ``pytorch_model*.bin``; each file readable and non-empty, and each safetensors file
  with a well-formed header (8-byte little-endian length, then a JSON object that fits in the
  file), which catches a truncated or half-written file.

* a ``manifest.json`` (what swerl's trainer publishes, :mod:`trainer.publish.versions`): every
  file it lists present with its size and sha256, and, when the refresh names a
  ``weights_sha256``, the manifest's equal to it. A directory without a manifest (weights
  written by something else) is checked as above only, and cannot be named by a checksum.

Loading can still fail on the engine (shapes that do not match the served model): that is the
refresh state machine's business, not this check's.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

# safetensors caps its JSON header at 100 MB.
_MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def _safetensors_problem(path: Path) -> str | None:
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                return f"{path.name} is shorter than a safetensors header"
            (length,) = struct.unpack("<Q", head)
            if length == 0 or length > min(_MAX_SAFETENSORS_HEADER, size - 8):
                return f"{path.name}: header length {length} does not fit the file ({size} bytes)"
            header = handle.read(length)
        if not isinstance(json.loads(header), dict):
            return f"{path.name}: the header is not a JSON object"
    except OSError as exc:
        return f"cannot read {path.name}: {exc.strerror or exc}"
    except (UnicodeDecodeError, ValueError):
        return f"{path.name}: the header is not valid JSON (not a safetensors file?)"
    return None


def _weight_files(directory: Path) -> tuple[list[Path], str | None]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted({str(v) for v in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return [], f"{index.name} is unreadable or has no weight_map ({exc})"
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            return [], f"{index.name} names missing shards: {missing[:5]}"
        return [directory / s for s in shards], None
    files = sorted(directory.glob("*.safetensors")) or sorted(directory.glob("pytorch_model*.bin"))
    if not files:
        return [], "no weights (*.safetensors or pytorch_model*.bin)"
    return files, None


MANIFEST = "manifest.json"  # trainer.publish.versions writes it; this module reads it


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _manifest_problem(directory: Path, weights_sha256: str | None) -> str | None:
    """The manifest's files against the directory (sizes first, then checksums), and its
    ``weights_sha256`` against the one the refresh names."""
    path = directory / MANIFEST
    if not path.is_file():
        if weights_sha256 is not None:
            return f"weights_sha256 given but model_path has no {MANIFEST} to check it against"
        return None
    try:
        manifest = json.loads(path.read_bytes())
        files = {str(name): entry for name, entry in manifest["files"].items()}
        sizes = {name: int(entry["bytes"]) for name, entry in files.items()}
        sums = {name: str(entry["sha256"]) for name, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return f"{MANIFEST} is unreadable or malformed ({type(exc).__name__}: {exc})"
    if weights_sha256 is not None and manifest.get("weights_sha256") != weights_sha256:
        return (
            f"{MANIFEST} has weights_sha256 {manifest.get('weights_sha256')!r}, the refresh "
            f"names {weights_sha256!r}"
        )
    try:
        for name, size in sizes.items():
            file = directory / name
            if not file.is_file():
                return f"{name} (listed in {MANIFEST}) is missing"
            if file.stat().st_size != size:
                return f"{name} has {file.stat().st_size} bytes, {MANIFEST} says {size}"
        for name, digest in sums.items():
            if _sha256(directory / name) != digest:
                return f"{name} does not match its sha256 in {MANIFEST}"
    except OSError as exc:
        return f"cannot read the files {MANIFEST} lists: {exc.strerror or exc}"
    return None


def manifest_weights_sha256(model_path: str) -> str | None:
    """``weights_sha256`` of ``model_path``'s manifest (None without a readable one)."""
    try:
        value = json.loads((Path(model_path) / MANIFEST).read_bytes()).get("weights_sha256")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def checkpoint_problem(model_path: str, weights_sha256: str | None = None) -> str | None:
    """Why ``model_path`` is not a loadable checkpoint directory, or None if it looks like one
    (its manifest, if any, verified; ``weights_sha256``: the checksum it must carry)."""
    path = Path(model_path)
    if not path.is_absolute():
        return "model_path must be an absolute path (engines resolve relative paths elsewhere)"
    try:
        if not path.is_dir():
            return "model_path does not exist" if not path.exists() else "model_path is a file"
    except OSError as exc:
        return f"cannot access model_path: {exc.strerror or exc}"
    config = path / "config.json"
    try:
        if not isinstance(json.loads(config.read_bytes()), dict):
            return "config.json is not a JSON object"
    except FileNotFoundError:
        return "no config.json in model_path"
    except OSError as exc:
        return f"cannot read config.json: {exc.strerror or exc}"
    except (UnicodeDecodeError, ValueError):
        return "config.json is not valid JSON"
    files, problem = _weight_files(path)
    if problem is not None:
        return problem
    for file in files:
        if not os.access(file, os.R_OK):
            return f"{file.name} is not readable"
        if file.stat().st_size == 0:
            return f"{file.name} is empty"
        if file.suffix == ".safetensors":
            problem = _safetensors_problem(file)
            if problem is not None:
                return problem
    return _manifest_problem(path, weights_sha256)
