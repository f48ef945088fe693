"""A torch.distributed group for weight broadcasts, outside the default process group.

SGLang's ``init_weights_update_group`` makes a *custom* group (its own TCP store and
rendezvous) so that the trainer, whose default group is its data-parallel world, and the
engines, whose default group is their tensor-parallel world, can share one more group for weight
broadcasts. This module does the same for both sides of swerl: the trainer's distributed
publisher (rank 0, the store's master) and the reference engine (ranks ``rank_offset...``).

``gloo`` runs on the CPU (tests, the reference engine); ``nccl`` is the GPU path.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")


def parse_dtype(name: str) -> torch.dtype:
    """``"float32"`` or ``"torch.float32"`` as a floating-point torch dtype (ValueError if not)."""
    short = name.removeprefix("torch.")
    dtype = getattr(torch, short, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"unsupported dtype {name!r}: expected a floating-point torch dtype")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """The dtype as SGLang's requests spell it (``"bfloat16"``, ``"float32"``)."""
    return str(dtype).removeprefix("torch.")


@dataclass
class WeightGroup:
    """One member of a weight-broadcast group; rank 0 is the trainer (the source)."""

    name: str
    rank: int
    world_size: int
    backend: str
    store: dist.Store
    group: dist.ProcessGroup

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` from rank 0 in place (blocks until every member joined)."""
        self.broadcast_async(tensor).wait()

    def broadcast_async(self, tensor: torch.Tensor) -> Any:
        """Start the broadcast of ``tensor`` from rank 0; ``.wait()`` the returned work (one
        process holding several ranks starts every rank's before it waits)."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return self.group.broadcast([tensor], options)


def open_store(
    master_address: str, master_port: int, rank: int, world_size: int, timeout_s: float
) -> dist.TCPStore:
    """The group's rendezvous store; rank 0 hosts it (``master_port`` 0: any free port, read
    it back from ``store.port``) and does not wait for the others here."""
    return dist.TCPStore(
        master_address,
        master_port,
        world_size,
        is_master=rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def join_group(
    store: dist.Store,
    *,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
) -> WeightGroup:
    """Join the group over ``store``; blocks until all ``world_size`` members joined."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside the group of {world_size}")
    timeout = datetime.timedelta(seconds=timeout_s)
    prefixed = dist.PrefixStore(group_name, store)
    group: dist.ProcessGroup
    if backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    else:  # nccl: the GPU path (unverified in the CPU tests)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    return WeightGroup(group_name, rank, world_size, backend, store, group)


def open_group(
    *,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
) -> WeightGroup:
    """:func:`open_store` then :func:`join_group` (what an engine does on init)."""
    store = open_store(master_address, master_port, rank, world_size, timeout_s)
    return join_group(
        store,
        rank=rank,
        world_size=world_size,
        group_name=group_name,
        backend=backend,
        timeout_s=timeout_s,
    )
