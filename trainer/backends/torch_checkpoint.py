"""Checkpoints of the torch and megatron backends (each records its own name), sharded with
torch.distributed.checkpoint (DCP).

Layout of a checkpoint directory (docs/trainer.md "Checkpoints")::

    manifest.json      counters, fingerprint, world size, the caller's extra state, sha256 of
                       every file below (trainer.checkpoint.write_sharded_checkpoint)
    dcp/.metadata      DCP's index of every tensor and shard
    dcp/__R_0.distcp   rank R's shards: actor, critic and both AdamW states (FSDP2 DTensor
                       shards under data parallel, whole tensors in one process)
    trainer.pt         both lr schedulers (rank 0)
    rng-R.pt           rank R's RNG states: torch, CUDA (its device), Python, numpy, and the
                       backend's own (megatron's model-parallel RNG tracker)

The model and optimiser states are taken with ``get_model_state_dict`` /
``get_optimizer_state_dict`` (fully qualified HF parameter names, so DCP can reshard them to
another world size) and put back with the matching ``set_*`` functions. An optimiser that has
not stepped yet is saved as "no state" rather than through DCP's zero-learning-rate
initialisation step, which would change the next real step (Adam's bias correction counts it).

Model parallel (the megatron backend under tensor, pipeline or expert parallel): each rank's
tensors are its own shard under Megatron's local names, so the backend gives every rank a
*scope* (its coordinates, ``tp1-pp0-ep0``) that prefixes its keys, and a *parallel layout*
recorded in the manifest. Ranks with the same coordinates (data-parallel replicas) hold
identical tensors under identical keys: DCP writes them once and every replica reads them. A
checkpoint therefore loads into the same model-parallel layout under any data-parallel world
size; another layout is refused by name, the message naming the offline tool that rewrites
the checkpoint for it (``python -m trainer reshard``,
:mod:`trainer.backends.megatron.reshard`).
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
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
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
    """Each model with the optimiser whose state is checkpointed (under a distributed
    optimiser: this rank's local one, holding its shard of the states)."""
    yield "actor", b.actor, b.checkpoint_optimizer(b.actor_optimizer)
    yield "critic", b.critic, b.checkpoint_optimizer(b.critic_optimizer)


def _keys(b: TorchBackend) -> dict[str, str]:
    """``actor`` / ``actor_optimizer`` / ... -> this rank's key in the checkpoint (under the
    backend's scopes, module docstring)."""
    keys = {}
    for name, _, _ in _units(b):
        for part, short in (("model", name), ("optimizer", f"{name}_optimizer")):
            scope = b.checkpoint_scope(part)
            keys[short] = f"{scope}.{short}" if scope else short
    return keys


def _reshard(*roots: nn.Module) -> None:
    """Put every FSDP2 unit back to its sharded parameters (state dicts hold the shards)."""
    from torch.distributed.fsdp import FSDPModule

    for root in roots:
        for module in root.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def _world() -> tuple[int, int]:
    """This process's rank and the world size (0, 1 without torch.distributed)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _state(b: TorchBackend, optimizers: Mapping[str, bool]) -> dict[str, Any]:
    """The DCP state dict: models always, an optimiser where ``optimizers[name]``; keys under
    the rank's scope when the backend shards the model itself (module docstring)."""
    _reshard(b.scorer, b.critic)
    keys = _keys(b)
    state: dict[str, Any] = {}
    for name, model, optimizer in _units(b):
        state[keys[name]] = get_model_state_dict(model)
        if optimizers[name]:
            state[keys[f"{name}_optimizer"]] = get_optimizer_state_dict(model, optimizer)
    return state


def _unscoped(b: TorchBackend, state: Mapping[str, Any]) -> dict[str, Any]:
    """``state`` under the names of :func:`_units` (the scope prefixes taken off)."""
    short = {key: name for name, key in _keys(b).items()}
    return {short[k]: v for k, v in state.items()}


@contextlib.contextmanager
def _one_process_quietly() -> Iterator[None]:
    """DCP warns on every one-process save / load that it assumes one process: it is meant."""
    with warnings.catch_warnings():
        if _world()[1] == 1:
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
    rank, world = _world()
    meta = {
        "backend": b.backend_name,
        "layout": LAYOUT,
        "policy_version": b.version,
        "steps": b.steps,
        "fingerprint": b.fingerprint,
        "source_model": str(b.model_dir),
        "world_size": world,
        "parallel": b.checkpoint_parallel(),
        "optimizer_state": optimizers,
        "extra": extra,
    }

    def write(staging: Path) -> list[str]:
        with _one_process_quietly():
            dcp.save(_state(b, optimizers), checkpoint_id=staging / DCP_DIR, no_dist=world == 1)
        names = [f"{DCP_DIR}/{p.name}" for p in sorted((staging / DCP_DIR).glob(f"__{rank}_*"))]
        rng = rng_state(b.device)
        rng["backend"] = b.backend_rng_state()
        parts: dict[str, Any] = {rng_file(rank): rng}
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


def _layout(parallel: Mapping[str, Any], keys: Mapping[str, Any]) -> str:
    """``tensor_parallel=2 pipeline_parallel=1`` for the ``keys`` of a parallel layout."""
    return " ".join(f"{k}={parallel.get(k, 1)}" for k in keys) or "no model parallel"


def _remedy(root: Path, saved: Mapping[str, Any], mine: Mapping[str, Any]) -> str:
    """What to do about a checkpoint of another layout: the reshard command for this one, or
    (distributed optimiser states, which are not resharded) resuming with the saved layout."""
    if "optimizer_shards" in saved or "optimizer_shards" in mine:
        return (
            "resume with the saved layout and data-parallel size (the distributed optimizer's "
            "sharded AdamW states are not resharded)"
        )
    sizes = " ".join(
        f"--{flag} {mine.get(key, 1)}"
        for flag, key in (("tp", "tensor_parallel"), ("pp", "pipeline_parallel"))
    )
    if mine.get("expert_parallel", 1) != 1 or saved.get("expert_parallel", 1) != 1:
        sizes += f" --ep {mine.get('expert_parallel', 1)}"
    return (
        f"reshard it for this layout first: python -m trainer reshard --checkpoint {root} "
        f"--out NEW_DIR {sizes}, then resume from NEW_DIR (or resume with the saved layout)"
    )


def _check_fits(b: TorchBackend, root: Path, manifest: Mapping[str, Any]) -> None:
    if manifest.get("backend") != b.backend_name:
        raise CheckpointError(
            f"{root}: a {manifest.get('backend')!r} checkpoint, not {b.backend_name}"
        )
    if manifest.get("layout") != LAYOUT:
        raise CheckpointError(
            f"{root}: checkpoint layout {manifest.get('layout')!r}, this backend reads {LAYOUT!r}"
        )
    saved = manifest.get("parallel") or {}
    if not isinstance(saved, dict):
        raise CheckpointError(f"corrupt manifest in {root}: 'parallel' {saved!r}")
    mine = b.checkpoint_parallel()
    keys = {**dict.fromkeys(mine), **dict.fromkeys(saved)}  # either side's, in this order
    if any(saved.get(k, 1) != mine.get(k, 1) for k in keys):
        raise CheckpointError(
            f"{root}: saved under {_layout(saved, keys)}, this trainer runs {_layout(mine, keys)};"
            f" {_remedy(root, saved, mine)} (the data-parallel world size may differ)"
        )
    if manifest.get("fingerprint") != b.fingerprint:
        raise CheckpointError(
            f"{root}: checkpoint of another model (saved from "
            f"{manifest.get('source_model')!r}; its parameter names/shapes differ)"
        )
    optimizers = manifest.get("optimizer_state")
    if not isinstance(optimizers, dict) or set(optimizers) != {"actor", "critic"}:
        raise CheckpointError(f"corrupt manifest in {root}: 'optimizer_state' {optimizers!r}")


def _saved_keys(dcp_dir: Path) -> set[str]:
    """Every (flattened) key DCP wrote in ``dcp_dir``."""
    return set(dcp.FileSystemReader(str(dcp_dir)).read_metadata().state_dict_metadata)


def _only_saved_optimizer_state(state: dict[str, Any], saved: set[str]) -> dict[str, set[str]]:
    """Drop from the load templates the optimiser state of parameters the checkpoint has none
    for. A parameter that got no gradient before the save (a MoE expert no token reached, the
    value head of a pipeline stage that does not apply it) has no AdamW state then, but a fresh
    optimiser's template (DCP's zero-learning-rate initialisation) has one for every
    parameter. Returns those parameters' names per optimiser (``actor_optimizer``, ...),
    which :func:`_drop_state` leaves without state after the load, as they were saved."""
    stateless: dict[str, set[str]] = {}
    for top, unit in state.items():
        if not top.endswith("_optimizer"):
            continue
        per_param = unit.get("state", {})
        missing = {
            fqn
            for fqn in per_param
            if not any(f"{top}.state.{fqn}.{key}" in saved for key in per_param[fqn])
        }
        if per_param and missing == set(per_param):  # not one parameter: another layout
            raise CheckpointError(f"the checkpoint holds no optimiser state under {top!r}")
        for fqn in missing:
            del per_param[fqn]
        if missing:
            stateless[top.rsplit(".", 1)[-1]] = missing
    return stateless


def _drop_state(model: nn.Module, optimizer: torch.optim.Optimizer, names: set[str]) -> None:
    """No optimiser state for the parameters ``names`` of ``model`` (see above)."""
    for name, param in model.named_parameters():
        if name in names:
            optimizer.state.pop(param, None)


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
    rank, world = _world()
    rng_name = rng_file(rank % saved_world)
    for name in (TRAINER_FILE, rng_name):
        if name not in manifest["files"]:
            raise CheckpointError(f"checkpoint {root}: part {name} is missing from the manifest")
    trainer = torch.load(root / TRAINER_FILE, map_location="cpu", weights_only=True)
    rng = torch.load(root / rng_name, map_location="cpu", weights_only=True)
    state = _state(b, optimizers)  # templates: DCP loads in place (and reshards)
    try:
        stateless = _only_saved_optimizer_state(state, _saved_keys(root / DCP_DIR))
        with _one_process_quietly():
            dcp.load(state, checkpoint_id=root / DCP_DIR, no_dist=world == 1)
    except Exception as exc:  # DCP's own errors (missing keys, shapes) as one clear error
        raise CheckpointError(f"{root}: cannot restore the sharded state: {exc}") from exc
    state = _unscoped(b, state)
    for name, model, optimizer in _units(b):
        set_model_state_dict(model, state[name])
        if optimizers[name]:
            missing = stateless.get(f"{name}_optimizer", set())
            options = StateDictOptions(strict=not missing)  # strict unless some had no state
            set_optimizer_state_dict(model, optimizer, state[f"{name}_optimizer"], options=options)
            _drop_state(model, optimizer, missing)
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
    b.set_backend_rng_state(rng.get("backend") or {})
    b.version = int(manifest["policy_version"])
    b.steps = int(manifest["steps"])
    return dict(manifest.get("extra") or {})
