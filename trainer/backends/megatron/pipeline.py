"""Pipeline-parallel forwards of the megatron backend: megatron-core's own 1F1B schedule
(``get_forward_backward_func``, forward only) over this rank's stage of a ``GPTModel``.

Each micro-batch (the torch backend's packed lanes, :class:`trainer.data.PackedInputs`) goes
through the stages in order: the first stage embeds, every stage runs its layers
(:func:`~trainer.backends.megatron.model.decoder_states`), the activations travel between
stages through megatron's p2p communicator (shapes exchanged first: micro-batches differ in
width, ``variable_seq_lengths``), and the last stage applies a head (the actor's logits, the
critic's values) and keeps the result. Only the last stage returns outputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor, nn

from trainer.backends.megatron.model import decoder_states
from trainer.data import PackedInputs

Head = Callable[[Tensor, PackedInputs], Tensor]


def is_last_stage() -> bool:
    from megatron.core import parallel_state

    return bool(parallel_state.is_pipeline_last_stage())


@torch.no_grad()
def pipeline_forward(model: nn.Module, micro: list[PackedInputs], head: Head) -> list[Tensor]:
    """``head`` of the last stage's output for every micro-batch of ``micro`` (in order) on the
    last pipeline stage; ``[]`` on the others. Every stage calls with the same ``micro``."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not micro:
        return []

    def step(data: Iterator[PackedInputs], stage: nn.Module) -> tuple[Tensor, Any]:
        inputs = next(data)
        out = decoder_states(stage, inputs)
        if is_last_stage():
            out = head(out, inputs)

        def keep(output: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
            return torch.zeros((), device=output.device), {"out": output.detach()}

        return out, keep

    first = micro[0].input_ids
    store = get_forward_backward_func()(
        forward_step_func=step,
        data_iterator=iter(micro),
        model=[model],
        num_microbatches=len(micro),
        seq_length=int(first.shape[1]),
        micro_batch_size=int(first.shape[0]),
        forward_only=True,
    )
    return [item["out"] for item in store] if is_last_stage() else []
