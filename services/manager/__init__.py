"""Rollout manager: turns rollout requests into tasks and dispatches them to sandbox workers."""

from services.manager.api import RolloutManager, tasks_for_request
from services.manager.config import ManagerConfig
from services.manager.service import ManagerService

__all__ = ["ManagerConfig", "ManagerService", "RolloutManager", "tasks_for_request"]
