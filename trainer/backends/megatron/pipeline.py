"""Pipeline parallel in the megatron backend: megatron-core's own non-interleaved 1F1B schedule
(``get_forward_backward_func``) over this rank's stage of a ``GPTModel``, forward only
(:func:`pipeline_forward`) or forward and backward (:func:`pipeline_backward`).

Each micro-batch (the torch backend's packed lanes, :class:`trainer.data.PackedInputs`) goes
through the stages in order: the first stage embeds, every stage runs its layers
(:func:`~trainer.backends.megatron.model.decoder_states`), the activations travel between
stages through megatron's p2p communicator (shapes exchanged first: micro-batches differ in
width, ``variable_seq_lengths``), and the last stage applies a head (the actor's logits, the
critic's values) and keeps the result (only the last stage returns outputs) or, in a backward,
turns it into the loss whose gradient the step engine asks for.
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


def pipeline_backward(
    model: nn.Module, micro: list[PackedInputs], head: Head, grads: list[Tensor]
) -> None:
    """Accumulate ``d/dtheta sum_m sum(head_m * grads[m])`` into this stage's parameters
    through megatron's 1F1B schedule (forward and backward interleaved): the last stage's
    per-micro-batch loss is ``sum(head(out) * grads[m])``; megatron's per-micro-batch scaling
    is undone (``calculate_per_token_loss`` with a token count of 1), so the gradient is the
    plain sum over micro-batches, as in one process. ``grads`` matters on the last stage."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not micro:
        return
    order = iter(range(len(micro)))

    def step(data: Iterator[PackedInputs], stage: nn.Module) -> tuple[Tensor, Any]:
        inputs = next(data)
        index = next(order)
        out = decoder_states(stage, inputs)
        if is_last_stage():
            out = head(out, inputs)

        def loss(output: Tensor) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
            total = (output * grads[index].to(output.device)).sum()
            return total, torch.ones((), dtype=torch.int), {}

        return out, loss

    config = model.config
    per_token = config.calculate_per_token_loss
    config.calculate_per_token_loss = True  # no division by the token count / micro-batches
    try:
        first = micro[0].input_ids
        get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=iter(micro),
            model=[model],
            num_microbatches=len(micro),
            seq_length=int(first.shape[1]),
            micro_batch_size=int(first.shape[0]),
            forward_only=False,
        )
    finally:
        config.calculate_per_token_loss = per_token


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
