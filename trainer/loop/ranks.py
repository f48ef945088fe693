"""Training under ``torch.distributed``: rank 0 drives the loop, every other rank follows.

``torchrun --nproc-per-node=N -m trainer train`` starts N processes. Only one of them may be the
driver (one rollout stream, one publisher, one metrics file); the others hold their shards of
the model and must join every collective the driver's backend calls make. So:

* **rank 0** runs :class:`~trainer.loop.driver.TrainLoop` on a :class:`LeaderBackend`: before
  each collective backend call (``train_step``, ``logprobs_and_values``, ``export_hf``,
  ``named_weights``, ``save``, ``load``) and each ``version`` assignment, it broadcasts the call
  -- its name and arguments, the batch included -- to the other ranks, then makes it itself;
* **ranks > 0** run :func:`follow`: receive a call, make it on their own backend, repeat until
  rank 0 says ``stop`` (exit 0) or ``abort`` (the driver failed: exit 1). They never touch
  Redis, the manager or the adapter.

Every rank so calls the same backend methods with the same arguments in the same order, which
is what the backends' data-parallel and model-parallel collectives need. The calls travel on
their own gloo group with a long timeout (:data:`CONTROL_TIMEOUT`): a follower waits there while
rank 0 waits for rollouts, which can take much longer than the default 30 minutes. A follower
whose call fails exits non-zero; torchrun then stops the whole group, so a failure on any
rank fails the run instead of hanging it. Every rank dies with its launcher
(:func:`die_with_launcher`): torchrun gives each rank a session of its own, so killing the
launcher's process group does not reach them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor

from trainer.backends import ForwardResult, StepObjective, TrainerBackend
from trainer.data import TrainBatch

log = logging.getLogger("swerl.train.ranks")

# How long a follower waits for rank 0's next call (rollout waits, evaluations, long publishes).
CONTROL_TIMEOUT = timedelta(days=7)
# The backend methods every rank must call together (and the version assignment).
COLLECTIVE_OPS = frozenset(
    {"train_step", "logprobs_and_values", "export_hf", "named_weights", "save", "load"}
)
SET_VERSION, STOP, ABORT = "set_version", "stop", "abort"
PR_SET_PDEATHSIG = 1


class RankError(RuntimeError):
    """The rank group cannot run (bad launcher environment, a call no follower knows)."""


@dataclass(frozen=True)
class Call:
    """One call rank 0 sends: ``op`` (a backend method, ``set_version``, ``stop``, ``abort``)."""

    op: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class Channel(Protocol):
    """Where rank 0's calls travel (:class:`Ranks`; the unit tests use a list)."""

    rank: int

    def send(self, call: Call) -> None: ...

    def receive(self) -> Call: ...


@dataclass(frozen=True)
class Ranks:
    """This process's place in the launcher's group and the control group calls travel on."""

    rank: int
    world: int
    control: Any  # a torch.distributed ProcessGroup (gloo)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def send(self, call: Call) -> None:
        """Rank 0: hand ``call`` to every follower."""
        dist.broadcast_object_list([call], src=0, group=self.control)

    def receive(self) -> Call:
        """A follower: the next call of rank 0 (blocks up to :data:`CONTROL_TIMEOUT`)."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        call = box[0]
        if not isinstance(call, Call):
            raise RankError(f"rank {self.rank} received {type(call).__name__}, not a Call")
        return call

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def launcher_world(environ: Mapping[str, str] | None = None) -> int:
    """``WORLD_SIZE`` of the launcher (1 when none set it); RankError on a malformed value."""
    env = os.environ if environ is None else environ
    raw = env.get("WORLD_SIZE", "1")
    try:
        world = int(raw)
    except ValueError:
        raise RankError(f"WORLD_SIZE must be an integer, got {raw!r}") from None
    if world < 1:
        raise RankError(f"WORLD_SIZE must be >= 1, got {world}")
    return world


def die_with_launcher() -> None:
    """SIGKILL this rank when its launcher dies (``PR_SET_PDEATHSIG``; Linux).

    torchrun starts every rank in a session of its own, so a launcher killed hard (the trainer
    service's SIGKILL after its grace, an OOM kill) would leave its ranks training and writing
    checkpoints into a directory the next attempt resumes from. A rank without its launcher
    has nobody to report to; checkpoints are written atomically, so dying at once is safe.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        log.warning("PR_SET_PDEATHSIG failed (errno %d): this rank may outlive its launcher",
                    ctypes.get_errno())  # fmt: skip
    elif os.getppid() != parent:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGKILL)


