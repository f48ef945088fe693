"""The SDK objects the runner builds from a task: LLM sampling, tools, condenser."""

from __future__ import annotations

import pytest

from sandbox_worker.openhands.config import CondenserConfig, OpenHandsConfig
from sandbox_worker.openhands.sdk import build_agent, build_llm, untracked_url
from services.protocol.tasks import AgentLimits, SamplingConfig

URL = "http://10.0.0.5:8100/t/task-1.a1/v1"
LIMITS = AgentLimits(max_steps=7, wall_time_s=60, max_context_tokens=4096)


def test_llm_carries_the_task_sampling_and_the_trajectory_url() -> None:
    sampling = SamplingConfig(temperature=0.6, top_p=0.95, top_k=40, max_tokens=512)
    llm = build_llm(URL + "/", sampling, LIMITS, OpenHandsConfig(num_retries=3))
    assert llm.base_url == URL
    assert llm.model == "openai/swerl-policy"
    assert (llm.temperature, llm.top_p, llm.top_k) == (0.6, 0.95, 40)
    assert llm.max_output_tokens == 512
    assert llm.max_input_tokens == 4096
    assert llm.num_retries == 3
    assert llm.capability_overrides["supports_sampling_params"] is True
    assert llm.capability_overrides["supports_reasoning_effort"] is False


def test_top_k_minus_one_means_unset() -> None:
    llm = build_llm(URL, SamplingConfig(top_k=-1), LIMITS, OpenHandsConfig())
    assert llm.top_k is None


def test_agent_has_terminal_and_file_editor_and_no_condenser_by_default() -> None:
    agent = build_agent(URL, SamplingConfig(), LIMITS, OpenHandsConfig())
    assert [t.name for t in agent.tools] == ["terminal", "file_editor"]
    assert agent.tools[0].params == {"terminal_type": "subprocess"}
    assert agent.condenser is None
    auto = build_agent(URL, SamplingConfig(), LIMITS, OpenHandsConfig(terminal="auto"))
    assert auto.tools[0].params == {}


@pytest.mark.parametrize(
    ("tracked", "summary_url"), [(True, URL), (False, "http://10.0.0.5:8100/v1")]
)
def test_condenser_summarises_through_the_chosen_url(tracked: bool, summary_url: str) -> None:
    cfg = OpenHandsConfig(
        condenser=CondenserConfig(enabled=True, max_size=40, keep_first=3, tracked=tracked)
    )
    agent = build_agent(URL, SamplingConfig(temperature=0.5), LIMITS, cfg)
    condenser = agent.condenser
    assert type(condenser).__name__ == "LLMSummarizingCondenser"
    assert (condenser.max_size, condenser.keep_first) == (40, 3)  # type: ignore[union-attr]
    assert condenser.llm.base_url == summary_url  # type: ignore[union-attr]
    assert condenser.llm.temperature == 0.5  # type: ignore[union-attr]


def test_untracked_url_needs_a_trajectory_url() -> None:
    assert untracked_url("http://a:1/t/x/v1") == "http://a:1/v1"
    with pytest.raises(ValueError, match="per-trajectory"):
        untracked_url("http://a:1/v1")


@pytest.mark.parametrize("bad", ["", "ftp://a/v1", "http://a:1/t/x", "http://a:1/v1/chat"])
def test_llm_url_must_be_an_openai_root(bad: str) -> None:
    with pytest.raises(ValueError, match="llm_base_url"):
        build_llm(bad, SamplingConfig(), LIMITS, OpenHandsConfig())
