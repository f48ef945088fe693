"""``python -m services.api``: the common flags behave as in every service."""

from __future__ import annotations

import pytest
import yaml

from services.api.__main__ import main


def test_print_config_shows_flags_and_masks_tokens(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWERL_API__TOKENS", "[{name: ci, token: very-secret, scopes: [read]}]")
    argv = ["--redis", "redis://10.0.0.1:6379/0", "--port", "9000", "--runner-threads", "0"]
    assert main([*argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out)
    assert (cfg["redis_url"], cfg["port"], cfg["runner"]["concurrency"]) == (
        "redis://10.0.0.1:6379/0",
        9000,
        0,
    )
    assert "very-secret" not in out and cfg["tokens"][0]["name"] == "ci"


@pytest.mark.parametrize(
    ("argv", "problem"),
    [(["--port", "70000"], "api.port"), (["--redis", "http://x"], "api.redis_url")],
)
def test_bad_values_exit_2_naming_the_key(
    argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    assert problem in capsys.readouterr().err


def test_help_teaches(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for word in ("SWERL_API__TOKENS", "--runner-only", "exit status", "docs/api.md"):
        assert word in out


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_no_tokens_on_a_non_loopback_host_exits_2_saying_what_to_do(
    host: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before anything listens: ``main`` returns instead of starting uvicorn."""
    monkeypatch.delenv("SWERL_API__TOKENS", raising=False)
    monkeypatch.delenv("SWERL_API__INSECURE_DEV", raising=False)
    assert main(["--host", host, "--port", "1", "--runner-threads", "0"]) == 2
    err = capsys.readouterr().err
    assert f"refusing to listen on {host}" in err
    assert "SWERL_API__TOKENS" in err and "--insecure-dev" in err


def test_insecure_dev_flag_reaches_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--host", "0.0.0.0", "--insecure-dev", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["insecure_dev"] is True