def init_ranks(device: str, environ: Mapping[str, str] | None = None) -> Ranks | None:
    """Join the launcher's group (``env://``: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT);
    None for a single process. NCCL for a CUDA ``device`` (each rank on GPU ``LOCAL_RANK``),
    gloo otherwise; the control group is always gloo (objects travel on the CPU)."""
    env = os.environ if environ is None else environ
    world = launcher_world(env)
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if world > 1 and missing:
        raise RankError(f"WORLD_SIZE is set but {', '.join(missing)} is not (use torchrun)")
    if dist.is_initialized():
        world = dist.get_world_size()  # a group someone made already (one process: none here)
    if world == 1:
        return None
    if not dist.is_initialized():
        die_with_launcher()
        backend = "gloo"
        if device.startswith("cuda") and torch.cuda.is_available():
            torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
            backend = "nccl"
        dist.init_process_group(backend, init_method="env://")
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    return Ranks(dist.get_rank(), dist.get_world_size(), control)


class LeaderBackend:
    """Rank 0's backend: each collective call is sent to the followers, then made here.

    Everything else (``steps``, ``pad_id``, ``vocab_size``, ...) reads through to the backend.
    ``named_weights()`` must be iterated to the end (the followers do: each tensor is a
    gather); the publishers do, with ``list(...)``.
    """

    def __init__(self, backend: TrainerBackend, ranks: Channel) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_ranks", ranks)
        object.__setattr__(self, "_in_call", False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "version":
            raise AttributeError(f"{type(self).__name__} sets only 'version', not {name!r}")
        self._ranks.send(Call(SET_VERSION, (int(value),)))
        self._backend.version = int(value)

    @property
    def version(self) -> int:
        return self._backend.version

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        self._ranks.send(Call(op, args, kwargs))
        object.__setattr__(self, "_in_call", True)  # a failure here may leave peers waiting
        result = getattr(self._backend, op)(*args, **kwargs)
        object.__setattr__(self, "_in_call", False)
        return result

    def logprobs_and_values(self, batch: TrainBatch) -> ForwardResult:
        return self._call("logprobs_and_values", batch)

    def train_step(self, batch: TrainBatch, objective: StepObjective) -> dict[str, float]:
        return self._call("train_step", batch, objective)

    def export_hf(self, directory: str | Path) -> Path:
        return self._call("export_hf", str(directory))

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        self._ranks.send(Call("named_weights"))
        object.__setattr__(self, "_in_call", True)  # until the last tensor is gathered
        yield from self._backend.named_weights()
        object.__setattr__(self, "_in_call", False)

    def save(self, directory: str | Path, extra: Mapping[str, Any] | None = None) -> Path:
        return self._call("save", str(directory), None if extra is None else dict(extra))

    def load(self, directory: str | Path) -> dict[str, Any]:
        return self._call("load", str(directory))

    def stop(self, *, failed: bool = False) -> None:
        """Release the followers: they exit 0 (``failed``: 1). Nothing is sent when a backend
        call failed half-way (the followers may be inside one of its collectives: rank 0's
        non-zero exit makes torchrun end them)."""
        if self._in_call:
            log.error("a backend call failed on rank 0: the followers are left to torchrun")
            return
        self._ranks.send(Call(ABORT if failed else STOP))


def follow(backend: TrainerBackend, ranks: Channel) -> bool:
    """A follower's whole run: make rank 0's calls until it stops; True for ``stop``, False
    for ``abort``. A failing call raises (this rank exits non-zero; torchrun ends the group)."""
    calls = 0
    while True:
        call = ranks.receive()
        if call.op in (STOP, ABORT):
            log.info("rank %d: %s after %d calls", ranks.rank, call.op, calls)
            return call.op == STOP
        calls += 1
        if call.op == SET_VERSION:
            backend.version = int(call.args[0])
        elif call.op == "named_weights":
            for _ in backend.named_weights():  # every tensor is a gather: take them all
                pass
        elif call.op in COLLECTIVE_OPS:
            getattr(backend, call.op)(*call.args, **call.kwargs)
        else:
            raise RankError(f"rank {ranks.rank}: unknown call {call.op!r} from rank 0")
