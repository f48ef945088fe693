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
