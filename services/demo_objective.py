"""The demo's last step: recorded trajectories -> padded batch -> Li2SAO bootstrap objective.

The trainer's own parts do the work: :func:`trainer.data.build_batch` turns the records into a
batch (one row per segment), the torch backend recomputes the log-probability of every
generated token (``max_abs_logprob_diff`` must stay below 1e-5: the engine and the trainer
agree) and the critic's values (a zero-initialised value head), and
``trainer.algorithms.li2sao_objective`` evaluates actor and critic losses. No weights change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainer.algorithms import ObjectiveBatch, li2sao_objective
from trainer.backends.torch_backend import TorchBackend
from trainer.config import BatchConfig, TrainerConfig
from trainer.data import build_batch


def evaluate_objective(model_dir: Path, records: list[tuple[Any, Any]]) -> dict[str, Any]:
    """``records`` are ``(task result, trajectory record)`` pairs; the result's outcome counts."""
    trajectories = []
    for res, rec in records:
        rec.outcome = res.outcome
        trajectories.append(rec)
    versions = [t.weight_version for r in trajectories for s in r.segments for t in s.turns]
    version = max(versions, default=0)
    backend = TorchBackend(TrainerConfig(model=str(model_dir), critic={"head_init_std": 0.0}))
    batch, report = build_batch(
        trajectories,
        trainer_version=version,
        config=BatchConfig(max_policy_lag=version),
        pad_id=backend.pad_id,
        vocab_size=backend.vocab_size,
    )
    forward = backend.logprobs_and_values(batch)
    assert forward.values is not None
    mask = batch.action_mask
    diff = (forward.logprobs - batch.behavior_logp).abs()[mask]
    result = li2sao_objective(
        ObjectiveBatch(
            tokens=batch.tokens,
            action_mask=mask,
            group_ids=batch.group_ids,
            rewards=batch.rewards,
            behavior_logp=batch.behavior_logp,
            logp=forward.logprobs,
            values=forward.values,
        ),
        phase="bootstrap",
    )
    rewards, groups = batch.rewards, batch.group_ids
    mixed = sum(1 for g in groups.unique() if rewards[groups == g].unique().numel() > 1)
    return {
        "max_abs_logprob_diff": float(diff.max()) if diff.numel() else 0.0,
        "actor_loss": None if result.actor_loss is None else float(result.actor_loss),
        "critic_loss": None if result.critic_loss is None else float(result.critic_loss),
        "estimator": str(result.estimator),
        "n_trajectories": batch.num_trajectories,
        "n_rows": batch.num_rows,
        "n_action_tokens": int(mask.sum()),
        "mixed_groups": mixed,
        **{f"m/{k}": v for k, v in result.metrics.items()},
        **{f"m/{k}": v for k, v in report.metrics().items()},
    }
