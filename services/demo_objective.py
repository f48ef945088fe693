"""The demo's last step: recorded trajectories -> padded batch -> Li2SAO bootstrap objective.

The tiny model recomputes the log-probability of every generated token with a plain forward
pass (``max_abs_logprob_diff`` must stay below 1e-5: the engine and the trainer agree), the
critic is a zero-initialised value head on the model's last hidden state, and
``trainer.algorithms.li2sao_objective`` evaluates actor and critic losses. No weights change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from trainer.algorithms import ObjectiveBatch, li2sao_objective


@torch.no_grad()
def evaluate_objective(model_dir: Path, records: list[tuple[Any, Any]]) -> dict[str, Any]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    value_head = torch.nn.Linear(model.config.hidden_size, 1)
    torch.nn.init.zeros_(value_head.weight)
    torch.nn.init.zeros_(value_head.bias)
    rows, group_of = [], {}
    max_diff = 0.0
    for res, rec in records:
        seg = rec.segments[0]  # a new segment (history rewritten) would be its own row
        flat = seg.flatten()
        prompt = list(seg.prompt_ids)
        ids = torch.tensor([prompt + flat["tokens"]])
        out = model(input_ids=ids, output_hidden_states=True)
        logp_all = torch.log_softmax(out.logits[0, :-1].float(), dim=-1)
        post = torch.tensor(flat["tokens"])
        start = len(prompt) - 1
        logp = logp_all[start:].gather(1, post[:, None])[:, 0]
        values = value_head(out.hidden_states[-1][0, start : -1 + len(ids[0]) or None])[:, 0]
        mask = torch.tensor(flat["action_mask"], dtype=torch.bool)
        behaviour = torch.tensor(flat["logprobs"])
        if mask.any():
            max_diff = max(max_diff, float((logp - behaviour)[mask].abs().max()))
        group_of.setdefault(rec.meta.group_id, len(group_of))
        rows.append((post, mask, behaviour, logp, values,
                     group_of[rec.meta.group_id], float(res.outcome.reward)))  # fmt: skip
    t_max = max(len(r[0]) for r in rows)

    def pad(i: int, fill: float, dtype: torch.dtype) -> torch.Tensor:
        out = torch.full((len(rows), t_max), fill, dtype=dtype)
        for n, r in enumerate(rows):
            out[n, : len(r[i])] = r[i]
        return out

    batch = ObjectiveBatch(
        tokens=pad(0, -1, torch.long),
        action_mask=pad(1, 0, torch.bool),
        group_ids=torch.tensor([r[5] for r in rows]),
        rewards=torch.tensor([r[6] for r in rows]),
        behavior_logp=pad(2, 0.0, torch.float32),
        logp=pad(3, 0.0, torch.float32),
        values=pad(4, 0.0, torch.float32),
        old_values=pad(4, 0.0, torch.float32),
    )
    result = li2sao_objective(batch, phase="bootstrap")
    rewards = batch.rewards
    mixed = sum(
        1 for g in set(group_of.values()) if rewards[batch.group_ids == g].unique().numel() > 1
    )
    return {
        "max_abs_logprob_diff": max_diff,
        "actor_loss": None if result.actor_loss is None else float(result.actor_loss),
        "critic_loss": None if result.critic_loss is None else float(result.critic_loss),
        "estimator": str(result.estimator),
        "n_trajectories": len(rows),
        "n_action_tokens": int(batch.action_mask.sum()),
        "mixed_groups": mixed,
        **{f"m/{k}": v for k, v in result.metrics.items()},
    }
