"""A transformers model's tensors under their Hugging Face *checkpoint* names.

transformers 5 keeps the experts of a mixture-of-experts layer fused in memory
(``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` and ``mlp.experts.down_proj`` ``[E, H, I]``), while
checkpoints, SGLang and every weight-sync message name one matrix per expert
(``mlp.experts.{e}.gate_proj.weight`` ``[I, H]``, ``up_proj`` ``[I, H]``, ``down_proj`` ``[H, I]``).
:func:`checkpoint_tensors` maps a module's state dict to the checkpoint names; the per-expert
tensors are *views* of the fused ones, so a reader sees the live values and ``copy_`` into a view
updates the model in place. Dense models pass through unchanged.

The fused layout (checked against the saved safetensors in the tests): row block ``[:I]`` of
``gate_up_proj[e]`` is expert ``e``'s gate projection and ``[I:]`` its up projection (the forward
does ``linear(x, gate_up_proj[e]).chunk(2)``: gate first).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from torch import Tensor

FUSED_GATE_UP = ".experts.gate_up_proj"
FUSED_DOWN = ".experts.down_proj"


def split_fused(name: str, tensor: Tensor) -> Iterator[tuple[str, Tensor]]:
    """``(name, tensor)`` under checkpoint names: one pair, or one per expert matrix (views)."""
    if tensor.dim() == 3 and name.endswith(FUSED_GATE_UP):
        prefix = name[: -len("gate_up_proj")]
        half = tensor.shape[1] // 2
        for e in range(tensor.shape[0]):
            yield f"{prefix}{e}.gate_proj.weight", tensor[e, :half]
            yield f"{prefix}{e}.up_proj.weight", tensor[e, half:]
    elif tensor.dim() == 3 and name.endswith(FUSED_DOWN):
        prefix = name[: -len("down_proj")]
        for e in range(tensor.shape[0]):
            yield f"{prefix}{e}.down_proj.weight", tensor[e]
    else:
        yield name, tensor


def checkpoint_tensors(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state_dict`` under checkpoint names (per-expert views of fused expert tensors)."""
    out: dict[str, Tensor] = {}
    for name, tensor in state_dict.items():
        out.update(split_fused(name, tensor))
    return out
