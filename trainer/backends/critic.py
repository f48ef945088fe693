"""The critic: the policy's transformer body with a scalar value head, attention frozen.

LI2SAO_SPEC "Critic during the bootstrap": a second copy of the policy initialised from the
same checkpoint, the output layer replaced by a scalar value head; the attention blocks are
frozen, the MLP blocks and the value head train. Choice (issue 10): the attention blocks with
their q/k norms and the token embeddings are frozen; MLPs, layer norms and the head train.
The head is linear (Li2SAO) or gives a logit whose sigmoid is the value (PACT, SR-PPO).

Mixture-of-experts bodies (Qwen3-MoE) follow the same rule: a MoE layer's sparse block takes
the place of the MLP, so its experts (``mlp.experts.gate_up_proj`` / ``down_proj``) **and its
router** (``mlp.gate.weight``) train with the norms and the head; attention and embeddings stay
frozen. The router trains because it is part of the MLP block the spec lets adapt: freezing it
would pin the critic's token-to-expert assignment to the policy's.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from trainer.data import PackedInputs

# Parameter-name markers of the frozen parts (HF names: ``layers.N.self_attn.q_proj.weight``,
# ``layers.N.self_attn.q_norm.weight``, ``embed_tokens.weight``; Megatron names:
# ``decoder.layers.N.self_attention.linear_qkv.weight``, ``embedding.word_embeddings.weight``).
ATTENTION_MARKERS = ("self_attn.", "self_attention.")
EMBEDDING_MARKERS = ("embed_tokens.", "embedding.word_embeddings.")


class ValueModel(nn.Module):
    """``body`` (a HF base model, e.g. ``Qwen3Model``) + a ``hidden -> 1`` value head."""

    def __init__(
        self,
        body: nn.Module,
        hidden_size: int,
        head: Literal["linear", "sigmoid"] = "linear",
        init_std: float = 0.02,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.body = body
        self.value_head = nn.Linear(hidden_size, 1)
        self.head_kind = head
        with torch.no_grad():
            self.value_head.weight.normal_(0.0, init_std, generator=generator)
            self.value_head.bias.zero_()

    def forward(self, inputs: PackedInputs, raw: bool = False) -> Tensor:
        """``[n, t]`` float32 values of the hidden states ``inputs.index`` picks (packed lanes:
        :func:`trainer.data.pack_inputs`); ``raw``: the head's output before the sigmoid (the
        logits ``z`` of a sigmoid head, the values themselves of a linear one)."""
        hidden = self.body(
            input_ids=inputs.input_ids, position_ids=inputs.position_ids, use_cache=False
        ).last_hidden_state
        picked = hidden.reshape(-1, hidden.shape[-1])[inputs.index]
        # a copy, not a view of the head's output: FSDP2 loses its backward hook on a view
        out = self.value_head(picked).squeeze(-1).to(torch.float32, copy=True)
        return torch.sigmoid(out) if self.head_kind == "sigmoid" and not raw else out


def freeze_attention(model: nn.Module) -> list[str]:
    """Freeze attention and embedding parameters of ``model``; return the frozen names.

    Raises ValueError when no attention parameter is found (an architecture whose names this
    rule does not know would otherwise train its attention silently).
    """
    frozen = []
    for name, param in model.named_parameters():
        if any(m in name for m in ATTENTION_MARKERS + EMBEDDING_MARKERS):
            param.requires_grad_(False)
            frozen.append(name)
    if not any(any(m in n for m in ATTENTION_MARKERS) for n in frozen):
        raise ValueError(
            f"no attention parameters (names containing {ATTENTION_MARKERS}) to freeze in the "
            "critic: unknown architecture"
        )
    return frozen
