"""Wire contracts between swerl's parts: trajectory records, tasks and results, instances."""

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
    TrajectoryMeta,
    TrajectoryRecord,
    Turn,
)

__all__ = [
    "AgentLimits",
    "Outcome",
    "OutcomeStatus",
    "ProtocolError",
    "RolloutRequest",
    "RolloutTask",
    "SamplingConfig",
    "Segment",
    "SegmentReason",
    "TaskResult",
    "TrajectoryMeta",
    "TrajectoryRecord",
    "Turn",
]
