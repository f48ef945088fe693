"""The ``api`` config section: tokens from the environment, checks on them."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.api.config import ApiConfig, ApiToken, Scope, insecure_listen_problem
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


def test_path_roots_from_the_environment_are_resolved(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    env = {"SWERL_API__PATHS__INPUTS": f"[{tmp_path}/alias, {tmp_path}/data/]",
           "SWERL_API__PATHS__OUTPUTS": f"[{tmp_path}/out]"}  # fmt: skip
    cfg = load_config(ApiConfig, section="api", environ=env)
    assert cfg.paths.inputs == (str(tmp_path / "real"), str(tmp_path / "data"))
    assert cfg.paths.outputs == (str(tmp_path / "out"),)


@pytest.mark.parametrize(
    ("value", "problem"),
    [("[data/inputs]", "relative"), ("[/]", "whole filesystem"), ("['']", "non-empty")],
)
def test_bad_path_roots_stop_the_start(value: str, problem: str) -> None:
    """A relative root would depend on the API's working directory; ``/`` confines nothing."""
    with pytest.raises(ConfigError, match=problem) as err:
        load_config(ApiConfig, section="api", environ={"SWERL_API__PATHS__INPUTS": value})
    assert "api.paths.inputs" in str(err.value)


def test_default_roots_live_under_the_data_dir_and_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SWERL_CACHE_DIR", str(tmp_path / "cache"))
    cfg = ApiConfig()
    every = (*cfg.paths.inputs, *cfg.paths.outputs)
    assert all(r.startswith(("/var/lib/swerl/", str(tmp_path / "cache"))) for r in every)
    assert str(tmp_path / "cache") in cfg.paths.inputs and cfg.paths.outputs
    assert (cfg.max_body_bytes, cfg.quotas.max_jobs_in_flight) == (16 * 1024 * 1024, 100)


def test_quotas_per_token_override_the_section() -> None:
    env = {"SWERL_API__TOKENS": "[{name: ci, token: s3cret-token, scopes: [submit], "
           "max_jobs_in_flight: 2}]", "SWERL_API__QUOTAS__MAX_TASKS_PER_JOB": "50"}  # fmt: skip
    cfg = load_config(ApiConfig, section="api", environ=env)
    assert (cfg.tokens[0].max_jobs_in_flight, cfg.quotas.max_tasks_per_job) == (2, 50)
    with pytest.raises(ConfigError, match="max_body_bytes"):
        load_config(ApiConfig, section="api", environ={"SWERL_API__MAX_BODY_BYTES": "-1"})


@pytest.mark.parametrize(
    ("host", "tokens", "dev", "refused"),
    [
        ("0.0.0.0", False, False, True),
        ("::", False, False, True),
        ("10.0.0.10", False, False, True),
        ("api.example", False, False, True),
        ("0.0.0.0", True, False, False),
        ("0.0.0.0", False, True, False),
        ("127.0.0.1", False, False, False),
        ("127.0.0.2", False, False, False),
        ("::1", False, False, False),
        ("localhost", False, False, False),
    ],
)
def test_no_tokens_means_loopback_unless_dev(
    host: str, tokens: bool, dev: bool, refused: bool
) -> None:
    listed = [ApiToken(name="ci", token="s3cret-token", scopes=[Scope.READ])] if tokens else []
    cfg = ApiConfig(host=host, tokens=listed, insecure_dev=dev)
    problem = insecure_listen_problem(cfg)
    assert (problem is not None) == refused
    if problem:
        assert "--insecure-dev" in problem and "SWERL_API__TOKENS" in problem
