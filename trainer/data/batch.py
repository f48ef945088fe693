"""The trainer's batch: padded tensors built from finished trajectory records.

Layout (docs/trainer.md "Batch layout"), ``N`` rows (one per segment), two widths:

* full sequences ``[N, L]`` for the model: ``input_ids`` = prompt + post-prompt tokens,
  right-padded with ``pad_id``; ``seq_lengths`` and ``prompt_lengths`` ``[N]``. Right padding
  and causal attention mean no real token ever attends to padding.
* the post-prompt view ``[N, T]`` of :mod:`trainer.algorithms`: ``tokens`` (``-1`` past the
  end), ``action_mask`` (True exactly on generated tokens), ``behavior_logp`` (0 elsewhere),
  ``token_versions`` (-1 elsewhere; per token, so a turn a token-mode refresh interrupted
  switches version exactly at its switch point). Post-prompt token ``t`` of row ``n`` sits at
  full position ``prompt_lengths[n] + t`` and is predicted by the hidden state at
  ``prompt_lengths[n] + t - 1``.
* per row: ``rewards`` (the trajectory's outcome, shared by its segments), ``group_ids`` (dense
  prompt-group index), ``trajectory_index`` (dense), ``segment_index``, ``truncated``.

:func:`build_batch` drops aborted trajectories and those lagging more than
``max_policy_lag`` behind the trainer (the oldest action token decides, LI2SAO_SPEC), and
counts everything it drops in a :class:`BuildReport`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from services.protocol import TrajectoryRecord
from trainer.algorithms import ObjectiveBatch, policy_lag
from trainer.config import BatchConfig
from trainer.data.rows import RecordError, SegmentRow, check_record, segment_rows


class BatchError(ValueError):
    """No batch can be built (nothing trainable left, or a record breaks a rule)."""


@dataclass(frozen=True)
class TrainBatch:
    """Padded training tensors; see the module docstring for the layout."""

    input_ids: Tensor
    seq_lengths: Tensor
    prompt_lengths: Tensor
    tokens: Tensor
    action_mask: Tensor
    behavior_logp: Tensor
    token_versions: Tensor
    rewards: Tensor
    group_ids: Tensor
    trajectory_index: Tensor
    segment_index: Tensor
    truncated: Tensor
    trajectory_ids: tuple[str, ...] = field(default=())
    pad_id: int = 0

    def __post_init__(self) -> None:
        n, width = self.input_ids.shape
        t = self.tokens.shape[1]
        for name in ("tokens", "action_mask", "behavior_logp", "token_versions"):
            if tuple(getattr(self, name).shape) != (n, t):
                raise BatchError(f"{name} has shape {tuple(getattr(self, name).shape)}, "
                                 f"expected {(n, t)}")  # fmt: skip
        for name in ("seq_lengths", "prompt_lengths", "rewards", "group_ids",
                     "trajectory_index", "segment_index", "truncated"):  # fmt: skip
            if tuple(getattr(self, name).shape) != (n,):
                raise BatchError(f"{name} has shape {tuple(getattr(self, name).shape)}, "
                                 f"expected {(n,)}")  # fmt: skip
        if n and (bool((self.prompt_lengths < 1).any()) or int(self.seq_lengths.max()) > width):
            raise BatchError("every row needs a prompt of >= 1 token and fits in input_ids")

    @property
    def num_rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_trajectories(self) -> int:
        return len(self.trajectory_ids)

    @property
    def attention_mask(self) -> Tensor:
        """``[N, L]`` bool: True on real tokens (prompt and post-prompt), False on padding."""
        width = self.input_ids.shape[1]
        return torch.arange(width, device=self.input_ids.device) < self.seq_lengths[:, None]

    @property
    def post_lengths(self) -> Tensor:
        return self.seq_lengths - self.prompt_lengths

    def objective_batch(
        self,
        logp: Tensor,
        values: Tensor | None = None,
        old_values: Tensor | None = None,
        trainer_version: int | None = None,
        *,
        old_logp: Tensor | None = None,
        value_logits: Tensor | None = None,
    ) -> ObjectiveBatch:
        """These rows as the objective reads them, with the model's ``logp`` (and the critic's
        ``values`` or sigmoid-head ``value_logits``, ``old_values``, the recomputed pre-update
        ``old_logp``); the token versions come along when ``trainer_version`` is given. Group
        statistics count trajectories (the batch's ``trajectory_index``)."""
        return ObjectiveBatch(
            tokens=self.tokens,
            action_mask=self.action_mask,
            group_ids=self.group_ids,
            rewards=self.rewards,
            behavior_logp=self.behavior_logp,
            logp=logp,
            values=values,
            old_values=old_values,
            token_versions=None if trainer_version is None else self.token_versions,
            trainer_version=trainer_version,
            old_logp=old_logp,
            value_logits=value_logits,
            trajectory_index=self.trajectory_index,
        )

    def to(self, device: torch.device | str) -> TrainBatch:
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), Tensor)
        }
        return replace(self, **moved)

    def select(self, rows: Sequence[int] | Tensor) -> TrainBatch:
        """The given rows, trimmed to their own longest full and post-prompt lengths."""
        index = torch.as_tensor(rows, dtype=torch.long, device=self.input_ids.device)
        if index.numel() == 0:
            raise BatchError("cannot select zero rows")
        seq = self.seq_lengths.index_select(0, index)
        post = seq - self.prompt_lengths.index_select(0, index)
        width, t = int(seq.max()), int(post.max())
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, Tensor):
                continue
            value = value.index_select(0, index)
            if f.name == "input_ids":
                value = value[:, :width]
            elif value.ndim == 2:
                value = value[:, :t]
            picked[f.name] = value
        return replace(self, **picked)


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_batch` kept and dropped, as counts (trajectories unless named rows)."""

    trajectories_in: int = 0
    aborted: int = 0
    over_lag: int = 0
    overlong_rows: int = 0
    empty_rows: int = 0  # segments without sampled tokens (none generated, or all scripted)
    rows: int = 0
    trajectories: int = 0
    truncated: int = 0
    mean_lag: float = 0.0
    # Replayed turns (Turn.scripted, test machinery): their tokens never carry a loss; a
    # trajectory replayed from start to end gives no row (counted, like aborted ones).
    scripted_tokens: int = 0
    scripted_trajectories: int = 0

    def metrics(self) -> dict[str, float]:
        return {f"data/{f.name}": float(getattr(self, f.name)) for f in fields(self)}


def _pad(rows: list[list], width: int, fill: float | int, dtype: torch.dtype) -> Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for n, values in enumerate(rows):
        if values:
            out[n, : len(values)] = torch.tensor(values, dtype=dtype)
    return out


def _tensors(rows: list[SegmentRow], pad_id: int) -> dict[str, Tensor]:
    width = max(r.length for r in rows)
    t = max(len(r.tokens) for r in rows)
    return {
        "input_ids": _pad([r.prompt_ids + r.tokens for r in rows], width, pad_id, torch.long),
        "seq_lengths": torch.tensor([r.length for r in rows], dtype=torch.long),
        "prompt_lengths": torch.tensor([len(r.prompt_ids) for r in rows], dtype=torch.long),
        "tokens": _pad([r.tokens for r in rows], t, -1, torch.long),
        "action_mask": _pad([r.action_mask for r in rows], t, 0, torch.bool),
        "behavior_logp": _pad([r.behavior_logp for r in rows], t, 0.0, torch.float32),
        "token_versions": _pad([r.versions for r in rows], t, -1, torch.long),
        "rewards": torch.tensor([r.reward for r in rows], dtype=torch.float32),
        "segment_index": torch.tensor([r.segment_index for r in rows], dtype=torch.long),
        "truncated": torch.tensor([r.truncated for r in rows], dtype=torch.bool),
    }


def _dense_ids(names: list[str]) -> tuple[Tensor, tuple[str, ...]]:
    order: dict[str, int] = {}
    ids = [order.setdefault(name, len(order)) for name in names]
    return torch.tensor(ids, dtype=torch.long), tuple(order)


def batch_from_rows(rows: Sequence[SegmentRow], pad_id: int = 0) -> TrainBatch:
    """Pad checked rows into a :class:`TrainBatch` (dense group and trajectory indices)."""
    if not rows:
        raise BatchError("a batch needs at least one row")
    rows = list(rows)
    trajectory_index, trajectory_ids = _dense_ids([r.trajectory_id for r in rows])
    group_ids, _ = _dense_ids([r.group_id for r in rows])
    return TrainBatch(
        **_tensors(rows, pad_id),
        group_ids=group_ids,
        trajectory_index=trajectory_index,
        trajectory_ids=trajectory_ids,
        pad_id=pad_id,
    )


def build_batch(
    records: Sequence[TrajectoryRecord],
    trainer_version: int,
    config: BatchConfig | None = None,
    *,
    pad_id: int = 0,
    vocab_size: int | None = None,
) -> tuple[TrainBatch, BuildReport]:
    """Finished records -> :class:`TrainBatch`, plus the counts of what was dropped.

    Every record is checked (:func:`~trainer.data.rows.check_record`); a malformed one is an
    error naming it, never silently skipped. Aborted trajectories never enter the batch. A
    segment longer than ``config.max_seq_len`` is dropped and counted (``overlong="drop"``) or
    raises (``"error"``). Trajectories whose oldest action token is more than
    ``config.max_policy_lag`` versions behind ``trainer_version`` are dropped; a token from a
    version newer than the trainer's is an error.
    """
    config = config or BatchConfig()
    rows, dropped = _trainable_rows(records, config, vocab_size)
    if not rows:
        raise BatchError(
            f"no trainable rows in {len(records)} records ({dropped.aborted} aborted, "
            f"{dropped.overlong_rows} overlong segments, {dropped.empty_rows} without sampled "
            f"tokens, {dropped.scripted_trajectories} with scripted turns)"
        )
    kept, over_lag, kept_lag = _within_lag(rows, trainer_version, config.max_policy_lag)
    batch = batch_from_rows(kept, pad_id)
    report = replace(
        dropped,
        trajectories_in=len(records),
        over_lag=over_lag,
        rows=len(kept),
        trajectories=batch.num_trajectories,
        truncated=len({r.trajectory_id for r in kept if r.truncated}),
        mean_lag=float(kept_lag.to(torch.float64).mean()),
    )
    return batch, report


def _trainable_rows(
    records: Sequence[TrajectoryRecord], config: BatchConfig, vocab_size: int | None
) -> tuple[list[SegmentRow], BuildReport]:
    """The rows of the checked, trainable records within ``max_seq_len``, and a report that
    counts the aborted trajectories, overlong segments and segments without actions."""
    seen: set[str] = set()
    aborted = overlong = empty = scripted_tokens = scripted_trajectories = 0
    rows: list[SegmentRow] = []
    for record in records:
        if not isinstance(record, TrajectoryRecord):
            raise BatchError(f"expected TrajectoryRecord, got {type(record).__name__}")
        tid = record.meta.trajectory_id
        if tid in seen:
            raise BatchError(f"trajectory {tid} appears twice in the batch")
        seen.add(tid)
        check_record(record, vocab_size)
        assert record.outcome is not None
        if not record.outcome.trainable:
            aborted += 1
            continue
        produced = segment_rows(record)
        empty += len(record.segments) - len(produced)
        replayed = sum(len(t.output_ids) for s in record.segments for t in s.turns if t.scripted)
        scripted_tokens += replayed
        scripted_trajectories += replayed > 0
        for row in produced:
            if row.length > config.max_seq_len:
                if config.overlong == "error":
                    raise RecordError(
                        f"trajectory {tid} segment {row.segment_index}: {row.length} tokens "
                        f"exceed max_seq_len={config.max_seq_len}"
                    )
                overlong += 1
                continue
            rows.append(row)
    report = BuildReport(aborted=aborted, overlong_rows=overlong, empty_rows=empty,
                         scripted_tokens=scripted_tokens,
                         scripted_trajectories=scripted_trajectories)  # fmt: skip
    return rows, report


def _within_lag(
    rows: list[SegmentRow], trainer_version: int, max_policy_lag: int
) -> tuple[list[SegmentRow], int, Tensor]:
    """The rows of trajectories lagging at most ``max_policy_lag`` versions, the number of
    trajectories dropped, and the kept trajectories' lags (the oldest action token of all a
    trajectory's segments decides, LI2SAO_SPEC "Staleness")."""
    tensors = _tensors(rows, pad_id=0)
    trajectory_index, trajectory_ids = _dense_ids([r.trajectory_id for r in rows])
    try:
        row_lag = policy_lag(trainer_version, tensors["token_versions"], tensors["action_mask"])
    except ValueError as exc:
        raise BatchError(f"bad weight versions: {exc}") from exc
    lag = torch.zeros(len(trajectory_ids), dtype=torch.long).scatter_reduce(
        0, trajectory_index, row_lag, reduce="amax", include_self=False
    )
    keep_trajectory = lag <= max_policy_lag
    keep_rows = keep_trajectory[trajectory_index].nonzero().squeeze(1).tolist()
    if not keep_rows:
        raise BatchError(
            f"every trajectory lags more than max_policy_lag={max_policy_lag} "
            f"behind version {trainer_version}"
        )
    over_lag = int((~keep_trajectory).sum())
    return [rows[i] for i in keep_rows], over_lag, lag[keep_trajectory]
