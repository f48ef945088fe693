"""One SGLang engine worker's side of a weight-update group, run by SGLang 0.5.23's own code.

A subprocess of ``test_weight_group.py``: it gives itself a default process group (an SGLang
engine has one: its tensor-parallel world, here of one), builds SGLang's
``model_runner_components.weight_updater.WeightUpdater`` and calls its own
``init_weights_update_group`` (SGLang's ``init_custom_process_group`` over ``tcp://``) and
``receive_weights_from_distributed`` (one ``torch.distributed.broadcast(src=0, async_op=True)``
per tensor, then wait) for each bucket, as an engine does for ``/init_weights_update_group`` and
``/update_weights_from_distributed``. What it received is saved with ``torch.save``.

    python -m tests.conformance.sglang_weight_member --port P --rank R --world-size W \
        --group G --buckets JSON --out FILE [--stop-after N]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.distributed as dist


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True, help="the trainer's store port")
    parser.add_argument("--rank", type=int, required=True, help="rank_offset of this worker")
    parser.add_argument("--world-size", type=int, required=True, help="members of the group")
    parser.add_argument("--group", required=True, help="the group's name")
    parser.add_argument("--buckets", required=True, help="JSON list of {names, dtypes, shapes}")
    parser.add_argument("--out", required=True, help="file for the received tensors")
    parser.add_argument(
        "--stop-after",
        type=int,
        default=None,
        help="receive only the first N buckets, then stay up until stdin closes",
    )
    args = parser.parse_args(argv)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from sglang.srt.model_executor.model_runner_components.weight_updater import (
        WeightUpdater,
    )

    updater = WeightUpdater(
        tp_rank=0,
        device="cpu",
        gpu_id=0,
        model_config=None,
        custom_weight_loaders={},
        get_model=lambda: None,
        update_model_fields=lambda *a, **k: None,
        recapture_cuda_graph=lambda: None,
        get_model_runner=lambda: None,
    )
    ok, message = updater.init_weights_update_group(
        "127.0.0.1", args.port, args.rank, args.world_size, args.group, backend="gloo"
    )
    print(json.dumps({"joined": ok, "message": message}), flush=True)
    if not ok:
        return 1
    received: dict[str, torch.Tensor] = {}
    buckets = json.loads(args.buckets)
    for bucket in buckets[: args.stop_after]:
        for name, tensor in updater.receive_weights_from_distributed(
            names=bucket["names"],
            dtypes=bucket["dtypes"],
            shapes=bucket["shapes"],
            group_name=args.group,
        ):
            received[name] = tensor
    torch.save(received, args.out)
    print(json.dumps({"received": sorted(received)}), flush=True)
    if args.stop_after is not None:
        sys.stdin.read()  # an engine that stopped receiving stays up (until stdin closes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
