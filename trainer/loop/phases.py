"""The phase controller: which batch shape the loop requests and trains, and when it switches.

Pure logic, no I/O (LI2SAO_SPEC "Readiness gate", "Batch shape and in-flight switching").

Schedules:

* ``groups`` (GRPO, DAPO, GSPO): every batch is ``P`` groups x ``n``, forever.
* ``single`` (LiSAO, PACT, SR-PPO): every batch is ``B`` single rollouts, forever.
* ``switch`` (Li2SAO): ``bootstrap`` (``P x n``, the gate updated after every step) ->
  ``draining`` -> ``single``. The gate switches after step ``k``; the batch already prefetched
  for step ``k + 1`` is still built and trained at the bootstrap group size (``draining``: no new
  request is sent); once it is taken, every leftover bootstrap request is cancelled (the loop
  asks :meth:`PhaseController.take_cancel`) and only then do ``B x 1`` requests start. A batch
  never mixes group sizes: the shape of a batch is the phase's, and the estimator follows it.

The objective phase (``bootstrap`` / ``switched``, :data:`trainer.algorithms.PHASES`) is
``bootstrap`` until the gate switches and ``switched`` from the step after (choice: the
prefetched bootstrap batch is trained with the GRPO advantage its groups give, and the critic
fits absolute returns as the spec says for every step after the switch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from trainer.algorithms import ReadinessGate
from trainer.loop.config import GateSettings, GroupShape, SingleShape

LoopPhase = Literal["groups", "single", "bootstrap", "draining"]
STATE_VERSION = 1


@dataclass(frozen=True)
class BatchShape:
    """``prompts`` per batch x ``group_size`` samples each; ``budget`` trajectories may be
    submitted and not yet trained (the one-batch-ahead prefetch: 2 batches by default)."""

    prompts: int
    group_size: int
    budget: int

    @property
    def trajectories(self) -> int:
        return self.prompts * self.group_size

    @classmethod
    def groups(cls, shape: GroupShape) -> BatchShape:
        return cls(shape.prompts, shape.group_size, 2 * shape.prompts * shape.group_size)

    @classmethod
    def single(cls, shape: SingleShape) -> BatchShape:
        return cls(shape.batch_size, 1, shape.budget)


class PhaseController:
    """The loop's phase, its readiness gate and the switch step (see the module docstring)."""

    def __init__(
        self,
        schedule: str,
        bootstrap: GroupShape,
        single: SingleShape,
        gate: GateSettings | None = None,
    ) -> None:
        if schedule not in ("groups", "single", "switch"):
            raise ValueError(f"unknown schedule {schedule!r}; expected groups, single or switch")
        self.schedule = schedule
        self._group = BatchShape.groups(bootstrap)
        self._single = BatchShape.single(single)
        settings = gate or GateSettings()
        self.gate = ReadinessGate(**settings.model_dump()) if schedule == "switch" else None
        self.phase: LoopPhase = {"groups": "groups", "single": "single"}.get(schedule, "bootstrap")  # type: ignore[assignment]
        self.switch_step: int | None = None
        self._cancel_pending = False

    # -- what to request and build --------------------------------------------------------
    @property
    def batch_shape(self) -> BatchShape:
        """The shape of the next batch to build (draining: still the bootstrap's)."""
        return self._single if self.phase == "single" else self._group

    @property
    def request_shape(self) -> BatchShape | None:
        """The shape of new requests; None while draining (nothing new is sent)."""
        if self.phase == "draining":
            return None
        return self.batch_shape

    @property
    def objective_phase(self) -> str:
        """``bootstrap`` until the gate switched, then ``switched`` (single-phase schedules:
        ``bootstrap`` for groups, ``switched`` for single rollouts, which only Li2SAO reads)."""
        if self.phase in ("bootstrap", "groups"):
            return "bootstrap"
        return "switched"

    # -- transitions ----------------------------------------------------------------------
    def after_step(
        self, step: int, explained_variance: float | None, accuracy: float | None
    ) -> bool:
        """Feed step ``step``'s readiness values to the gate (bootstrap only); True when this
        step switched it (the phase becomes ``draining``)."""
        if self.phase != "bootstrap":
            return False
        assert self.gate is not None
        if self.gate.observe(step, explained_variance, accuracy):
            self.phase = "draining"
            self.switch_step = step
            return True
        return False

    def batch_taken(self) -> None:
        """The loop took a batch for training; a draining controller now moves to ``single``
        and asks for the leftover bootstrap work to be cancelled."""
        if self.phase == "draining":
            self.phase = "single"
            self._cancel_pending = True

    def take_cancel(self) -> bool:
        """True once after the prefetched bootstrap batch was taken: cancel every leftover
        bootstrap request now, before the first single-rollout request is sent."""
        pending, self._cancel_pending = self._cancel_pending, False
        return pending

    # -- checkpoint state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "schedule": self.schedule,
            "phase": self.phase,
            "switch_step": self.switch_step,
            "cancel_pending": self._cancel_pending,
            "gate": None if self.gate is None else self.gate.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported phase state version {state.get('version')!r}")
        if state.get("schedule") != self.schedule:
            raise ValueError(
                f"the checkpoint ran schedule {state.get('schedule')!r}, this config "
                f"{self.schedule!r}: a run does not change schedule on resume"
            )
        phases = {"groups": ("groups",), "single": ("single",)}
        allowed = phases.get(self.schedule, ("bootstrap", "draining", "single"))
        if state.get("phase") not in allowed:
            raise ValueError(f"phase {state.get('phase')!r} is not one of {allowed}")
        self.phase = state["phase"]
        self.switch_step = state.get("switch_step")
        self._cancel_pending = bool(state.get("cancel_pending", False))
        if self.gate is not None:
            self.gate.load_state_dict(state["gate"])
