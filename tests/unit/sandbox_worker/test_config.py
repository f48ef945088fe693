"""The worker's ``worker.rollout`` config: strict, and refusing unsafe combinations."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandbox_worker.config import WorkerConfig


def cfg(**rollout: object) -> WorkerConfig:
    return WorkerConfig(backend="docker", rollout=rollout)


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("ftp://a:1", "http"),
        ("http://a:1/t/x/v1", "no path"),
        ("http://a:99999", "invalid port"),
        ("http://:80", "HOST:PORT"),
        ("http://a:1?x=1", "no path"),
    ],
)
def test_bad_adapter_urls_are_refused(url: str, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        cfg(adapter_url=url)


def test_rollout_config_is_strict() -> None:
    with pytest.raises(ValidationError, match="extra"):
        cfg(adapter_ur="http://a:1")
    with pytest.raises(ValidationError, match="memory_mb"):
        cfg(sandbox={"memory_mb": 1})
    with pytest.raises(ValidationError, match="disk_mb"):
        cfg(sandbox={"disk_mb": 8})
    with pytest.raises(ValidationError, match="inodes"):
        cfg(evaluation={"limits": {"inodes": 10}})
    with pytest.raises(ValidationError, match="cgroups"):
        cfg(backend={"cgroups": "maybe"})
    with pytest.raises(ValidationError, match="grading"):
        cfg(evaluation={"grading": "stdout"})
    with pytest.raises(ValidationError, match="protected_dir"):
        cfg(evaluation={"infra_rules": {"o/p": {"protected_dir": ["x"]}}})


def test_adapter_credential_and_sandboxed_condenser_rules() -> None:
    with pytest.raises(ValidationError, match="adapter_token"):
        cfg(adapter_token="short")
    # an untracked summary call would need the adapter's /v1, which no sandbox can reach
    with pytest.raises(ValidationError, match=r"condenser\.tracked"):
        cfg(openhands={"condenser": {"enabled": True, "tracked": False}})
    assert cfg(openhands={"condenser": {"enabled": True}}).rollout.openhands.condenser.tracked


def test_toy_tool_latency_is_off_by_default_and_validated() -> None:
    from services.config import load_config

    latency = cfg().rollout.toy_tool_latency
    assert not latency.enabled and latency.median_s == 0.0
    on = cfg(toy_tool_latency={"median_s": 3}).rollout.toy_tool_latency
    assert on.enabled and on.p99 == 30.0  # no p99: 10 x the median ("SWE-like")
    assert on.max_s == 60.0  # inside the toy configs' wall_time_s (120 s)
    with pytest.raises(ValidationError, match="p99_s"):
        cfg(toy_tool_latency={"median_s": 3, "p99_s": 2})
    with pytest.raises(ValidationError, match="median_s"):
        cfg(toy_tool_latency={"median_s": -1})
    with pytest.raises(ValidationError, match="extra"):
        cfg(toy_tool_latency={"mean_s": 3})
    # the environment form a training run's worker inherits
    env = {
        "SWERL_WORKER__ROLLOUT__TOY_TOOL_LATENCY__MEDIAN_S": "0.5",
        "SWERL_WORKER__ROLLOUT__TOY_TOOL_LATENCY__P99_S": "5",
    }
    loaded = load_config(WorkerConfig, section="worker", environ=env).rollout.toy_tool_latency
    assert (loaded.median_s, loaded.p99) == (0.5, 5.0)
