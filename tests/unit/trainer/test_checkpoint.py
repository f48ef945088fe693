"""Atomic checkpoint directories: a save killed half-way leaves the previous one loadable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.support.engines import REPO_ROOT
from trainer import checkpoint
from trainer.checkpoint import CheckpointError, keep_last, read_checkpoint, write_checkpoint

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
