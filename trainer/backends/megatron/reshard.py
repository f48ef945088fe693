"""Reshard a megatron-backend checkpoint to another model-parallel layout, offline, in one
process (``python -m trainer reshard``; docs/trainer.md "Checkpoints").

A checkpoint of the megatron backend (:mod:`trainer.backends.torch_checkpoint`) keeps each
model-parallel rank's tensors (actor, critic and both AdamW states) under Megatron's local
names in its *scope* ``tp<t>-pp<p>-ep<e>``, and loads only into the layout it was saved from.
:func:`reshard` reads every scope of a checkpoint (its manifest and every checksum checked
first), puts the whole tensors back together (:mod:`trainer.backends.megatron.reshard_rules`:
the weights, and the AdamW moments ``exp_avg`` / ``exp_avg_sq``, which are elementwise and
shard exactly like their parameters; ``step`` is a per-parameter scalar, replicated), splits
them for the new layout and writes a complete checkpoint of it, atomically
(:func:`trainer.checkpoint.write_sharded_checkpoint`): the new scopes, each optimiser's
parameter groups listing that rank's parameters, the manifest with the new ``parallel``, world
size and fingerprint (recomputed as the backend computes it; the source's is recomputed first,
so a checkpoint whose tensors are not what its manifest describes is refused), the same
counters, lr schedulers and extra state, and ``resharded_from`` (the source's layout).

RNG states: the new layout's rank ``r`` takes the saved rank ``r``'s states when the saved run
had that rank; a rank beyond the saved world takes saved rank 0's torch / Python / numpy states
without megatron's model-parallel tracker, so the new backend keeps the tracker it seeds from
``trainer.seed`` and its own coordinates. Exact continuation across layouts is not promised in
any case (the sums run in another order); the weights and optimiser states are carried over
bit for bit.

Refused, by name: a torch-backend checkpoint (DCP reshards it on load: it needs no tool), a
layout the model cannot take (TP not dividing the heads, PP the layers, EP the experts), the
distributed optimiser's sharded states (``optimizer_shards``: resume with the same layout and
data-parallel size, or save without ``megatron.distributed_optimizer``), a corrupt manifest or
an unknown layout. The tool holds the whole checkpoint in memory (up to about twice its size).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from trainer.backends.megatron.reshard_rules import (
    Entries,
    Layout,
    ReshardError,
    Shape,
    merge,
    rename,
    split,
)
from trainer.backends.torch_backend import state_fingerprint
from trainer.backends.torch_checkpoint import DCP_DIR, LAYOUT, TRAINER_FILE, rng_file
from trainer.checkpoint import CheckpointError, read_manifest, write_sharded_checkpoint

UNITS = ("actor", "critic")
PARALLEL_KEYS = ("tensor_parallel", "pipeline_parallel", "expert_parallel")
Coords = tuple[int, int, int]
_SCOPE = re.compile(r"^tp(\d+)-pp(\d+)-ep(\d+)$")


@dataclass
class Checkpoint:
    """A megatron checkpoint's tensors per unit and rank, with what describes them."""

    manifest: dict[str, Any]
    layout: Layout
    models: dict[str, dict[Coords, Entries]] = field(default_factory=dict)
    states: dict[str, dict[Coords, Entries]] = field(default_factory=dict)
    groups: dict[str, dict[Coords, list[dict[str, Any]]]] = field(default_factory=dict)


def _layout_of(root: Path, manifest: Mapping[str, Any]) -> Layout:
    """The model-parallel layout a checkpoint was saved under, or a clear refusal."""
    backend = manifest.get("backend")
    if backend == "torch":
        raise ReshardError(
            f"{root} is a torch-backend checkpoint: it needs no resharding (its tensors are "
            "saved whole under HF names and DCP reshards them on load to any data-parallel "
            "world size)"
        )
    if backend != "megatron":
        raise ReshardError(f"{root}: a {backend!r} checkpoint; only megatron ones are resharded")
    if manifest.get("layout") != LAYOUT:
        raise ReshardError(
            f"{root}: checkpoint layout {manifest.get('layout')!r}, this tool reads {LAYOUT!r}"
        )
    parallel = manifest.get("parallel")
    if not isinstance(parallel, dict):
        raise ReshardError(f"corrupt manifest in {root}: 'parallel' {parallel!r}")
    if "optimizer_shards" in parallel:
        raise ReshardError(
            f"{root}: the AdamW states are sharded over {parallel['optimizer_shards']} "
            "data-parallel ranks (megatron.distributed_optimizer): resharding them is not "
            "built; resume with the saved layout and data-parallel size"
        )
    unknown = sorted(set(parallel) - set(PARALLEL_KEYS))
    if unknown:
        raise ReshardError(f"{root}: unknown parallel layout keys {unknown} in the manifest")
    sizes = [parallel.get(k, 1) for k in PARALLEL_KEYS]
    try:
        return Layout(*sizes)
    except ReshardError as exc:
        raise ReshardError(f"corrupt manifest in {root}: 'parallel' {parallel!r}: {exc}") from exc


