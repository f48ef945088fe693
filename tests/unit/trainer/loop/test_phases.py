"""The phase controller: one-phase schedules, and Li2SAO's switch with its prefetched batch."""

from __future__ import annotations

import pytest

from trainer.loop.config import GateSettings, GroupShape, SingleShape
from trainer.loop.phases import PhaseController

BOOT = GroupShape(prompts=4, group_size=8)
SINGLE = SingleShape(batch_size=32, in_flight=48)


def li2sao(**gate: float) -> PhaseController:
    settings = GateSettings(**{"t_min": 2, "t_max": 50, "consecutive": 2, **gate})
    return PhaseController("switch", BOOT, SINGLE, settings)


def test_one_phase_schedules_never_switch() -> None:
    for schedule, shape, objective in (
        ("groups", (4, 8), "bootstrap"),
        ("single", (32, 1), "switched"),
    ):
        ctl = PhaseController(schedule, BOOT, SINGLE)
        assert ctl.gate is None
        for step in range(1, 200):
            assert not ctl.after_step(step, 0.9, 0.99)  # ready values change nothing
            ctl.batch_taken()
            assert not ctl.take_cancel()
            got = ctl.batch_shape
            assert (got.prompts, got.group_size) == shape
            assert ctl.request_shape == got
            assert ctl.objective_phase == objective


def test_budget_is_one_batch_ahead_by_default() -> None:
    assert PhaseController("groups", BOOT, SINGLE).batch_shape.budget == 2 * 4 * 8
    assert PhaseController("single", BOOT, SingleShape(batch_size=32)).batch_shape.budget == 64
    assert PhaseController("single", BOOT, SINGLE).batch_shape.budget == 48


def test_switch_trains_the_prefetched_batch_at_the_group_size_then_cancels() -> None:
    ctl = li2sao()
    shapes = []
    # step 1 is before t_min; steps 2 and 3 are ready: the counter reaches 2 at step 3
    for step in (1, 2):
        ctl.batch_taken()
        shapes.append(ctl.batch_shape.group_size)
        assert not ctl.after_step(step, 0.5, 0.9)
        assert ctl.phase == "bootstrap" and ctl.objective_phase == "bootstrap"
    assert ctl.after_step(3, 0.5, 0.9)
    assert (ctl.phase, ctl.switch_step, ctl.gate.switch_step) == ("draining", 3, 3)
    # the prefetched batch: still 4 x 8, and no new request while it is collected
    assert (ctl.batch_shape.prompts, ctl.batch_shape.group_size) == (4, 8)
    assert ctl.request_shape is None
    assert not ctl.take_cancel()  # nothing to cancel before the prefetched batch is taken
    assert ctl.objective_phase == "switched"
    ctl.batch_taken()
    assert ctl.phase == "single"
    assert ctl.take_cancel() and not ctl.take_cancel()  # exactly once
    for step in range(4, 20):
        assert (ctl.batch_shape.prompts, ctl.batch_shape.group_size) == (32, 1)
        assert ctl.request_shape == ctl.batch_shape
        assert not ctl.after_step(step, -1.0, 0.0)  # one-way: bad values do not switch back
        ctl.batch_taken()
        assert ctl.phase == "single" and not ctl.take_cancel()


def test_gate_needs_consecutive_ready_steps_and_falls_back_at_t_max() -> None:
    ctl = li2sao(t_max=6, consecutive=3)
    values = [(0.5, 0.9), (0.5, 0.9), (None, None), (0.5, 0.9)]  # a step without mixed groups
    for step, (e, a) in enumerate(values, start=2):
        assert not ctl.after_step(step, e, a), step
    assert ctl.after_step(6, None, None)  # t_max
    assert ctl.switch_step == 6


def test_state_round_trip_keeps_phase_gate_and_switch() -> None:
    ctl = li2sao()
    for step in (1, 2, 3):
        ctl.after_step(step, 0.5, 0.9)
    state = ctl.state_dict()
    again = li2sao()
    again.load_state_dict(state)
    assert (again.phase, again.switch_step, again.gate.e_bar) == ("draining", 3, ctl.gate.e_bar)
    again.batch_taken()
    assert again.take_cancel()


def test_state_of_another_schedule_is_refused() -> None:
    state = PhaseController("groups", BOOT, SINGLE).state_dict()
    with pytest.raises(ValueError, match=r"schedule 'groups'.*'switch'"):
        li2sao().load_state_dict(state)
    bad = {**li2sao().state_dict(), "phase": "groups"}
    with pytest.raises(ValueError, match="phase 'groups' is not one of"):
        li2sao().load_state_dict(bad)
    with pytest.raises(ValueError, match="unknown schedule 'fast'"):
        PhaseController("fast", BOOT, SINGLE)
