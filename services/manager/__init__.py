"""Rollout manager: turns rollout requests into tasks and dispatches them to sandbox workers.

:class:`RolloutManager` (``client.py``) is the client the trainer uses; :class:`Dispatcher`
(``dispatcher.py``) is the dispatch loop that ``python -m services.manager`` runs.
"""

from services.manager.client import RolloutManager, tasks_for_request
from services.manager.config import ManagerConfig
from services.manager.dispatcher import Dispatcher

__all__ = ["Dispatcher", "ManagerConfig", "RolloutManager", "tasks_for_request"]
