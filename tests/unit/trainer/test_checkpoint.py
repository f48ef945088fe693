"""Atomic checkpoint directories: a save killed half-way leaves the previous one loadable."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.support.engines import REPO_ROOT
from trainer import checkpoint
from trainer.checkpoint import (
    MANIFEST,
    CheckpointError,
    keep_last,
    latest_checkpoint,
    read_checkpoint,
    read_manifest,
    read_sharded_manifest,
    write_checkpoint,
    write_sharded_checkpoint,
)

CHILD = textwrap.dedent("""
    import sys, time, torch
    import trainer.checkpoint as c
    target = sys.argv[1]
    c.write_checkpoint(target, {"a.pt": {"x": torch.zeros(3)}}, {"policy_version": 1})
    real = torch.save
    def slow(obj, path):
        real(obj, path)
        print("PART WRITTEN", flush=True)
        time.sleep(60)
    c.torch.save = slow
    c.write_checkpoint(target, {"a.pt": {"x": torch.ones(3)}, "b.pt": {}}, {"policy_version": 2})
""")


@pytest.mark.slow  # kills a saving subprocess
def test_kill_9_during_a_save_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(target)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.strip() == "PART WRITTEN", line + child.stdout.read()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    manifest, parts = read_checkpoint(target)
    assert manifest["policy_version"] == 1 and set(parts) == {"a.pt"}
    assert torch.equal(parts["a.pt"]["x"], torch.zeros(3))


def test_a_failed_save_cleans_up_and_keeps_the_previous(tmp_path: Path, monkeypatch) -> None:
    target = write_checkpoint(tmp_path / "ckpt", {"a.pt": [1]}, {"policy_version": 1})

    def broken(obj: object, path: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.torch, "save", broken)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(target, {"a.pt": [2]}, {"policy_version": 2})
    assert read_checkpoint(target)[0]["policy_version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no staging left behind


def test_a_missing_part_or_a_bad_format_is_named(tmp_path: Path) -> None:
    target = write_checkpoint(tmp_path / "ckpt", {"a.pt": [1], "b.pt": [2]}, {})
    (target / "b.pt").unlink()
    with pytest.raises(CheckpointError, match=r"part b\.pt is missing"):
        read_checkpoint(target)
    manifest = json.loads((target / "manifest.json").read_text())
    manifest["format"] = 99
    (target / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="checkpoint format 99"):
        read_checkpoint(target)


def test_keep_last_prunes_old_checkpoints_and_dead_staging(tmp_path: Path) -> None:
    for step in (1, 2, 10, 3):
        write_checkpoint(tmp_path / f"step-{step}", {"a.pt": [step]}, {"policy_version": step})
    (tmp_path / ".step-11.tmp-dead").mkdir()  # left by a killed save
    (tmp_path / "step-12").mkdir()  # no manifest: not a checkpoint, left alone
    removed = keep_last(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["step-1", "step-2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-10", "step-12", "step-3"]
    with pytest.raises(ValueError, match="keep must be >= 1"):
        keep_last(tmp_path, keep=0)


def test_keep_last_never_deletes_the_newest_complete_checkpoint(tmp_path: Path) -> None:
    chooser = random.Random(3)
    for trial in range(20):
        root = tmp_path / f"trial-{trial}"
        root.mkdir()
        complete = chooser.sample(range(1, 40), chooser.randint(1, 6))
        for step in complete:
            write_checkpoint(root / f"step-{step}", {"a.pt": [step]}, {"policy_version": step})
        newer = max(complete) + chooser.randint(1, 5)
        (root / f"step-{newer}").mkdir()  # a newer directory without a manifest
        (root / f".step-{newer + 1}.tmp-killed").mkdir()  # a killed save's staging
        keep = chooser.randint(1, 4)
        keep_last(root, keep)
        left = sorted(int(p.name[5:]) for p in root.glob("step-*") if (p / MANIFEST).exists())
        assert left == sorted(complete)[-keep:], (complete, keep)
        latest = latest_checkpoint(root)
        assert latest == root / f"step-{max(complete)}"
        assert read_manifest(latest)["policy_version"] == max(complete)
    assert latest_checkpoint(tmp_path / "nowhere") is None


def test_a_deletion_killed_half_way_leaves_no_half_checkpoint(tmp_path: Path, monkeypatch) -> None:
    for step in (1, 2, 3):
        write_checkpoint(tmp_path / f"step-{step}", {"a.pt": [step], "b.pt": [0]}, {})
    real_rmtree = checkpoint.shutil.rmtree

    def killed_half_way(path: Path, ignore_errors: bool = False) -> None:
        (Path(path) / "a.pt").unlink()  # one file gone, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.shutil, "rmtree", killed_half_way)
    with pytest.raises(KeyboardInterrupt):
        keep_last(tmp_path, keep=1)
    for path in tmp_path.glob("step-*"):  # whatever still looks complete is complete
        read_manifest(path)
    monkeypatch.setattr(checkpoint.shutil, "rmtree", real_rmtree)
    keep_last(tmp_path, keep=1)  # the next pruning sweeps the leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-3"]


def write_two_files(staging: Path) -> list[str]:
    (staging / "shards").mkdir()
    torch.save({"w": torch.arange(4.0)}, staging / "shards" / "rank0.bin")
    torch.save({"step": 5}, staging / "other.pt")  # not claimed: rank 0 hashes it
    return ["shards/rank0.bin"]


def test_a_sharded_checkpoint_lists_and_checks_every_file(tmp_path: Path) -> None:
    target = write_sharded_checkpoint(tmp_path / "ckpt", write_two_files, {"steps": 5})
    manifest = read_sharded_manifest(target)
    assert set(manifest["files"]) == {"shards/rank0.bin", "other.pt"} and manifest["steps"] == 5
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    (target / "shards" / "rank0.bin").write_bytes(b"bad")
    (target / "other.pt").unlink()
    with pytest.raises(CheckpointError) as error:
        read_sharded_manifest(target)
    assert "checksum mismatch in shards/rank0.bin" in str(error.value)
    assert "part other.pt is missing" in str(error.value)  # every problem named at once
    manifest["files"]["../../etc/passwd"] = {"sha256": "0" * 64}
    (target / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="leaves the checkpoint"):
        read_sharded_manifest(target)


def test_a_failed_sharded_save_keeps_the_previous(tmp_path: Path) -> None:
    target = write_sharded_checkpoint(tmp_path / "ckpt", write_two_files, {"steps": 1})

    def full_disk(staging: Path) -> list[str]:
        (staging / "half.bin").write_bytes(b"x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_sharded_checkpoint(target, full_disk, {"steps": 2})
    assert read_sharded_manifest(target)["steps"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
