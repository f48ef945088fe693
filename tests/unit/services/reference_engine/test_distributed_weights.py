"""The reference engine's receiving side of SGLang's distributed weight update (gloo, in-process).

Rank 0 (a thread of this test, standing in for the trainer) broadcasts; the receiver is rank 1.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from services.protocol.sglang import (
    InitWeightsUpdateGroupRequest,
    UpdateWeightsFromDistributedRequest,
)
from services.reference_engine.distributed_weights import (
    DistributedReceiver,
    DistributedUpdateError,
)
from services.reference_engine.model_runner import ModelRunner
from services.weight_group import WeightGroup, join_group, open_store
from tests.support.engines import tiny_model_for_session
from trainer.publish.distributed import make_buckets

pytestmark = pytest.mark.slow  # loads the model and joins gloo groups


@pytest.fixture(scope="module")
def runner() -> Iterator[ModelRunner]:
    with tiny_model_for_session() as path:
        yield ModelRunner(Path(path))


def connect(receiver: DistributedReceiver, group_name: str) -> WeightGroup:
    store = open_store("127.0.0.1", 0, 0, 2, 30)
    joined: list[WeightGroup] = []
    thread = threading.Thread(
        target=lambda: joined.append(
            join_group(
                store, rank=0, world_size=2, group_name=group_name, backend="gloo", timeout_s=30
            )
        )
    )
    thread.start()
    request = InitWeightsUpdateGroupRequest(
        master_address="127.0.0.1",
        master_port=store.port,
        rank_offset=1,
        world_size=2,
        group_name=group_name,
        backend="gloo",
    )
    receiver.init_group(request)
    thread.join(30)
    return joined[0]


def send(group: WeightGroup, buckets: list[list[tuple[str, torch.Tensor]]]) -> threading.Thread:
    def run() -> None:
        for bucket in buckets:
            for _, tensor in bucket:
                group.broadcast(tensor.clone())

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def request(bucket: list[tuple[str, torch.Tensor]], group: str, version: str | None = None):
    return UpdateWeightsFromDistributedRequest(
        names=[n for n, _ in bucket],
        dtypes=[str(t.dtype).removeprefix("torch.") for _, t in bucket],
        shapes=[list(t.shape) for _, t in bucket],
        group_name=group,
        weight_version=version,
    )


def test_a_bad_bucket_is_received_in_full_then_refused_and_the_next_ones_still_load(
    runner: ModelRunner,
) -> None:
    """SGLang receives a bucket before loading it and loads buckets one by one: a bucket that
    does not fit is refused with SGLang's load message after every one of its broadcasts
    completed (the trainer is never left waiting), and the buckets after it are received and
    returned for loading on their own (nothing is staged)."""
    receiver = DistributedReceiver(runner, timeout_s=30)
    group = connect(receiver, "g1")
    shapes = runner.weight_shapes()
    names = list(shapes)[:2]
    good = [[(n, torch.full(shapes[n], 0.5))] for n in names]
    bad = [(names[0], torch.full(shapes[names[0]], 0.25)), ("model.not_a_weight", torch.zeros(3))]
    sender = send(group, [bad, *good])
    with pytest.raises(DistributedUpdateError) as refused:
        receiver.receive(request(bad, "g1"))
    message = str(refused.value)
    assert message.startswith("Failed to update parameter online: ")
    assert "unknown parameter 'model.not_a_weight'" in message
    assert message.endswith(
        "The full weights of the ModelRunner are partially updated. "
        "Please discard the whole weights."
    )
    first = receiver.receive(request(good[0], "g1"))
    last = receiver.receive(request(good[1], "g1", version="5"))
    sender.join(30)
    assert not sender.is_alive()  # every broadcast completed: the trainer was never left waiting
    assert list(first) == [names[0]] and list(last) == [names[1]]  # each bucket by itself
    assert torch.equal(first[names[0]], torch.full(shapes[names[0]], 0.5))
    assert torch.equal(last[names[1]], torch.full(shapes[names[1]], 0.5))


def test_destroy_leaves_the_group_with_sglangs_messages(runner: ModelRunner) -> None:
    receiver = DistributedReceiver(runner, timeout_s=30)
    connect(receiver, "g-destroy")
    assert receiver.destroy_group("g-destroy") == "Succeeded to destroy custom process group."
    assert "g-destroy" not in receiver.groups
    with pytest.raises(
        DistributedUpdateError, match=r"^The group to be destroyed does not exist\.$"
    ):
        receiver.destroy_group("g-destroy")
    bucket = [("model.norm.weight", torch.zeros(4))]
    with pytest.raises(DistributedUpdateError, match="no weight update group 'g-destroy'"):
        receiver.receive(request(bucket, "g-destroy"))


def test_malformed_requests_are_refused_without_joining_a_broadcast(runner: ModelRunner) -> None:
    receiver = DistributedReceiver(runner, timeout_s=30)
    bucket = [("model.norm.weight", torch.zeros(4))]
    with pytest.raises(
        DistributedUpdateError, match=r"^Failed to receive weights: no weight update group 'nope'"
    ):
        receiver.receive(request(bucket, "nope"))
    odd = request(bucket, "nope").model_copy(update={"dtypes": []})
    with pytest.raises(
        DistributedUpdateError, match=r"^Failed to receive weights: .*differ in length"
    ):
        receiver.receive(odd)
    nccl = InitWeightsUpdateGroupRequest(
        master_address="127.0.0.1", master_port=1, rank_offset=1, world_size=2, backend="nccl"
    )
    with pytest.raises(DistributedUpdateError, match="runs on the CPU, use gloo"):
        receiver.init_group(nccl)


def test_buckets_hold_consecutive_tensors_up_to_the_size() -> None:
    weights = [(f"w{i}", torch.zeros(n)) for i, n in enumerate([10, 10, 30, 5, 5])]
    buckets = make_buckets(weights, bucket_bytes=80)  # 20 float32 numbers
    assert [[n for n, _ in b.tensors] for b in buckets] == [["w0", "w1"], ["w2"], ["w3", "w4"]]
    assert buckets[1].spec() == {"names": ["w2"], "dtypes": ["float32"], "shapes": [[30]]}
