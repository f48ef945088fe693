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

Precision: every stage's forward runs under the ``autocast`` the backend passes (its
``precision: bf16`` context, the one its PP=1 forwards run under; the heads autocast
themselves). Between two layers the hidden state is fp32 under autocast too (each residual
add promotes the bf16 branch to the fp32 stream), and megatron's p2p buffers are allocated in
``config.pipeline_dtype`` (fp32): a stage sends its output in that dtype (:func:`_to_wire`),
so the next stage receives what the next layer gets in one process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from trainer.backends.megatron.model import decoder_states
from trainer.data import PackedInputs

Head = Callable[[Tensor, PackedInputs], Tensor]
Autocast = Callable[[], AbstractContextManager[Any]]


def _to_wire(out: Tensor, stage: nn.Module) -> Tensor:
    """``out`` as it travels to the next stage: in the dtype megatron's p2p buffers have on
    both sides (``config.pipeline_dtype``; a no-op when it already is, as the fp32 residual
    stream under autocast is)."""
    return out.to(stage.config.pipeline_dtype)


def _stage_output(stage: nn.Module, inputs: PackedInputs, head: Head, autocast: Autocast) -> Tensor:
    """This stage's output for ``inputs``: its layers under ``autocast``, then on the last
    stage ``head`` of them, on the others the activations to send."""
    with autocast():
        out = decoder_states(stage, inputs)
    return head(out, inputs) if is_last_stage() else _to_wire(out, stage)


def is_last_stage() -> bool:
    from megatron.core import parallel_state

    return bool(parallel_state.is_pipeline_last_stage())


def pipeline_backward(
    model: nn.Module,
    micro: list[PackedInputs],
    head: Head,
    grads: list[Tensor],
    autocast: Autocast = contextlib.nullcontext,
) -> None:
    """Accumulate ``d/dtheta sum_m sum(head_m * grads[m])`` into this stage's parameters
    through megatron's 1F1B schedule (forward and backward interleaved): the last stage's
    per-micro-batch loss is ``sum(head(out) * grads[m])``; megatron's per-micro-batch scaling
    is undone (``calculate_per_token_loss`` with a token count of 1), so the gradient is the
    plain sum over micro-batches, as in one process. ``grads`` matters on the last stage;
    ``autocast``: the context of the stages' forwards (the backward follows autograd's casts)."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not micro:
        return
    order = iter(range(len(micro)))

    def step(data: Iterator[PackedInputs], stage: nn.Module) -> tuple[Tensor, Any]:
        inputs = next(data)
        index = next(order)
        out = _stage_output(stage, inputs, head, autocast)

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
def pipeline_forward(
    model: nn.Module,
    micro: list[PackedInputs],
    head: Head,
    autocast: Autocast = contextlib.nullcontext,
) -> list[Tensor]:
    """``head`` of the last stage's output for every micro-batch of ``micro`` (in order) on the
    last pipeline stage; ``[]`` on the others. Every stage calls with the same ``micro``;
    ``autocast``: the context of the stages' forwards."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    if not micro:
        return []

    def step(data: Iterator[PackedInputs], stage: nn.Module) -> tuple[Tensor, Any]:
        out = _stage_output(stage, next(data), head, autocast)

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
