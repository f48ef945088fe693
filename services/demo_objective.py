"""The demo's last step: recorded trajectories -> padded batch -> Li2SAO bootstrap objective.

The trainer's own parts do the work: :func:`trainer.data.build_batch` turns the records into a
batch (one row per segment), the torch backend recomputes the log-probability of every
generated token and the critic's values (a zero-initialised value head), and
``trainer.algorithms.li2sao_objective`` evaluates actor and critic losses. No weights change.

Two batches: the **logprob check** (``max_abs_logprob_diff`` must stay below 1e-5: the engine
and the trainer agree) covers every generated token, the scripted engine's included (it reports
the served model's own logprobs of the tokens it replays); the **objective** runs on the batch
the trainer would train on, where scripted turns are kept out of the loss (docs/trainer.md
"Batch layout"): a trajectory the scripted engine replayed gives no row, so with one sampled
member per group the groups are singletons there (``mixed_groups`` 0, counted in
``scripted_trajectories``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from services.protocol import TrajectoryRecord
from trainer.algorithms import ObjectiveBatch, li2sao_objective
from trainer.backends.torch_backend import TorchBackend
from trainer.config import BatchConfig, TrainerConfig
from trainer.data import BatchError, TrainBatch, build_batch


def _as_sampled(record: TrajectoryRecord) -> TrajectoryRecord:
    """A copy of ``record`` whose scripted turns count as generated (for the logprob check)."""
    clone = copy.deepcopy(record)
    for segment in clone.segments:
        for turn in segment.turns:
            turn.scripted = False
    return clone


def evaluate_objective(model_dir: Path, records: list[tuple[Any, Any]]) -> dict[str, Any]:
    """``records`` are ``(task result, trajectory record)`` pairs; the result's outcome counts."""
    trajectories = []
    for res, rec in records:
        rec.outcome = res.outcome
        trajectories.append(rec)
    versions = [t.weight_version for r in trajectories for s in r.segments for t in s.turns]
    version = max(versions, default=0)
    backend = TorchBackend(TrainerConfig(model=str(model_dir), critic={"head_init_std": 0.0}))

    def batch_of(recs: list[TrajectoryRecord]) -> tuple[TrainBatch, Any]:
        config = BatchConfig(max_policy_lag=version)
        return build_batch(recs, trainer_version=version, config=config,
                           pad_id=backend.pad_id, vocab_size=backend.vocab_size)  # fmt: skip

    checked, _ = batch_of([_as_sampled(r) for r in trajectories])
    check = backend.logprobs_and_values(checked)
    diff = (check.logprobs - checked.behavior_logp).abs()[checked.action_mask]
    out: dict[str, Any] = {
        "max_abs_logprob_diff": float(diff.max()) if diff.numel() else 0.0,
        "n_checked_tokens": int(checked.action_mask.sum()),
    }
    try:
        batch, report = batch_of(trajectories)
    except BatchError as exc:  # every trajectory replayed: nothing is the policy's
        return {**out, "objective_skipped": str(exc), "n_trajectories": 0, "mixed_groups": 0}
    forward = backend.logprobs_and_values(batch)
    assert forward.values is not None
    mask = batch.action_mask
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
        **out,
        "actor_loss": None if result.actor_loss is None else float(result.actor_loss),
        "critic_loss": None if result.critic_loss is None else float(result.critic_loss),
        "estimator": str(result.estimator),
        "n_trajectories": batch.num_trajectories,
        "scripted_trajectories": report.scripted_trajectories,
        "n_rows": batch.num_rows,
        "n_action_tokens": int(mask.sum()),
        "mixed_groups": mixed,
        **{f"m/{k}": v for k, v in result.metrics.items()},
        **{f"m/{k}": v for k, v in report.metrics().items()},
    }
