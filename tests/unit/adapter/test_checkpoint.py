"""A refresh's model_path is checked before anything drains (adapter.checkpoint)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from adapter.checkpoint import checkpoint_problem
from tests.support.engines import tiny_model_path


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A copy of the tiny model: a real HF checkpoint directory (config.json + safetensors)."""
    source = tiny_model_path(tmp_path / "cache")
    target = tmp_path / "ckpt"
    shutil.copytree(source, target)
    return target


def test_a_real_checkpoint_passes(checkpoint: Path) -> None:
    assert checkpoint_problem(str(checkpoint)) is None


def test_sharded_checkpoint_needs_every_shard(checkpoint: Path) -> None:
    (checkpoint / "model.safetensors").rename(checkpoint / "model-00001-of-00002.safetensors")
    shutil.copy(
        checkpoint / "model-00001-of-00002.safetensors",
        checkpoint / "model-00002-of-00002.safetensors",
    )
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (checkpoint / "model.safetensors.index.json").write_text(json.dumps(index))
    assert checkpoint_problem(str(checkpoint)) is None
    (checkpoint / "model-00002-of-00002.safetensors").unlink()
    assert "missing shards" in (checkpoint_problem(str(checkpoint)) or "")


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:12])


def _garbage_header(path: Path) -> None:
    path.write_bytes(struct.pack("<Q", 4) + b"nope" + b"\0" * 64)


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda c: shutil.rmtree(c), "does not exist"),
        (lambda c: (c / "config.json").unlink(), "no config.json"),
        (lambda c: (c / "config.json").write_text("{oops"), "config.json is not valid JSON"),
        (lambda c: (c / "config.json").write_text("[1]"), "not a JSON object"),
        (lambda c: (c / "model.safetensors").unlink(), "no weights"),
        (lambda c: (c / "model.safetensors").write_bytes(b""), "is empty"),
        (lambda c: _truncate(c / "model.safetensors"), "does not fit the file"),
        (lambda c: _garbage_header(c / "model.safetensors"), "not valid JSON"),
    ],
)
def test_damaged_checkpoints_are_named(checkpoint: Path, damage, fragment: str) -> None:  # type: ignore[no-untyped-def]
    damage(checkpoint)
    problem = checkpoint_problem(str(checkpoint))
    assert problem is not None and fragment in problem


def test_paths_must_be_absolute_directories(checkpoint: Path) -> None:
    assert "absolute" in (checkpoint_problem("relative/ckpt") or "")
    assert "is a file" in (checkpoint_problem(str(checkpoint / "config.json")) or "")


def write_manifest(directory: Path) -> str:
    """A manifest as trainer.publish.versions writes it (its own code: the trainer's format)."""
    from trainer.publish.versions import MANIFEST, _manifest

    manifest = _manifest(directory, 3)
    (directory / MANIFEST).write_text(json.dumps(manifest))
    return str(manifest["weights_sha256"])


def test_a_manifest_is_verified_file_by_file(checkpoint: Path) -> None:
    checksum = write_manifest(checkpoint)
    assert checkpoint_problem(str(checkpoint)) is None
    assert checkpoint_problem(str(checkpoint), checksum) is None
    problem = checkpoint_problem(str(checkpoint), "f" * 64)
    assert problem is not None and f"has weights_sha256 {checksum!r}" in problem
    config = checkpoint / "config.json"
    text = config.read_text()
    config.write_text(text.replace("{", "{ ", 1))  # one byte more, still valid JSON
    assert checkpoint_problem(str(checkpoint)) == (
        f"config.json has {len(text) + 1} bytes, manifest.json says {len(text)}"
    )
    config.write_text(text)
    tokenizer = checkpoint / "tokenizer.json"
    data = bytearray(tokenizer.read_bytes())
    data[len(data) // 2] ^= 1  # the same size, other bytes
    tokenizer.write_bytes(bytes(data))
    assert checkpoint_problem(str(checkpoint)) == (
        "tokenizer.json does not match its sha256 in manifest.json"
    )
    tokenizer.unlink()
    assert checkpoint_problem(str(checkpoint)) == (
        "tokenizer.json (listed in manifest.json) is missing"
    )
    (checkpoint / "manifest.json").write_text("[1, 2]")
    problem = checkpoint_problem(str(checkpoint))
    assert problem is not None and problem.startswith("manifest.json is unreadable or malformed")


def test_a_checksum_needs_a_manifest(checkpoint: Path) -> None:
    problem = checkpoint_problem(str(checkpoint), "a" * 64)
    assert problem == "weights_sha256 given but model_path has no manifest.json to check it against"
