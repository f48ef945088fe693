"""The demo's objective step runs on the trainer's batch builder and torch backend."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from services.demo_objective import evaluate_objective
from tests.support.recorded_conversations import record_conversations

pytestmark = pytest.mark.slow  # serves the tiny model and runs the torch backend


def test_demo_objective_on_recorded_trajectories(tiny_model_dir: Path, engine_url: str) -> None:
    records = record_conversations(engine_url, tiny_model_dir, n=2, turns=2, tag="demo")
    pairs = [(SimpleNamespace(outcome=r.outcome), r) for r in records]
    out = evaluate_objective(tiny_model_dir, pairs)
    assert out["max_abs_logprob_diff"] < 1e-5
    assert out["n_trajectories"] == 2 and out["mixed_groups"] == 1  # rewards 0 and 1
    generated = sum(r.n_generated_tokens for r in records)
    assert out["n_action_tokens"] == generated
    assert out["estimator"] == "grpo" and out["critic_loss"] is not None


def test_scripted_trajectories_are_checked_but_kept_out_of_the_objective(
    tiny_model_dir: Path, engine_url: str
) -> None:
    records = record_conversations(engine_url, tiny_model_dir, n=2, turns=2, tag="demo-sc")
    for turn in records[0].segments[0].turns:  # as if the scripted engine had replayed it
        turn.scripted = True
    pairs = [(SimpleNamespace(outcome=r.outcome), r) for r in records]
    out = evaluate_objective(tiny_model_dir, pairs)
    assert (out["n_trajectories"], out["scripted_trajectories"], out["mixed_groups"]) == (1, 1, 0)
    assert out["n_action_tokens"] == records[1].n_generated_tokens
    assert out["n_checked_tokens"] == sum(r.n_generated_tokens for r in records)
    assert out["max_abs_logprob_diff"] < 1e-5
    for turn in records[1].segments[0].turns:
        turn.scripted = True
    skipped = evaluate_objective(tiny_model_dir, pairs)
    assert "scripted" in skipped["objective_skipped"] and skipped["n_trajectories"] == 0
