"""Checkpoints of the torch backend (and of the megatron backend at TP=1, which records its own
name), sharded with torch.distributed.checkpoint (DCP).

Layout of a checkpoint directory (docs/trainer.md "Checkpoints")::

    manifest.json      counters, fingerprint, world size, the caller's extra state, sha256 of
                       every file below (trainer.checkpoint.write_sharded_checkpoint)
    dcp/.metadata      DCP's index of every tensor and shard
    dcp/__R_0.distcp   rank R's shards: actor, critic and both AdamW states (FSDP2 DTensor
                       shards under data parallel, whole tensors in one process)
    trainer.pt         both lr schedulers (rank 0)
    rng-R.pt           rank R's RNG states: torch, CUDA (its device), Python, numpy

The model and optimiser states are taken with ``get_model_state_dict`` /
``get_optimizer_state_dict`` (fully qualified HF parameter names, so DCP can reshard them to
another world size) and put back with the matching ``set_*`` functions. An optimiser that has
not stepped yet is saved as "no state" rather than through DCP's zero-learning-rate
initialisation step, which would change the next real step (Adam's bias correction counts it).
"""

from __future__ import annotations

import contextlib
import json
import random
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from trainer.backends.base import BackendError
from trainer.checkpoint import (
    CheckpointError,
    _fsync,
    read_sharded_manifest,
    write_sharded_checkpoint,
)

if TYPE_CHECKING:
    from trainer.backends.torch_backend import TorchBackend

LAYOUT = "torch-dcp-1"
DCP_DIR = "dcp"
TRAINER_FILE = "trainer.pt"


def rng_file(rank: int) -> str:
    return f"rng-{rank}.pt"


def _units(b: TorchBackend) -> Iterator[tuple[str, nn.Module, torch.optim.Optimizer]]:
    yield "actor", b.actor, b.actor_optimizer
    yield "critic", b.critic, b.critic_optimizer


def _reshard(*roots: nn.Module) -> None:
    """Put every FSDP2 unit back to its sharded parameters (state dicts hold the shards)."""
    from torch.distributed.fsdp import FSDPModule

    for root in roots:
        for module in root.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def _state(b: TorchBackend, optimizers: Mapping[str, bool]) -> dict[str, Any]:
    """The DCP state dict: models always, an optimiser where ``optimizers[name]``."""
    _reshard(b.scorer, b.critic)
    state: dict[str, Any] = {}
    for name, model, optimizer in _units(b):
        state[name] = get_model_state_dict(model)
        if optimizers[name]:
            state[f"{name}_optimizer"] = get_optimizer_state_dict(model, optimizer)
    return state


