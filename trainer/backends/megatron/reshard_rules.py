"""How each tensor of a megatron-backend checkpoint is laid out over the model-parallel ranks,
as pure merge / split functions (the tensors of :mod:`trainer.backends.megatron.reshard`).

The *whole* form of a checkpoint unit (the actor or critic weights, an optimiser's per-parameter
states) is what one process holds at TP=PP=EP=1: Megatron's local names of the whole model.
Each rule is :mod:`trainer.backends.megatron.convert`'s layout, tensor by tensor:

* tensor parallel: ``embedding.word_embeddings`` and ``output_layer`` split their rows (the
  vocabulary), ``linear_qkv`` its rows (the fused layout is query-group-major, so a rank's rows
  are whole groups), ``linear_fc1`` the rows of its gate half and of its up half
  (``[gate_r; up_r]`` on rank ``r``), ``linear_proj`` and ``linear_fc2`` their columns; norms,
  the MoE router, the value head, scalars (AdamW's ``step``) and ``_extra_state`` entries are
  replicated (TP rank 0's is taken);
* pipeline parallel: stage ``s`` of ``pp`` holds layers ``s*L/pp ...`` renumbered from 0, the
  embedding on the first stage, the final norm and output layer on the last (with tied
  embeddings the last stage's ``output_layer.weight`` is a copy of the word embeddings: dropped
  when merging, copied when splitting), the critic's value head on every stage (only the last
  applies and trains it: the last stage's is taken, and its AdamW state lives there);
* expert parallel: rank ``e`` of ``ep`` holds experts ``e*E/ep ...`` as local experts 0, 1, ...

Entries keep their order (the checkpoint fingerprint hashes them in the modules' state-dict
order): a merge lists them in the whole model's order, a split in each rank's. Values are
tensors, per-parameter optimiser states (a mapping of tensors, each split like its
parameter, 0-dim ones replicated) or anything else (replicated).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Entries = dict[str, Any]  # name -> tensor | per-parameter state | other, in order

_LAYER = re.compile(r"^((?:body\.)?decoder\.layers\.)(\d+)\.(.*)$")
_EXPERT = re.compile(r"^(.*\.mlp\.experts\.local_experts\.)(\d+)\.(.*)$")
_ROWS = ("embedding.word_embeddings.weight", "output_layer.weight", "linear_qkv.weight")
_COLUMNS = ("linear_proj.weight", "linear_fc2.weight")
_REPLICATED = ("layernorm.weight", "router.weight", "value_head.weight", "value_head.bias")


class ReshardError(ValueError):
    """A tensor or layout the resharding cannot map."""


@dataclass(frozen=True)
class Layout:
    """A model-parallel layout: tensor, pipeline and expert parallel sizes."""

    tp: int = 1
    pp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        for what, size in (("tensor", self.tp), ("pipeline", self.pp), ("expert", self.ep)):
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise ReshardError(f"{what} parallel size must be a positive integer: {size!r}")

    @property
    def size(self) -> int:
        return self.tp * self.pp * self.ep

    def coords(self) -> list[tuple[int, int, int]]:
        """Every rank's ``(tp, pp, ep)`` coordinates."""
        return [(t, p, e) for t in range(self.tp) for p in range(self.pp) for e in range(self.ep)]

    def scope(self, coords: tuple[int, int, int]) -> str:
        """The checkpoint key prefix of the rank at ``coords`` (the backend's
        ``checkpoint_scope``): none without model parallel."""
        t, p, e = coords
        return f"tp{t}-pp{p}-ep{e}" if self.size > 1 else ""

    def describe(self) -> str:
        return f"tensor_parallel={self.tp} pipeline_parallel={self.pp} expert_parallel={self.ep}"


@dataclass(frozen=True)
class Shape:
    """What the rules need of the model: its layers, experts (0: dense), tied embeddings."""

    layers: int
    experts: int = 0
    tied: bool = False

    def check(self, layout: Layout) -> None:
        if self.layers % layout.pp:
            raise ReshardError(
                f"num_hidden_layers={self.layers} does not split over pipeline parallel size "
                f"{layout.pp}"
            )
        if layout.ep > 1 and not self.experts:
            raise ReshardError(f"expert parallel size {layout.ep} needs a MoE model")
        if self.experts and self.experts % layout.ep:
            raise ReshardError(
                f"num_experts={self.experts} does not split over expert parallel size {layout.ep}"
            )


# ---------------------------------------------------------------------- tensor parallel


def _tp_rule(name: str) -> str:
    if name.endswith("_extra_state"):
        return "replicated"
    if name.endswith(_ROWS):
        return "rows"
    if name.endswith(_COLUMNS):
        return "columns"
    if name.endswith("linear_fc1.weight"):
        return "gate_up"
    if name.endswith(_REPLICATED):
        return "replicated"
    raise ReshardError(f"no tensor-parallel rule for {name!r}")


