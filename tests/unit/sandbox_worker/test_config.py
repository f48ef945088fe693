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
