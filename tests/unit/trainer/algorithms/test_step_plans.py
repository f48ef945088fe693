"""Step plans as data: the built-in algorithms' plans and the rules a declared plan must obey."""

from __future__ import annotations

import pytest

from trainer.algorithms import (
    ACTOR_CRITIC,
    ACTOR_ONLY,
    ALGORITHM_REGISTRY,
    FORWARD_ACTOR,
    OLD_LOGP,
    PACT_PLAN,
    SRPPO_PLAN,
    AlgorithmEntry,
    PlanPhase,
    StepPlan,
    actor_steps,
    critic_steps,
    pact_objective,
)


def test_each_algorithm_declares_its_plan_at_registration() -> None:
    plans = {name: ALGORITHM_REGISTRY.get(name).plan for name in ALGORITHM_REGISTRY.names()}
    assert plans["grpo"] == plans["dapo"] == plans["gspo"] == ACTOR_ONLY
    assert plans["lisao"] == plans["li2sao"] == ACTOR_CRITIC
    assert plans["srppo"] == SRPPO_PLAN and SRPPO_PLAN.value_head == "sigmoid"
    assert plans["pact"] == PACT_PLAN and PACT_PLAN.value_head == "sigmoid"
    # PACT_SRPPO_SPEC "Critic" steps 1-5: old logprobs, actor steps, a forward of the updated
    # actor, the critic stage in the actor's minibatches
    kinds = [(p.kind, p.stage, p.passes, p.minibatches) for p in PACT_PLAN.phases]
    assert kinds == [
        ("old_logp", "actor", 1, 1),
        ("actor", "actor", 1, None),
        ("forward_actor", "actor", 1, 1),
        ("critic", "critic", 1, None),
    ]
    assert PACT_PLAN.recomputes_old_logp and not ACTOR_CRITIC.recomputes_old_logp
    assert ACTOR_CRITIC.uses_critic and not ACTOR_ONLY.uses_critic
    # Li2SAO: one actor step (minibatches from the trainer config), K critic passes (None: K)
    assert ACTOR_CRITIC.phases == (
        PlanPhase("actor", minibatches=None),
        PlanPhase("critic", passes=None),
    )


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        ((), "needs an actor or a critic phase"),
        ((OLD_LOGP, FORWARD_ACTOR), "needs an actor or a critic phase"),
        ((actor_steps(), OLD_LOGP), "old_logp must come before every actor phase"),
        ((FORWARD_ACTOR, actor_steps()), "forward_actor must follow an actor phase"),
        ((actor_steps(), critic_steps(stage="critic")), "needs a forward_actor after the last"),
        (
            (actor_steps(), FORWARD_ACTOR, actor_steps(), critic_steps(stage="critic")),
            "needs a forward_actor after the last",
        ),
    ],
)
def test_a_plan_out_of_order_is_refused(phases: tuple[PlanPhase, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepPlan(phases)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"kind": "backward"}, "unknown phase kind"),
        ({"kind": "critic", "stage": "judge"}, "unknown stage"),
        ({"kind": "actor", "stage": "critic"}, "actor phase minimises the actor stage"),
        ({"kind": "actor", "passes": 2}, "one pass"),
        ({"kind": "critic", "passes": 0}, "passes must be a positive int"),
        ({"kind": "critic", "minibatches": 1.5}, "minibatches must be a positive int"),
        ({"kind": "critic", "passes": True}, "passes must be a positive int"),
    ],
)
def test_a_bad_phase_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PlanPhase(**kwargs)


def test_a_plan_needs_the_stages_its_algorithm_has() -> None:
    with pytest.raises(ValueError, match="stage 'critic'"):
        AlgorithmEntry(lambda batch, request: pact_objective(batch, "actor"), plan=PACT_PLAN)
    with pytest.raises(ValueError, match="value_head"):
        StepPlan((actor_steps(),), value_head="tanh")  # type: ignore[arg-type]
