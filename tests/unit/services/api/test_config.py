"""The ``api`` config section: tokens from the environment, checks on them."""

from __future__ import annotations

import pytest

from services.api.config import ApiConfig, Scope
from services.config import ConfigError, load_config, section_models


def test_section_is_registered() -> None:
    assert section_models()["api"] is ApiConfig


def test_tokens_from_the_environment() -> None:
    env = {"SWERL_API__TOKENS": "[{name: ci, token: s3cret-token, scopes: [read, submit]}]"}
    cfg = load_config(ApiConfig, section="api", environ=env)
    assert [(t.name, t.scopes) for t in cfg.tokens] == [("ci", [Scope.READ, Scope.SUBMIT])]


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        ("[{name: a, token: same-secret, scopes: [read]}, "
         "{name: a, token: other-secret, scopes: [read]}]", "unique"),
        ("[{name: a, token: short, scopes: [read]}]", "tokens.0.token"),
        ("[{name: a, token: long-enough, scopes: [write]}]", "tokens.0.scopes"),
    ],
)  # fmt: skip
def test_bad_tokens_are_config_errors(tokens: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(ApiConfig, section="api", environ={"SWERL_API__TOKENS": tokens})
