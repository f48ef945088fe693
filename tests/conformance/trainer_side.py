"""Rank 0 of a weight-update group, in a process of its own, with swerl's trainer-side code.

``python -m tests.conformance.trainer_side SPEC_JSON`` joins the group as swerl's distributed
publisher does (``services.weight_group.open_store`` + ``join_group``, registered under the
group name like SGLang's ``init_custom_process_group``), then broadcasts the buckets of
:func:`buckets_of` in order and exits. The SGLang side (rank 1) lives in the test process; a
process of its own keeps torch from seeing two groups of one name in one process.

SPEC: ``{"master_port", "world_size", "group_name", "model_dir", "bucket_bytes", "extra"}``;
``extra`` (optional) is ``{"name", "shape", "after_bucket"}``: an unknown tensor appended to the
bucket of that index (to make SGLang refuse a bucket midway).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from services.weight_group import join_group, open_store
from trainer.publish.distributed import Bucket, make_buckets

MASTER_ADDRESS = "127.0.0.1"
TIMEOUT_S = 60.0
GROUP = "weight_update_group"
BUCKET_BYTES = 64 * 1024  # several buckets for the tiny model
REPO_ROOT = Path(__file__).resolve().parents[2]


def buckets_of(spec: dict[str, Any]) -> list[Bucket]:
    """The version's buckets: the checkpoint's tensors in name order, ``bucket_bytes`` each."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(Path(spec["model_dir"]).glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    buckets = make_buckets(sorted(tensors.items()), int(spec["bucket_bytes"]))
    extra = spec.get("extra")
    if extra:
        bad = torch.ones(extra["shape"], dtype=torch.float32)
        buckets[extra["after_bucket"]].tensors.append((extra["name"], bad))
    return buckets


def start_trainer(port: int, model_dir: Path, **extra: Any) -> subprocess.Popen[str]:
    """Rank 0 in a process of its own (tests/conformance/trainer_side.py)."""
    spec = {
        "master_port": port,
        "world_size": 2,
        "group_name": GROUP,
        "model_dir": str(model_dir),
        "bucket_bytes": BUCKET_BYTES,
        **extra,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "tests.conformance.trainer_side", json.dumps(spec)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(trainer: subprocess.Popen[str]) -> str:
    try:
        out, _ = trainer.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        trainer.kill()
        out, _ = trainer.communicate()
    return out


def main(spec: dict[str, Any]) -> int:
    store = open_store(MASTER_ADDRESS, spec["master_port"], 0, spec["world_size"], TIMEOUT_S)
    group = join_group(
        store,
        rank=0,
        world_size=spec["world_size"],
        group_name=spec["group_name"],
        backend="gloo",
        timeout_s=TIMEOUT_S,
    )
    print("joined", flush=True)
    for index, bucket in enumerate(buckets_of(spec)):
        for _, tensor in bucket.tensors:
            group.broadcast(tensor)
        print(f"bucket {index} sent", flush=True)
    group.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(json.loads(sys.argv[1])))
