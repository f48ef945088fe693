"""The toy task through the real stack: Redis, a reference engine sampling the warm-started
tiny model at temperature 1, the adapter in training mode, a toy-only sandbox worker
(``python -m sandbox_worker --kinds toy``) and the rollout manager's dispatch loop
(:func:`services.local_stack.start_toy_services`).

The band of the reward rate comes from bench/bench_toy_task.py (docs/toy-task.md: 256
trajectories gave a tool-call rate of 0.97 and a mean reward of 0.26, chance being 0.25); with
64 trajectories one binomial standard deviation of the reward rate is 0.054, so the band is
chance +- 3.5 sd."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.local_stack import LocalStack, ToyServices, start_toy_services
from services.manager.client import RolloutManager
from services.protocol import AgentLimits, RolloutRequest, SamplingConfig
from services.protocol.toy import CODES, draw_code, toy_instance_ids
from services.protocol.trajectory import OutcomeStatus
from services.store.trajectories import load_trajectory
from tests.support.engines import toy_model_dir_fixture  # noqa: F401 (fixture)

pytestmark = pytest.mark.slow

PROMPTS, SAMPLES = 8, 8
TIME_BUDGET_S = 120.0  # the batch itself (measured: ~5 s for 64 trajectories, 8 slots)
REWARD_BAND = (0.06, 0.44)
MIN_TOOL_CALL_RATE = 0.85


@pytest.fixture(scope="module")
def toy_stack(
    toy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ToyServices]:
    stack = LocalStack(tmp_path_factory.mktemp("toy-stack"))
    try:
        yield start_toy_services(stack, toy_model_dir, secrets.token_urlsafe(32), slots=8)
    finally:
        stack.stop_all()


def test_toy_rollouts_through_the_real_stack_are_at_chance(
    toy_stack: ToyServices, toy_model_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(toy_model_dir))
    request = RolloutRequest(
        kind="toy",
        instance_ids=toy_instance_ids(PROMPTS),
        n_samples=SAMPLES,
        sampling=SamplingConfig(temperature=1.0, max_tokens=48),
        limits=AgentLimits(max_steps=2, wall_time_s=120),
    )
    with RolloutManager(toy_stack.redis_url) as manager:
        manager.start()
        started = time.monotonic()
        results = manager.collect(manager.submit(request), timeout_s=TIME_BUDGET_S)
        took = time.monotonic() - started
    assert len(results) == PROMPTS * SAMPLES and took < TIME_BUDGET_S
    client = redis.Redis.from_url(toy_stack.redis_url)
    rewards, tool_calls = [], 0
    for res in results:
        out = res.outcome
        assert out.status is not OutcomeStatus.ABORTED, out.abort_reason
        assert out.reward in (0.0, 1.0)
        rewards.append(out.reward)
        rec = load_trajectory(client, res.trajectory_id)
        assert rec.meta.extra["kind"] == "toy" and rec.outcome is not None
        assert rec.outcome.reward == out.reward  # the record carries the outcome
        code = draw_code(res.task_id, res.attempt)
        assert out.test_report["code"] == code
        [segment] = rec.segments  # the loop's history extends the adapter's: no re-render
        if out.test_report["ending"] == "no_tool_call":
            assert len(segment.turns) == 1
            continue
        tool_calls += 1
        first, second = segment.turns
        assert "<tool_call>" in tokenizer.decode(list(first.output_ids))
        # Between the turns: the tool observation, with the code on 32 lines.
        seen = tokenizer.decode(list(second.observation_ids))
        assert seen.count(code) == 32 and "<tool_response>" in seen
        answer = tokenizer.decode(list(second.output_ids), skip_special_tokens=True).strip()
        assert out.reward == float(answer == code)
        assert len(second.output_logprobs) == len(second.output_ids) > 0
    client.close()
    assert tool_calls / len(results) >= MIN_TOOL_CALL_RATE
    rate = sum(rewards) / len(rewards)
    assert REWARD_BAND[0] <= rate <= REWARD_BAND[1], rate
    # The codes the worker drew cover all four values (one draw per task).
    assert {r.outcome.test_report["code"] for r in results} == set(CODES)
