"""SGLang 0.5.23's weight-update session: ``/begin_weight_update`` ... ``/end_weight_update``.

SGLang keeps the session in the scheduler (``SchedulerWeightUpdaterManager._session`` in
``sglang/srt/managers/scheduler_components/weight_updater.py``): ``begin`` opens it (refused
while one is open), ``end`` closes it (refused when none is), and
``update_weights_from_distributed`` outside a session is refused before the scheduler receives
anything. ``update_weights_from_disk`` needs no session. Both session calls run under the
tokenizer manager's weight-update writer lock unless generation is paused
(``TokenizerControlMixin._weight_update_session_call``): the engine runs them as exclusive
operations (:meth:`services.reference_engine.engine.ReferenceEngine.exclusive`).

On SGLang ``begin`` restores in-place-packed (quantised) weights and ``end`` post-processes
them; the reference engine's float32 weights need neither, so the session is only the state
machine and its messages.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from services.protocol.sglang import RunnerSelector

ALREADY_OPEN = "a weight-update session is already open; call end_weight_update() first"
NOT_OPEN = "no weight-update session is open; call begin_weight_update() first"
DISTRIBUTED_OUTSIDE = (
    "update_weights_from_distributed must run between begin_weight_update() and end_weight_update()"
)
SESSION_OK = "Success"


@dataclass
class WeightUpdateSession:
    """Whether a session is open (and the runners it selected); thread-safe."""

    selector: RunnerSelector | None = None
    loaded_weights: bool = False  # a load ran inside the session (SGLang skips post_load then)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def is_open(self) -> bool:
        return self.selector is not None

    def begin(self, selector: RunnerSelector) -> tuple[bool, str]:
        """``SchedulerWeightUpdaterManager.begin_weight_update``: (success, message)."""
        with self._lock:
            if self.selector is not None:
                return False, ALREADY_OPEN
            self.selector, self.loaded_weights = selector, False
            return True, SESSION_OK

    def end(self) -> tuple[bool, str]:
        """``SchedulerWeightUpdaterManager.end_weight_update``: (success, message)."""
        with self._lock:
            if self.selector is None:
                return False, NOT_OPEN
            self.selector, self.loaded_weights = None, False
            return True, SESSION_OK

    def mark_loaded(self) -> None:
        with self._lock:
            if self.selector is not None:
                self.loaded_weights = True
