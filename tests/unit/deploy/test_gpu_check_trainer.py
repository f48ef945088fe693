"""``deploy/gpu_check_trainer.sh`` (the trainer's GPU check, run on a device machine): its help,
and on a machine without a GPU a clear FAIL line and exit 1 before anything starts."""

from __future__ import annotations

import subprocess

import pytest
import torch

from tests.support.deploy_scripts import DEPLOY

SCRIPT = DEPLOY / "gpu_check_trainer.sh"


def test_help_lists_the_checks() -> None:
    out = subprocess.run([str(SCRIPT), "--help"], capture_output=True, text=True, check=True)
    checks = ("tests/gpu", "score", "toy Li2SAO run", "torchrun with 2 ranks (NCCL")
    stages = "two pipeline\n   stages (fp32, and bf16)"
    for check in (*checks, stages, "bench_trainer.py --device cuda"):
        assert check in out.stdout
    assert "STEP_TIMEOUT" in out.stdout  # the whole header, its last line too
    assert "toy_run megatron-2stages-bf16-nccl 2 " in SCRIPT.read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: run the script itself")
def test_without_a_gpu_it_fails_at_once(tmp_path: object) -> None:
    got = subprocess.run([str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert got.returncode == 1
    assert got.stdout.strip() == "FAIL cuda: torch sees no GPU (torch.cuda.is_available() is False)"