def model_shape(model_dir: Path) -> tuple[Shape, Any]:
    """The rules' view of the HF model in ``model_dir`` (its config only) and the config."""
    from transformers import AutoConfig

    from trainer.backends.megatron.model import is_moe, num_experts

    if not (model_dir / "config.json").is_file():
        raise ReshardError(
            f"{model_dir} is not a Hugging Face model directory (no config.json): pass the "
            "checkpoint's model with --model"
        )
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except (ValueError, KeyError, OSError) as exc:
        raise ReshardError(f"cannot read the model config in {model_dir}: {exc}") from exc
    experts = num_experts(config) if is_moe(config) else 0
    shape = Shape(int(config.num_hidden_layers), experts, bool(config.tie_word_embeddings))
    return shape, config


def check_layout(config: Any, shape: Shape, layout: Layout) -> None:
    """Raise :class:`ReshardError` when the model cannot take ``layout``."""
    from trainer.backends.base import BackendError
    from trainer.backends.megatron import convert

    try:
        convert.check_tensor_parallel(config, layout.tp)
        convert.check_expert_parallel(config, layout.ep)
    except BackendError as exc:
        raise ReshardError(str(exc)) from exc
    shape.check(layout)


def _read_dcp(dcp_dir: Path) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """Every tensor and object DCP wrote, nested as saved, and the saved key order (each
    rank's state dict order: DCP's flattening map, which lists a rank's keys in order)."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = dcp.FileSystemReader(str(dcp_dir))
    metadata = reader.read_metadata()
    state: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        _load_state_dict(
            state, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(), no_dist=True
        )
    mapping = metadata.planner_data or {}
    order = [tuple(path) for path in mapping.values()]
    return state, order


def _coords(scope: str, layout: Layout, key: str) -> Coords:
    if layout.size == 1:
        if scope:
            raise ReshardError(
                f"checkpoint key {key!r} has a scope, the manifest no model parallel"
            )
        return (0, 0, 0)
    match = _SCOPE.match(scope)
    coords = tuple(int(x) for x in match.groups()) if match else None
    if coords not in layout.coords():
        raise ReshardError(f"checkpoint key {key!r}: not a rank of {layout.describe()}")
    return coords  # type: ignore[return-value]


def _ordered(entries: Mapping[str, Any], order: list[str]) -> Entries:
    listed = [name for name in order if name in entries]
    return {name: entries[name] for name in listed + [n for n in entries if n not in set(listed)]}


def read(root: Path) -> Checkpoint:
    """The checked checkpoint at ``root`` (manifest, checksums, layout) and its tensors."""
    manifest = read_manifest(root)
    layout = _layout_of(root, manifest)
    if set(manifest.get("optimizer_state") or {}) != set(UNITS):
        raise ReshardError(f"corrupt manifest in {root}: 'optimizer_state'")
    state, order = _read_dcp(root / DCP_DIR)
    ckpt = Checkpoint(dict(manifest), layout)
    for key, value in state.items():
        scope, _, unit = key.rpartition(".")
        coords = _coords(scope, layout, key)
        names = [str(path[1]) for path in order if path[0] == key and len(path) == 2]
        if unit in UNITS:
            ckpt.models.setdefault(unit, {})[coords] = _ordered(value, names)
        elif unit.endswith("_optimizer") and unit[: -len("_optimizer")] in UNITS:
            name = unit[: -len("_optimizer")]
            ckpt.states.setdefault(name, {})[coords] = dict(value.get("state", {}))
            ckpt.groups.setdefault(name, {})[coords] = list(value.get("param_groups", []))
        else:
            raise ReshardError(f"{root}: unexpected checkpoint key {key!r}")
    for unit in UNITS:
        if set(ckpt.models.get(unit, {})) != set(layout.coords()):
            raise ReshardError(f"{root}: the {unit} weights of some ranks are missing")
        if manifest["optimizer_state"][unit] and unit not in ckpt.states:
            raise ReshardError(f"{root}: the manifest lists {unit} optimiser state; none saved")
    return ckpt


def fingerprint(models: Mapping[str, Mapping[Coords, Entries]], layout: Layout) -> str:
    """The checkpoint fingerprint the megatron backend computes for ``layout`` (its
    ``_layout_fingerprint``: each rank's actor and critic state names, shapes and dtypes,
    combined over the model-parallel ranks by their scopes)."""
    local = {
        c: state_fingerprint([models["actor"][c], models["critic"][c]]) for c in models["actor"]
    }
    if layout.size == 1:
        return local[(0, 0, 0)]
    digest = hashlib.sha256()
    for scope, value in sorted({(layout.scope(c), fp) for c, fp in local.items()}):
        digest.update(f"{scope}:{value};".encode())
    return digest.hexdigest()


def _groups(
    ckpt: Checkpoint, unit: str, shape: Shape, layout: Layout, new: Layout, model: Entries,
    coords: Coords,
) -> list[dict[str, Any]]:  # fmt: skip
    """The new rank's parameter groups: the saved hyperparameters, and as ``params`` the
    rank's parameters (model order) that the saved groups list."""
    group_of: dict[str, int] = {}
    for c, groups in ckpt.groups[unit].items():
        for g, group in enumerate(groups):
            for name in rename(list(group.get("params", [])), c, layout, shape):
                group_of[name] = g
    template = ckpt.groups[unit][(0, 0, 0)]
    out = [{k: v for k, v in group.items() if k != "params"} | {"params": []} for group in template]
    names = [n for n, v in model.items() if isinstance(v, torch.Tensor)]
    for name, whole in zip(names, rename(names, coords, new, shape), strict=True):
        if whole in group_of:
            out[group_of[whole]]["params"].append(name)
    return out


