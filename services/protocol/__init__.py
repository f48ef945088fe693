"""Wire contracts between swerl's parts: trajectory records, tasks and results, instances."""

from services.protocol.ids import ID_RULE, Ident, check_id, id_problem
from services.protocol.tasks import (
    AgentLimits,
    RolloutRequest,
    RolloutTask,
    SamplingConfig,
    TaskResult,
)
from services.protocol.trajectory import (
    Outcome,
    OutcomeStatus,
    ProtocolError,
    Segment,
    SegmentReason,
    TextTurn,
    TrajectoryMeta,
    TrajectoryRecord,
    Turn,
)

__all__ = [
    "ID_RULE",
    "AgentLimits",
    "Ident",
    "Outcome",
    "OutcomeStatus",
    "ProtocolError",
    "RolloutRequest",
    "RolloutTask",
    "SamplingConfig",
    "Segment",
    "SegmentReason",
    "TaskResult",
    "TextTurn",
    "TrajectoryMeta",
    "TrajectoryRecord",
    "Turn",
    "check_id",
    "id_problem",
]
