"""Trajectory records -> training rows, one per segment, with every record checked first.

A segment is one token-consistent prefix chain (DESIGN.md "Trajectory record"), so it is the
unit the model can score in one forward pass: its prompt ids, then per turn the observation
tokens (action mask 0) and the generated tokens (mask 1, with the behaviour logprobs and the
weight version the engine recorded for each token -- a turn that a token-mode refresh
interrupted has two, split at its version runs). :meth:`services.protocol.Segment.flatten`
gives that post-prompt layout; this module adds the checks a trainer needs before trusting it.

Turns the engine *replayed* (``Turn.scripted``: the reference engine's scripted mode, test
machinery beside the sampling engine) are kept out of the loss: their tokens are not samples of
the policy, so their behaviour logprobs mean nothing to an importance ratio. They stay in the
row as context (action mask 0, like observations); a segment left without any sampled token
gives no row, so a trajectory the scripted engine replayed from start to end never enters a
batch (its reward is not in its group's statistics either: docs/trainer.md).

Choice (docs/trainer.md): every segment of a trajectory becomes its own row and shares the
trajectory's outcome reward; the reward sits on each row's last action token. Rows carry the
trajectory's index, so trajectory-level statistics can be recovered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.protocol import OutcomeStatus, Segment, TrajectoryRecord


class RecordError(ValueError):
    """A trajectory record cannot be trained on; the message names the record and the problem."""


@dataclass(frozen=True)
class SegmentRow:
    """One segment of one trajectory, flattened for training."""

    trajectory_id: str
    group_id: str
    segment_index: int
    prompt_ids: list[int]
    tokens: list[int]  # post-prompt ids: observations and outputs in order
    action_mask: list[int]
    behavior_logp: list[float]
    versions: list[int]  # weight version per token, -1 on observation tokens
    reward: float
    truncated: bool  # the trajectory hit a limit (timeout) or its last turn hit max tokens
    scripted_tokens: int = 0  # generated tokens of scripted turns in it (mask 0)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.tokens)

    @property
    def n_actions(self) -> int:
        return sum(self.action_mask)


def check_record(record: TrajectoryRecord, vocab_size: int | None = None) -> None:
    """Raise :class:`RecordError` unless ``record`` is a finished, well-formed trajectory.

    Checked: it has token turns (a relay-mode record has only text); an outcome exists (the
    trajectory is finished); a trainable outcome has a finite
    reward; every segment has a non-empty prompt; generated ids and logprobs have equal lengths;
    logprobs are finite and <= 0; weight versions are >= 0; token ids lie in ``[0, vocab_size)``
    when the vocabulary size is given.
    """
    tid = record.meta.trajectory_id
    if record.text_only:
        raise RecordError(
            f"trajectory {tid}: text-only record of a relay-mode adapter (no token ids, no "
            "behaviour logprobs): not trainable"
        )
    outcome = record.outcome
    if outcome is None:
        raise RecordError(f"trajectory {tid}: no outcome (the trajectory is not finished)")
    if outcome.trainable and (outcome.reward is None or not math.isfinite(outcome.reward)):
        raise RecordError(f"trajectory {tid}: reward {outcome.reward!r} is not a finite number")
    for s, segment in enumerate(record.segments):
        where = f"trajectory {tid} segment {s}"
        if not segment.prompt_ids:
            raise RecordError(f"{where}: empty prompt (the first token has no predecessor)")
        ids = list(segment.prompt_ids)
        for t, turn in enumerate(segment.turns):
            if len(turn.output_ids) != len(turn.output_logprobs):
                raise RecordError(
                    f"{where} turn {t}: {len(turn.output_ids)} output ids but "
                    f"{len(turn.output_logprobs)} logprobs"
                )
            bad = [lp for lp in turn.output_logprobs if not (math.isfinite(lp) and lp <= 0.0)]
            if bad:
                raise RecordError(f"{where} turn {t}: logprob {bad[0]!r} is not finite and <= 0")
            oldest = min((v for _, v in turn.version_runs), default=turn.weight_version)
            if min(oldest, turn.weight_version) < 0:
                raise RecordError(f"{where} turn {t}: weight version {oldest} < 0")
            ids.extend(turn.observation_ids)
            ids.extend(turn.output_ids)
        if vocab_size is not None:
            out_of_range = [i for i in ids if not 0 <= i < vocab_size]
            if out_of_range:
                raise RecordError(
                    f"{where}: token id {out_of_range[0]} outside the vocabulary [0, {vocab_size})"
                )


def _truncated(record: TrajectoryRecord) -> bool:
    assert record.outcome is not None
    if record.outcome.status is OutcomeStatus.TIMEOUT:
        return True
    turns = [t for s in record.segments for t in s.turns]
    return bool(turns) and turns[-1].finish_reason == "length"


def segment_rows(record: TrajectoryRecord) -> list[SegmentRow]:
    """The rows of a checked, trainable record; segments without sampled tokens give none."""
    assert record.outcome is not None and record.outcome.reward is not None
    truncated = _truncated(record)
    rows = []
    for index, segment in enumerate(record.segments):
        flat = segment.flatten()
        scripted = _mask_scripted_turns(segment, flat)
        if not any(flat["action_mask"]):
            continue
        rows.append(
            SegmentRow(
                trajectory_id=record.meta.trajectory_id,
                group_id=record.meta.group_id or record.meta.trajectory_id,
                segment_index=index,
                prompt_ids=list(segment.prompt_ids),
                tokens=flat["tokens"],
                action_mask=flat["action_mask"],
                behavior_logp=[float(x) for x in flat["logprobs"]],
                versions=flat["versions"],
                reward=float(record.outcome.reward),
                truncated=truncated,
                scripted_tokens=scripted,
            )
        )
    return rows


def _mask_scripted_turns(segment: Segment, flat: dict[str, list]) -> int:
    """Turn the output tokens of scripted turns in ``flat`` (``Segment.flatten``'s layout) into
    context: mask 0, logprob 0.0, version -1, as observation tokens are. Their number."""
    masked, position = 0, 0
    for turn in segment.turns:
        position += len(turn.observation_ids)
        n_out = len(turn.output_ids)
        if turn.scripted:
            end = position + n_out
            flat["action_mask"][position:end] = [0] * n_out
            flat["logprobs"][position:end] = [0.0] * n_out
            flat["versions"][position:end] = [-1] * n_out
            masked += n_out
        position += n_out
    return masked
