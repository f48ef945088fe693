"""Redis-backed storage of swerl's records (trajectory records; all keys under one prefix)."""

from services.store.trajectories import (
    DEFAULT_PREFIX,
    StoreBusyError,
    TrajectoryExistsError,
    TrajectoryKeys,
    TrajectoryNotFoundError,
    TrajectoryStore,
    load_trajectory,
)

__all__ = [
    "DEFAULT_PREFIX",
    "StoreBusyError",
    "TrajectoryExistsError",
    "TrajectoryKeys",
    "TrajectoryNotFoundError",
    "TrajectoryStore",
    "load_trajectory",
]
