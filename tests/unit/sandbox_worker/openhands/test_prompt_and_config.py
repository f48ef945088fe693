"""The SWE task prompt and the runner's configuration (pure, no SDK)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandbox_worker.openhands.config import CondenserConfig, OpenHandsConfig
from sandbox_worker.openhands.prompt import build_swe_prompt

ISSUE = "parse('a=1') returns None instead of {'a': '1'}"


def test_prompt_quotes_the_issue_and_names_the_repository() -> None:
    prompt = build_swe_prompt(f"  {ISSUE}\n\n", repo_dir="/testbed")
    assert f"<issue_description>\n{ISSUE}\n</issue_description>" in prompt
    assert "<uploaded_files>\n/testbed\n</uploaded_files>" in prompt
    assert "non-test files in /testbed" in prompt
    assert "finish" in prompt
    other = build_swe_prompt(ISSUE, repo_dir="/work/repo")
    assert "/work/repo" in other and "/testbed" not in other


@pytest.mark.parametrize("statement", ["", "   \n", None])
def test_prompt_needs_a_problem_statement(statement: object) -> None:
    with pytest.raises(ValueError, match="problem_statement"):
        build_swe_prompt(statement)  # type: ignore[arg-type]


@pytest.mark.parametrize("repo_dir", ["testbed", "/a/../etc", "/a//b", "/a b", ""])
def test_prompt_rejects_odd_repo_dirs(repo_dir: str) -> None:
    with pytest.raises(ValueError, match="repo_dir"):
        build_swe_prompt(ISSUE, repo_dir=repo_dir)


def test_config_defaults_are_the_documented_ones() -> None:
    cfg = OpenHandsConfig()
    assert cfg.model.startswith("openai/")
    assert cfg.terminal == "subprocess"
    assert cfg.condenser.enabled is False  # condensation is off by default (issue 4)


@pytest.mark.parametrize(
    "bad",
    [
        {"model": "swerl-policy"},  # LiteLLM needs the openai/ provider prefix
        {"model": "anthropic/claude"},
        {"api_key": ""},
        {"terminal": "powershell"},
        {"retry_min_wait_s": 10, "retry_max_wait_s": 2},
        {"stop_grace_s": 0},
        {"llm_timeout_s": -1},
        {"unknown_field": 1},
    ],
)
def test_bad_config_is_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        OpenHandsConfig(**bad)


def test_condenser_needs_room_to_condense() -> None:
    CondenserConfig(enabled=True, max_size=20, keep_first=8)
    with pytest.raises(ValidationError, match="keep_first"):
        CondenserConfig(enabled=True, max_size=20, keep_first=9)
    with pytest.raises(ValidationError):
        CondenserConfig(max_tokens=10)