def reshard(
    source: str | Path, target: str | Path, new: Layout, model_dir: str | Path | None = None
) -> Path:
    """Write the checkpoint ``source`` under the layout ``new`` to ``target`` (see the module
    docstring); returns the written directory."""
    root, out = Path(source), Path(target)
    ckpt = read(root)
    layout, manifest = ckpt.layout, ckpt.manifest
    shape, config = model_shape(Path(model_dir or manifest.get("source_model") or ""))
    check_layout(config, shape, layout)
    if fingerprint(ckpt.models, layout) != manifest.get("fingerprint"):
        raise ReshardError(
            f"{root}: its tensors do not give the fingerprint its manifest records (saved from "
            f"another model than {config.name_or_path}, or not by this trainer)"
        )
    check_layout(config, shape, new)
    models = {u: split(merge(ckpt.models[u], layout, shape), new, shape) for u in UNITS}
    states = {
        u: split(merge(ckpt.states[u], layout, shape), new, shape, optimizer=True)
        for u in ckpt.states
    }
    state: dict[str, Any] = {}
    for coords in new.coords():
        prefix = f"{new.scope(coords)}." if new.size > 1 else ""
        for unit in UNITS:
            model = models[unit][coords]
            state[f"{prefix}{unit}"] = model
            if unit in states:
                groups = _groups(ckpt, unit, shape, layout, new, model, coords)
                listed = {n for g in groups for n in g["params"]}
                stray = sorted(set(states[unit][coords]) - listed)
                if stray:
                    raise ReshardError(f"optimiser state for parameters not optimised: {stray}")
                body = {"state": states[unit][coords], "param_groups": groups}
                state[f"{prefix}{unit}_optimizer"] = body
    parallel = {"tensor_parallel": new.tp, "pipeline_parallel": new.pp, "expert_parallel": new.ep}
    meta = {
        key: manifest[key]
        for key in ("backend", "layout", "policy_version", "steps", "source_model", "extra")
        if key in manifest
    }
    meta.update(
        fingerprint=fingerprint(models, new),
        world_size=new.size,
        parallel=parallel,
        optimizer_state=manifest["optimizer_state"],
        resharded_from={
            "parallel": manifest["parallel"],
            "world_size": manifest.get("world_size", 1),
            "fingerprint": manifest["fingerprint"],
        },
    )
    saved_world = int(manifest.get("world_size", 1))

    def write(staging: Path) -> list[str]:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(state, checkpoint_id=staging / DCP_DIR, no_dist=True)
        shutil.copyfile(root / TRAINER_FILE, staging / TRAINER_FILE)
        for rank in range(new.size):
            if rank < saved_world:
                shutil.copyfile(root / rng_file(rank), staging / rng_file(rank))
                continue
            rng = torch.load(root / rng_file(0), map_location="cpu", weights_only=True)
            rng["backend"] = {}  # the new backend keeps the tracker it seeds itself
            torch.save(rng, staging / rng_file(rank))
        return []  # every file is checksummed into the manifest

    return write_sharded_checkpoint(out, write, meta)


# ---------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """``python -m trainer reshard``: see the module docstring and ``--help``."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer reshard",
        description="Rewrite a megatron-backend checkpoint for another model-parallel layout "
        "(tensor / pipeline / expert parallel sizes), offline in one process: weights and "
        "AdamW states of actor and critic, counters, schedulers, RNG and extra state.",
    )
    parser.add_argument("--checkpoint", required=True, type=Path, help="checkpoint to read")
    parser.add_argument("--out", required=True, type=Path, help="new checkpoint directory")
    parser.add_argument("--tp", required=True, type=int, help="new tensor-parallel size")
    parser.add_argument("--pp", required=True, type=int, help="new pipeline-parallel size")
    parser.add_argument("--ep", type=int, default=1, help="new expert-parallel size (MoE)")
    parser.add_argument(
        "--model",
        type=Path,
        help="HF model directory the checkpoint was trained from (default: the manifest's "
        "source_model; only its config.json is read)",
    )
    args = parser.parse_args(argv)
    try:
        new = Layout(args.tp, args.pp, args.ep)
    except ReshardError as exc:
        parser.error(str(exc))
    if not args.checkpoint.is_dir():
        parser.error(f"--checkpoint {args.checkpoint} is not a directory")
    if args.out.exists() or args.out.resolve() == args.checkpoint.resolve():
        parser.error(f"--out {args.out} exists: give a new directory")
    try:
        written = reshard(args.checkpoint, args.out, new, args.model)
    except (CheckpointError, ReshardError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"resharded {args.checkpoint} to {new.describe()} in {written}", file=sys.stderr)
    return 0
