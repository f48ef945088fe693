"""Trajectory records for trainer tests, made of the real protocol types.

Every record goes through the binary entry format the adapter writes to Redis
(``to_entries`` -> ``from_entries``), so the tests see what the trainer reads from the store.
"""

from __future__ import annotations

from services.protocol import (
    Outcome,
    OutcomeStatus,
    Segment,
    SegmentReason,
    TrajectoryMeta,
    TrajectoryRecord,
    Turn,
)
from services.protocol.packing import float_array, int_array

# (observation ids, output ids, weight version) per turn
TurnSpec = tuple[list[int], list[int], int]


def turn(obs: list[int], out: list[int], version: int = 0, finish: str = "stop") -> Turn:
    logps = [-0.1 * (i + 1) - 0.01 * version for i in range(len(out))]
    return Turn(
        observation_ids=int_array(obs),
        output_ids=int_array(out),
        output_logprobs=float_array(logps),
        weight_version=version,
        finish_reason=finish,
    )


def record(
    tid: str,
    segments: list[tuple[list[int], list[Turn]]],
    reward: float | None = 1.0,
    group: str = "g0",
    status: OutcomeStatus = OutcomeStatus.COMPLETED,
) -> TrajectoryRecord:
    rec = TrajectoryRecord(meta=TrajectoryMeta(trajectory_id=tid, group_id=group))
    for n, (prompt, turns) in enumerate(segments):
        reason = SegmentReason.INITIAL if n == 0 else SegmentReason.HISTORY_MISMATCH
        rec.segments.append(Segment(prompt_ids=int_array(prompt), turns=turns, reason=reason))
    if status is OutcomeStatus.ABORTED:
        outcome = Outcome(status=status, abort_reason="sandbox could not start")
    else:
        outcome = Outcome(status=status, reward=reward)
    # through the store's wire format
    return TrajectoryRecord.from_entries(rec.meta, rec.to_entries(), outcome)