def _merge_tensor(name: str, rule: str, parts: Sequence[Any]) -> Any:
    first = parts[0]
    if rule == "replicated" or not isinstance(first, Tensor) or first.dim() == 0:
        return first
    if rule == "gate_up":
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(parts), dim=0 if rule == "rows" else 1)


def _split_tensor(name: str, rule: str, whole: Any, tp: int) -> list[Any]:
    if rule == "replicated" or not isinstance(whole, Tensor) or whole.dim() == 0:
        return [whole] * tp
    dim = 1 if rule == "columns" else 0
    size = whole.shape[dim] // (2 if rule == "gate_up" else 1)
    if size % tp:
        raise ReshardError(
            f"{name}: dimension {dim} of size {size} does not split over tensor parallel size {tp}"
        )
    if rule == "gate_up":
        gate, up = whole.chunk(2, dim=0)
        parts = [torch.cat(gu, dim=0) for gu in zip(gate.chunk(tp), up.chunk(tp), strict=True)]
    else:
        parts = list(whole.chunk(tp, dim=dim))
    return [p.clone(memory_format=torch.contiguous_format) for p in parts]


def merge_tensor_parallel(ranks: Sequence[Mapping[str, Any]]) -> Entries:
    """The whole tensors of every tensor-parallel rank's entries (``ranks[r]`` rank ``r``'s)."""
    names = list(ranks[0])
    for r, entries in enumerate(ranks[1:], start=1):
        if set(entries) != set(names):
            odd = sorted(set(entries) ^ set(names))[:5]
            raise ReshardError(f"tensor-parallel ranks 0 and {r} hold different entries: {odd}")
    out: Entries = {}
    for name in names:
        rule = _tp_rule(name)
        parts = [entries[name] for entries in ranks]
        if isinstance(parts[0], Mapping):  # one parameter's optimiser states
            out[name] = {k: _merge_tensor(name, rule, [p[k] for p in parts]) for k in parts[0]}
        else:
            out[name] = _merge_tensor(name, rule, parts)
    return out


def split_tensor_parallel(whole: Mapping[str, Any], tp: int) -> list[Entries]:
    """Every tensor-parallel rank's entries of ``whole`` (the inverse of the merge)."""
    out: list[Entries] = [{} for _ in range(tp)]
    for name, value in whole.items():
        rule = _tp_rule(name)
        if isinstance(value, Mapping):
            split = {k: _split_tensor(name, rule, v, tp) for k, v in value.items()}
            for r in range(tp):
                out[r][name] = {k: parts[r] for k, parts in split.items()}
        else:
            for r, part in enumerate(_split_tensor(name, rule, value, tp)):
                out[r][name] = part
    return out


# ---------------------------------------------------------------------- pipeline parallel


def _strip(name: str) -> tuple[str, str]:
    """``("body.", rest)`` for a critic body's entry, ``("", name)`` otherwise."""
    return ("body.", name[5:]) if name.startswith("body.") else ("", name)


def _placement(name: str) -> str:
    """Where a non-layer entry lives: ``first``, ``last`` or ``every`` stage."""
    _, rest = _strip(name)
    if rest.startswith("embedding."):
        return "first"
    if rest.startswith(("decoder.final_layernorm", "output_layer")):
        return "last"
    if rest.startswith("value_head."):
        return "every"
    raise ReshardError(f"no pipeline-parallel rule for {name!r}")


def _tied_copy(name: str, shape: Shape) -> bool:
    return shape.tied and _strip(name)[1] == "output_layer.weight"


def merge_pipeline_stages(stages: Sequence[Mapping[str, Any]], shape: Shape) -> Entries:
    """The whole model's entries from every stage's: layers renumbered, the tied output layer
    copy dropped, an entry on several stages (the value head) taken from the last."""
    per = shape.layers // len(stages)
    out: Entries = {}
    for s, stage in enumerate(stages):
        for name, value in stage.items():
            match = _LAYER.match(name)
            if match:
                head, index, rest = match.groups()
                out[f"{head}{s * per + int(index)}.{rest}"] = value
                continue
            _placement(name)  # an entry of a known place
            if len(stages) > 1 and s > 0 and _tied_copy(name, shape):
                continue
            out.pop(name, None)  # a later stage's copy wins and takes its place in the order
            out[name] = value
    return out


def pipeline_stage(
    whole: Mapping[str, Any], shape: Shape, stage: int, pp: int, optimizer: bool = False
) -> Entries:
    """Stage ``stage`` of ``pp``'s entries of ``whole``; ``optimizer``: per-parameter states
    (the value head's only on the last stage, which applies it)."""
    per = shape.layers // pp
    first, last = stage == 0, stage == pp - 1
    out: Entries = {}
    for name, value in whole.items():
        match = _LAYER.match(name)
        if match:
            head, index, rest = match.groups()
            if stage * per <= int(index) < (stage + 1) * per:
                out[f"{head}{int(index) - stage * per}.{rest}"] = value
            continue
        place = _placement(name)
        if place == "every" and optimizer and not last:
            continue
        if (place == "first" and first) or (place == "last" and last) or place == "every":
            out[name] = value
    if shape.tied and last and not first:
        out = _with_tied_copy(out, whole)
    return out


