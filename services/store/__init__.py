"""Redis-backed storage of swerl's records (trajectory records; all keys under one prefix)."""

from services.store.trajectories import (
    DEFAULT_PREFIX,
    TrajectoryExistsError,
    TrajectoryKeys,
    TrajectoryNotFoundError,
    TrajectoryStore,
    load_trajectory,
)

__all__ = [
    "DEFAULT_PREFIX",
    "TrajectoryExistsError",
    "TrajectoryKeys",
    "TrajectoryNotFoundError",
    "TrajectoryStore",
    "load_trajectory",
]
