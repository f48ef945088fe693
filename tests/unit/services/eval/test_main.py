"""The evaluation script's sandbox backend settings from its options (``--state-root``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.eval.main import backend_settings, main
from services.swerl_cli.eval_options import build_eval_parser


def parse(*extra: str):
    return build_eval_parser("python -m services.eval").parse_args(
        ["--dataset", "d.jsonl", "--predictions", "p.jsonl", *extra]
    )


def test_the_state_root_goes_to_the_backend_only_when_given() -> None:
    assert backend_settings(parse()) == {}
    assert backend_settings(parse("--state-root", "/srv/sb")) == {"state_root": Path("/srv/sb")}


def test_a_relative_state_root_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--dataset", "d.jsonl", "--predictions", "p.jsonl", "--state-root", "sb"])
    assert info.value.code == 2
    assert "--state-root: must be an absolute path" in capsys.readouterr().err