def _with_tied_copy(stage: Entries, whole: Mapping[str, Any]) -> Entries:
    """The last stage's ``output_layer.weight``: a copy of the first stage's word embeddings
    (per body: the actor's, the critic's), where the module lists it (before the output
    layer's extra state, else after the final norm)."""
    for prefix in ("", "body."):
        embedding = f"{prefix}embedding.word_embeddings.weight"
        if embedding not in whole:
            continue
        copy, extra = f"{prefix}output_layer.weight", f"{prefix}output_layer._extra_state"
        norm = f"{prefix}decoder.final_layernorm.weight"
        out: Entries = {}
        for name, value in stage.items():
            if name == extra:
                out[copy] = whole[embedding]
            out[name] = value
            if name == norm and extra not in stage:
                out[copy] = whole[embedding]
        out.setdefault(copy, whole[embedding])
        stage = out
    return stage


# ---------------------------------------------------------------------- expert parallel


def merge_expert_parallel(ranks: Sequence[Mapping[str, Any]], shape: Shape) -> Entries:
    """One model's entries with every expert: local expert ``j`` of rank ``e`` becomes
    ``e*E/ep + j``, listed in order; the rest is replicated (rank 0's)."""
    if len(ranks) == 1:
        return dict(ranks[0])
    per = shape.experts // len(ranks)
    out: Entries = {}
    done: set[str] = set()
    for name, value in ranks[0].items():
        match = _EXPERT.match(name)
        if not match:
            out[name] = value
            continue
        head = match.group(1)
        if head in done:
            continue
        done.add(head)
        for e, entries in enumerate(ranks):
            for other, tensor in entries.items():
                m = _EXPERT.match(other)
                if m and m.group(1) == head:
                    out[f"{head}{e * per + int(m.group(2))}.{m.group(3)}"] = tensor
    return out


def expert_rank(whole: Mapping[str, Any], shape: Shape, rank: int, ep: int) -> Entries:
    """Expert-parallel rank ``rank`` of ``ep``'s entries: its experts renumbered from 0."""
    if ep == 1:
        return dict(whole)
    per = shape.experts // ep
    out: Entries = {}
    for name, value in whole.items():
        match = _EXPERT.match(name)
        if not match:
            out[name] = value
        elif rank * per <= int(match.group(2)) < (rank + 1) * per:
            out[f"{match.group(1)}{int(match.group(2)) - rank * per}.{match.group(3)}"] = value
    return out


# ---------------------------------------------------------------------- whole layouts


def merge(
    ranks: Mapping[tuple[int, int, int], Mapping[str, Any]], layout: Layout, shape: Shape
) -> Entries:
    """The whole entries of one unit from every rank's (keyed by ``(tp, pp, ep)``): experts,
    then stages, then tensor-parallel shards."""
    missing = [c for c in layout.coords() if c not in ranks]
    if missing:
        raise ReshardError(f"the checkpoint lacks the ranks {missing} of {layout.describe()}")
    per_tp = []
    for t in range(layout.tp):
        stages = [
            merge_expert_parallel([ranks[(t, p, e)] for e in range(layout.ep)], shape)
            for p in range(layout.pp)
        ]
        per_tp.append(merge_pipeline_stages(stages, shape))
    return merge_tensor_parallel(per_tp)


def split(
    whole: Mapping[str, Any], layout: Layout, shape: Shape, optimizer: bool = False
) -> dict[tuple[int, int, int], Entries]:
    """Every rank's entries of ``layout`` from the whole ones (the inverse of :func:`merge`)."""
    out: dict[tuple[int, int, int], Entries] = {}
    for p in range(layout.pp):
        stage = pipeline_stage(whole, shape, p, layout.pp, optimizer)
        for e in range(layout.ep):
            for t, entries in enumerate(
                split_tensor_parallel(expert_rank(stage, shape, e, layout.ep), layout.tp)
            ):
                out[(t, p, e)] = entries
    return out


def rename(
    names: Sequence[str], coords: tuple[int, int, int], layout: Layout, shape: Shape
) -> list[str]:
    """Whole-model names of rank ``coords``'s local ``names`` (layers and experts renumbered;
    the tied output layer copy named as the word embeddings it copies)."""
    _, p, e = coords
    per_layer, out = shape.layers // layout.pp, []
    per_expert = shape.experts // layout.ep if shape.experts else 0
    for name in names:
        match = _EXPERT.match(name)
        if match:
            name = f"{match.group(1)}{e * per_expert + int(match.group(2))}.{match.group(3)}"
        match = _LAYER.match(name)
        if match:
            name = f"{match.group(1)}{p * per_layer + int(match.group(2))}.{match.group(3)}"
        elif layout.pp > 1 and p > 0 and _tied_copy(name, shape):
            name = name.replace("output_layer.weight", "embedding.word_embeddings.weight")
        out.append(name)
    return out
