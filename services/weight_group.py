"""A torch.distributed group for weight broadcasts, formed exactly as SGLang forms it.

SGLang's ``/init_weights_update_group`` makes a *custom* group (its own TCP store and
rendezvous) so that the trainer, whose default group is its data-parallel world, and the
engines, whose default group is their tensor-parallel world, can share one more group for weight
broadcasts. Each engine worker joins with ``sglang.srt.utils.init_custom_process_group`` (slime,
AReaL, SkyRL and OpenRLHF use the same function on their trainer side):

    rendezvous("tcp://addr:port", rank, world) -> store
    PrefixStore(group_name, store)                                   # SGLang's prefix
    torch's _new_process_group_helper(world, rank, [], backend, that store, group_name=...)
        -> PrefixStore(f"{group_name}/", ...) -> PrefixStore(f"{device}/", ...)   # torch's
    _world.pg_group_ranks[pg] = {i: i for i in range(world)}

so the keys every member meets in the store are ``<group_name>/<group_name>//<device>//...``
(``device`` is ``cpu`` for gloo, ``cuda`` for nccl). A member that builds its backend on other
keys waits for peers that never come (swerl did until SGLang's code was in the tests:
``docs/sglang-conformance.md``).

:func:`join_group` does the same with a store that is already open (the trainer opens it on port
0 and reads the port back, so it cannot pass ``tcp://`` to SGLang's function; SGLang's function
takes ``store=`` too and then uses it as given, so the caller adds the ``group_name`` prefix, as
here). ``register=True`` (the trainer) goes through torch's helper as SGLang does, so the group is
registered in this process under ``group_name``; torch refuses a second group of that name, so a
stale one (a group dropped after an abandoned broadcast) is destroyed first. ``register=False``
(the reference engine, which holds several tensor-parallel ranks of one group in one process)
builds the backend itself on the very same keys, unregistered.

``gloo`` runs on the CPU (tests, the reference engine); ``nccl`` is the GPU path.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

BACKENDS = ("gloo", "nccl")
# The device part of torch's store prefix for each backend (its BackendConfig's device map: gloo
# registers one backend for cpu and cuda, created under the first, "cpu"; nccl under "cuda").
BACKEND_DEVICE = {"gloo": "cpu", "nccl": "cuda"}

log = logging.getLogger(__name__)


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
    group: Any  # a ProcessGroup (registered) or the backend itself (unregistered)
    registered: bool = False

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast ``tensor`` from rank 0 in place (blocks until every member joined)."""
        self.broadcast_async(tensor).wait()

    def broadcast_async(self, tensor: torch.Tensor) -> Any:
        """Start the broadcast of ``tensor`` from rank 0; ``.wait()`` the returned work (one
        process holding several ranks starts every rank's before it waits)."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return self.group.broadcast([tensor], options)

    def destroy(self) -> None:
        """Leave the group: a registered group is aborted (a broadcast still blocked in it
        fails instead of waiting out its timeout, where the backend can abort) and destroyed,
        so its name can be formed again. Idempotent."""
        if self.registered:
            _destroy_registered(self.group)
            self.registered = False


def _destroy_registered(group: Any) -> None:
    if group not in c10d._world.pg_map:
        return
    abort = getattr(group, "abort", None)
    if callable(abort) and c10d.get_backend(group) == "nccl":  # GPU path (unverified on GPU)
        try:
            abort()
        except Exception as exc:  # an abort that fails leaves destroy to clean up
            log.warning("aborting the weight group failed: %s", exc)
    dist.destroy_process_group(group)


def destroy_named(group_name: str) -> bool:
    """Destroy this process's registered group called ``group_name``, if any (True if one)."""
    for group, name in list(c10d._world.pg_names.items()):
        if name == group_name:
            _destroy_registered(group)
            return True
    return False


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
    register: bool = True,
) -> WeightGroup:
    """Join the group over ``store`` as SGLang's ``init_custom_process_group`` does; blocks
    until all ``world_size`` members joined."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside the group of {world_size}")
    if not group_name:
        raise ValueError("group_name must not be empty (SGLang refuses it)")
    timeout = datetime.timedelta(seconds=timeout_s)
    sglang_store = dist.PrefixStore(group_name, store)  # what SGLang's function builds
    if register:
        destroy_named(group_name)  # a stale group of this name (dropped after an abandon)
        group, _ = c10d._new_process_group_helper(
            world_size,
            rank,
            [],
            dist.Backend(backend),
            sglang_store,
            group_name=group_name,
            backend_options=None,
            timeout=timeout,
        )
        c10d._world.pg_group_ranks[group] = {i: i for i in range(world_size)}
        return WeightGroup(group_name, rank, world_size, backend, store, group, registered=True)
    # torch's helper adds f"{group_name}/" and then f"{device}/" before the backend's own keys
    keys = dist.PrefixStore(
        f"{BACKEND_DEVICE[backend]}/", dist.PrefixStore(f"{group_name}/", sglang_store)
    )
    member: Any
    if backend == "gloo":
        member = dist.ProcessGroupGloo(keys, rank, world_size, timeout)
    else:  # nccl: the GPU path (unverified in the CPU tests)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        member = dist.ProcessGroupNCCL(keys, rank, world_size, options)
    return WeightGroup(group_name, rank, world_size, backend, store, member, registered=False)


def open_group(
    *,
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    group_name: str,
    backend: str,
    timeout_s: float,
    register: bool = False,
) -> WeightGroup:
    """:func:`open_store` then :func:`join_group` (what an engine worker does on
    ``/init_weights_update_group``); unregistered by default, so one process can hold several
    ranks of one group (the reference engine's tensor-parallel ranks)."""
    store = open_store(master_address, master_port, rank, world_size, timeout_s)
    return join_group(
        store,
        rank=rank,
        world_size=world_size,
        group_name=group_name,
        backend=backend,
        timeout_s=timeout_s,
        register=register,
    )
