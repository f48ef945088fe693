"""Step plans: the order in which a trainer step updates actor and critic, as data.

An algorithm registers its plan next to its objective (``AlgorithmEntry.plan``); the backend
runs the phases in order (docs/trainer.md "Step plans"). Phases:

=================  =========================================================================
``old_logp``       hand the pre-update actor's recomputed log-probabilities to the objective
                   as ``ObjectiveBatch.old_logp`` (the decoupled ratio; PACT's TIS)
``actor``          actor optimizer steps, one per minibatch (``minibatches``; None: the
                   trainer's ``actor_minibatches``), loss from the objective's ``stage``
``forward_actor``  one no-grad forward of the *updated* actor over the batch (PACT step 3)
``critic``         critic optimizer steps: ``passes`` (None: the trainer's ``K``) x
                   ``minibatches``; ``stage="actor"`` takes the critic loss of the actor-stage
                   objective at the pre-update log-probabilities (standard order),
                   ``stage="critic"`` the critic stage on the updated actor's log-probabilities
=================  =========================================================================

Plans of the built-in algorithms: :data:`ACTOR_ONLY` (GRPO, DAPO, GSPO), :data:`ACTOR_CRITIC`
(LiSAO, Li2SAO: one actor step, ``K`` critic passes), :data:`SRPPO_PLAN` (the same, with a
sigmoid head), :data:`PACT_PLAN` (PACT_SRPPO_SPEC "Critic" steps 1-5).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from trainer.algorithms.objective_types import STAGES, Stage

PhaseKind = Literal["old_logp", "actor", "forward_actor", "critic"]
PHASE_KINDS: tuple[str, ...] = get_args(PhaseKind)
ValueHead = Literal["linear", "sigmoid"]
VALUE_HEADS: tuple[str, ...] = get_args(ValueHead)


def _require_count(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


@dataclass(frozen=True)
class PlanPhase:
    """One phase of a step plan (see the module docstring for the kinds)."""

    kind: PhaseKind
    stage: Stage = "actor"
    passes: int | None = 1
    minibatches: int | None = 1

    def __post_init__(self) -> None:
        if self.kind not in PHASE_KINDS:
            raise ValueError(f"unknown phase kind {self.kind!r}; expected one of {PHASE_KINDS}")
        if self.stage not in STAGES:
            raise ValueError(f"unknown stage {self.stage!r}; expected one of {STAGES}")
        if self.kind == "actor" and self.stage != "actor":
            raise ValueError("an actor phase minimises the actor stage's loss")
        if self.kind == "actor" and self.passes != 1:
            raise ValueError("an actor phase takes one pass (one step per minibatch)")
        _require_count("passes", self.passes)
        _require_count("minibatches", self.minibatches)


def actor_steps(minibatches: int | None = None) -> PlanPhase:
    """One actor optimizer step per minibatch (None: the trainer's ``actor_minibatches``)."""
    return PlanPhase("actor", minibatches=minibatches)


def critic_steps(
    passes: int | None = None, minibatches: int | None = 1, stage: Stage = "actor"
) -> PlanPhase:
    """``passes`` (None: ``K``) x ``minibatches`` critic optimizer steps on ``stage``'s loss."""
    return PlanPhase("critic", stage=stage, passes=passes, minibatches=minibatches)


OLD_LOGP = PlanPhase("old_logp")
FORWARD_ACTOR = PlanPhase("forward_actor")


@dataclass(frozen=True)
class StepPlan:
    """The phases of one trainer step, and the value head the critic must have (None: any).

    Checked when declared: ``old_logp`` before every actor phase, ``forward_actor`` after an
    actor phase, a ``stage="critic"`` critic phase after a ``forward_actor`` that follows the
    last actor phase (it must see the updated actor), at least one actor or critic phase.
    """

    phases: tuple[PlanPhase, ...]
    value_head: ValueHead | None = None

    def __post_init__(self) -> None:
        kinds = [p.kind for p in self.phases]
        if not any(k in ("actor", "critic") for k in kinds):
            raise ValueError("a step plan needs an actor or a critic phase")
        if self.value_head is not None and self.value_head not in VALUE_HEADS:
            raise ValueError(f"value_head must be one of {VALUE_HEADS} or None")
        actors = [i for i, k in enumerate(kinds) if k == "actor"]
        for i, kind in enumerate(kinds):
            if kind == "old_logp" and any(a < i for a in actors):
                raise ValueError("old_logp must come before every actor phase")
            if kind == "forward_actor" and not any(a < i for a in actors):
                raise ValueError("forward_actor must follow an actor phase")
            if kind == "critic" and self.phases[i].stage == "critic":
                last_actor = max(actors, default=-1)
                if "forward_actor" not in kinds[last_actor + 1 : i]:
                    raise ValueError(
                        "a critic-stage phase needs a forward_actor after the last actor phase"
                    )

    @property
    def uses_critic(self) -> bool:
        return any(p.kind == "critic" for p in self.phases)

    @property
    def recomputes_old_logp(self) -> bool:
        return any(p.kind == "old_logp" for p in self.phases)


ACTOR_ONLY = StepPlan((actor_steps(),))
ACTOR_CRITIC = StepPlan((actor_steps(), critic_steps()))
SRPPO_PLAN = StepPlan((actor_steps(), critic_steps()), value_head="sigmoid")
# PACT_SRPPO_SPEC "Critic": V_old and old_logp (1), all actor minibatch steps (2), one forward
# of the updated actor (3), the critic on the IS-weighted target in the actor's minibatches (4-5)
PACT_PLAN = StepPlan(
    (OLD_LOGP, actor_steps(), FORWARD_ACTOR, critic_steps(1, None, "critic")),
    value_head="sigmoid",
)