@contextlib.contextmanager
def _one_process_quietly(b: TorchBackend) -> Iterator[None]:
    """DCP warns on every one-process save / load that it assumes one process: it is meant."""
    with warnings.catch_warnings():
        if not b.dp.enabled:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def rng_state(device: torch.device) -> dict[str, Any]:
    """This process's RNG states as tensors and plain values (``weights_only``-loadable)."""
    kind, key, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "kind": str(kind),
            "key": torch.from_numpy(np.asarray(key, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: Mapping[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    key = n["key"].numpy().astype(np.uint32)
    np.random.set_state((n["kind"], key, n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def save(b: TorchBackend, directory: str | Path, extra: Mapping[str, Any] | None) -> Path:
    """Every rank calls it; see the module docstring for what goes where."""
    extra = dict(extra or {})
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as exc:
        raise BackendError(f"checkpoint extra state is not JSON-serialisable: {exc}") from exc
    optimizers = {name: bool(optimizer.state) for name, _, optimizer in _units(b)}
    meta = {
        "backend": b.backend_name,
        "layout": LAYOUT,
        "policy_version": b.version,
        "steps": b.steps,
        "fingerprint": b.fingerprint,
        "source_model": str(b.model_dir),
        "world_size": b.dp.world,
        "optimizer_state": optimizers,
        "extra": extra,
    }
    rank = b.dp.rank

    def write(staging: Path) -> list[str]:
        with _one_process_quietly(b):
            dcp.save(
                _state(b, optimizers), checkpoint_id=staging / DCP_DIR, no_dist=not b.dp.enabled
            )
        names = [f"{DCP_DIR}/{p.name}" for p in sorted((staging / DCP_DIR).glob(f"__{rank}_*"))]
        parts = {rng_file(rank): rng_state(b.device)}
        if rank == 0:
            parts[TRAINER_FILE] = {
                "schedulers": {
                    "actor": b.actor_scheduler.state_dict(),
                    "critic": b.critic_scheduler.state_dict(),
                }
            }
        for name, obj in parts.items():
            torch.save(obj, staging / name)
            _fsync(staging / name)
            names.append(name)
        return names

    return write_sharded_checkpoint(directory, write, meta)


def _check_fits(b: TorchBackend, root: Path, manifest: Mapping[str, Any]) -> None:
    if manifest.get("backend") != b.backend_name:
        raise CheckpointError(
            f"{root}: a {manifest.get('backend')!r} checkpoint, not {b.backend_name}"
        )
    if manifest.get("layout") != LAYOUT:
        raise CheckpointError(
            f"{root}: checkpoint layout {manifest.get('layout')!r}, this backend reads {LAYOUT!r}"
        )
    if manifest.get("fingerprint") != b.fingerprint:
        raise CheckpointError(
            f"{root}: checkpoint of another model (saved from "
            f"{manifest.get('source_model')!r}; its parameter names/shapes differ)"
        )
    optimizers = manifest.get("optimizer_state")
    if not isinstance(optimizers, dict) or set(optimizers) != {"actor", "critic"}:
        raise CheckpointError(f"corrupt manifest in {root}: 'optimizer_state' {optimizers!r}")


def load(b: TorchBackend, directory: str | Path) -> dict[str, Any]:
    """Every rank calls it; restores what :func:`save` wrote, checked before anything changes.

    The world size may differ from the saving one (DCP reshards the tensors); exact
    continuation needs the same world size. Rank ``r`` takes the RNG states of saved rank
    ``r mod saved_world``.
    """
    root = Path(directory)
    manifest = read_sharded_manifest(root)  # every file present and its checksum equal
    _check_fits(b, root, manifest)
    optimizers = {name: bool(manifest["optimizer_state"][name]) for name, _, _ in _units(b)}
    saved_world = int(manifest.get("world_size", 1))
    rng_name = rng_file(b.dp.rank % saved_world)
    for name in (TRAINER_FILE, rng_name):
        if name not in manifest["files"]:
            raise CheckpointError(f"checkpoint {root}: part {name} is missing from the manifest")
    trainer = torch.load(root / TRAINER_FILE, map_location="cpu", weights_only=True)
    rng = torch.load(root / rng_name, map_location="cpu", weights_only=True)
    state = _state(b, optimizers)  # templates: DCP loads in place (and reshards)
    try:
        with _one_process_quietly(b):
            dcp.load(state, checkpoint_id=root / DCP_DIR, no_dist=not b.dp.enabled)
    except Exception as exc:  # DCP's own errors (missing keys, shapes) as one clear error
        raise CheckpointError(f"{root}: cannot restore the sharded state: {exc}") from exc
    for name, model, optimizer in _units(b):
        set_model_state_dict(model, state[name])
        if optimizers[name]:
            set_optimizer_state_dict(model, optimizer, state[f"{name}_optimizer"])
        else:
            optimizer.state.clear()  # saved before its first step: it starts fresh again
    for scheduler, saved in (
        (b.actor_scheduler, trainer["schedulers"]["actor"]),
        (b.critic_scheduler, trainer["schedulers"]["critic"]),
    ):
        scheduler.load_state_dict(saved)
        for group, lr in zip(
            scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True
        ):
            group["lr"] = lr  # an optimiser saved without state takes its lr from here
    set_rng_state(rng, b.device)
    b.version = int(manifest["policy_version"])
    b.steps = int(manifest["steps"])
    return dict(manifest.get("extra") or {})
