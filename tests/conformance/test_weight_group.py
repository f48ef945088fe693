"""The trainer's broadcast group against engine workers that join it with SGLang's own code.

Each engine worker is a subprocess running SGLang 0.5.23's ``WeightUpdater`` (its
``init_weights_update_group`` -> ``init_custom_process_group`` and its
``receive_weights_from_distributed``: ``tests/conformance/sglang_weight_member.py``); the
trainer's side is swerl's ``services.weight_group`` and the publisher's bucketing, as the
distributed publisher uses them. Before swerl formed its group the way SGLang does, the store
keys differed and both sides waited until their timeout (issue: "The distributed weight update
never forms its group").
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from services.weight_group import WeightGroup, join_group, open_group, open_store
from trainer.publish.distributed import make_buckets

pytestmark = pytest.mark.slow  # subprocesses that import SGLang (about 8 s each)

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 60.0


def weights() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [
        ("model.embed_tokens.weight", torch.randn(16, 8, generator=generator)),
        ("model.layers.0.mlp.up_proj.weight", torch.randn(8, 8, generator=generator)),
        ("model.norm.weight", torch.randn(8, generator=generator).to(torch.bfloat16)),
    ]


def start_member(
    port: int, rank: int, world: int, group: str, specs: list[dict], out: Path, stop_after=None
) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "tests.conformance.sglang_weight_member",
        f"--port={port}",
        f"--rank={rank}",
        f"--world-size={world}",
        f"--group={group}",
        f"--buckets={json.dumps(specs)}",
        f"--out={out}",
    ]
    if stop_after is not None:
        command.append(f"--stop-after={stop_after}")
    return subprocess.Popen(
        command,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(member: subprocess.Popen[str]) -> str:
    out, err = member.communicate(timeout=TIMEOUT_S)
    assert member.returncode == 0, f"SGLang member failed: {out}\n{err[-2000:]}"
    return out


def broadcast_all(group: WeightGroup, buckets: list, stop_after: int | None = None) -> None:
    for bucket in buckets[:stop_after]:
        for _, tensor in bucket.tensors:
            group.broadcast(tensor)


def test_sglang_workers_join_the_trainers_group_and_receive_every_bucket(tmp_path: Path) -> None:
    """Two SGLang workers (ranks 1, 2) and a reference-engine rank (3, unregistered, in this
    process) join the trainer's group (rank 0, registered as SGLang's function registers it)
    and receive the buckets bit for bit."""
    named = weights()
    buckets = make_buckets(named, bucket_bytes=600)
    specs = [b.spec() for b in buckets]
    assert len(specs) >= 2
    store = open_store("127.0.0.1", 0, 0, 4, TIMEOUT_S)
    outs = [tmp_path / "r1.pt", tmp_path / "r2.pt"]
    members = [
        start_member(store.port, r, 4, "swerl-weights", specs, out)
        for r, out in zip((1, 2), outs, strict=True)
    ]
    reference: list[WeightGroup] = []
    joiner = threading.Thread(
        target=lambda: reference.append(
            open_group(
                master_address="127.0.0.1",
                master_port=store.port,
                rank=3,
                world_size=4,
                group_name="swerl-weights",
                backend="gloo",
                timeout_s=TIMEOUT_S,
            )
        )
    )
    joiner.start()
    trainer = join_group(
        store, rank=0, world_size=4, group_name="swerl-weights", backend="gloo", timeout_s=TIMEOUT_S
    )
    joiner.join(TIMEOUT_S)
    try:
        received = {name: torch.empty_like(t) for name, t in named}
        pending = [reference[0].broadcast_async(received[name]) for name, _ in named]
        broadcast_all(trainer, buckets)
        for work in pending:
            work.wait()
        for member in members:
            assert '"joined": true' in finish(member)
    finally:
        trainer.destroy()
        for member in members:
            member.kill()
    for out in outs:
        got = torch.load(out)
        assert list(got) == [name for name, _ in named]
        for name, tensor in named:
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    for name, tensor in named:
        assert torch.equal(received[name], tensor), name


def test_a_group_abandoned_midway_is_formed_again_under_the_same_name(tmp_path: Path) -> None:
    """The adapter stops a version at a refused bucket: the SGLang worker receives bucket 0
    only (then leaves, as ``/destroy_weights_update_group`` makes it), the trainer's broadcast
    of bucket 1 cannot complete. The trainer drops its group (destroy: torch refuses a name
    twice in one process) and the next version forms the same name again with a new worker."""
    named = weights()
    buckets = make_buckets(named, bucket_bytes=600)
    specs = [b.spec() for b in buckets]
    store = open_store("127.0.0.1", 0, 0, 2, TIMEOUT_S)
    member = start_member(store.port, 1, 2, "g", specs, tmp_path / "a.pt", stop_after=1)
    trainer = join_group(
        store, rank=0, world_size=2, group_name="g", backend="gloo", timeout_s=TIMEOUT_S
    )
    broadcast_all(trainer, buckets, stop_after=1)
    assert member.stdout is not None
    for line in member.stdout:  # the worker received bucket 0 and stays up, receiving no more
        if "received" in line:
            break
    failed: list[BaseException] = []

    def send_rest() -> None:
        try:
            broadcast_all(trainer, buckets[1:])
        except RuntimeError as exc:
            failed.append(exc)

    blocked = threading.Thread(target=send_rest, daemon=True)
    blocked.start()
    blocked.join(1.0)
    assert blocked.is_alive()  # nobody receives bucket 1
    started = time.perf_counter()
    trainer.destroy()
    assert time.perf_counter() - started < 5.0
    member.kill()  # the engine leaves the group: the blocked broadcast fails, it never hangs
    member.wait(TIMEOUT_S)
    blocked.join(TIMEOUT_S)
    assert not blocked.is_alive() and failed
    store = open_store("127.0.0.1", 0, 0, 2, TIMEOUT_S)
    member = start_member(store.port, 1, 2, "g", specs, tmp_path / "b.pt")
    trainer = join_group(
        store, rank=0, world_size=2, group_name="g", backend="gloo", timeout_s=TIMEOUT_S
    )
    try:
        broadcast_all(trainer, buckets)
        finish(member)
    finally:
        trainer.destroy()
        member.kill()
    got = torch.load(tmp_path / "b.pt")
    assert all(torch.equal(got[name], tensor) for name, tensor in named)
