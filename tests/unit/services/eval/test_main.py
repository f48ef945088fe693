"""The evaluation script's sandbox backend settings from its options (``--state-root``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.eval.main import backend_settings, main, plan_run, write_report
from services.swerl_cli.eval_options import build_eval_parser
from tests.support.paths import REPO_ROOT


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


MINI = REPO_ROOT / "tests" / "data" / "instances.jsonl"


def test_the_deny_list_leaves_instances_out_of_the_run_and_names_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deny = tmp_path / "deny.txt"
    deny.write_text("swerl__strkit-2  # flaky on gold\nswerl__tinyini-9\n")
    args = build_eval_parser("python -m services.eval").parse_args([
        "--dataset", str(MINI), "--predictions", "gold", "--report-dir", str(tmp_path / "out"),
        "--instances", "swerl__strkit-1,swerl__strkit-2,swerl__strkit-3", "--deny", str(deny),
    ])  # fmt: skip
    plan = plan_run(args)
    assert [i.instance_id for i in plan.instances] == ["swerl__strkit-1", "swerl__strkit-3"]
    assert plan.todo == ["swerl__strkit-1", "swerl__strkit-3"]
    assert plan.denied == {"swerl__strkit-2": "flaky on gold"}  # ids not selected: not named
    assert "swerl__strkit-2: skipped, on the deny-list (flaky on gold)" in capsys.readouterr().err
    _, report = write_report(plan)
    assert report["total_instances"] == 2 and report["denied_ids"] == ["swerl__strkit-2"]
    # without --deny the harness's report keys stay exactly as they are
    plain = build_eval_parser("python -m services.eval").parse_args([
        "--dataset", str(MINI), "--predictions", "gold", "--report-dir", str(tmp_path / "o2"),
        "--instances", "swerl__strkit-1",
    ])  # fmt: skip
    assert "denied_ids" not in write_report(plan_run(plain))[1]


def test_a_deny_list_that_empties_the_run_or_is_bad_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deny = tmp_path / "deny.txt"
    deny.write_text("swerl__strkit-1\n")
    base = ["--dataset", str(MINI), "--predictions", "gold", "--report-dir", str(tmp_path / "o")]
    assert main([*base, "--instances", "swerl__strkit-1", "--deny", str(deny)]) == 2
    assert "every selected instance is on the deny-list" in capsys.readouterr().err
    deny.write_text("not an id!\n")
    assert main([*base, "--deny", str(deny)]) == 2
    assert "line 1: not an instance id" in capsys.readouterr().err


def test_repository_timeouts_are_parsed_and_bad_ones_are_usage_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse("--repo-timeout", "sympy/sympy=3600", "--repo-timeout", "django/django=60")
    assert dict(args.repo_timeout) == {"sympy/sympy": 3600, "django/django": 60}
    assert parse().repo_timeout == []
    for bad in ("sympy=3600", "sympy/sympy=0", "sympy/sympy=soon"):
        with pytest.raises(SystemExit) as info:
            main(["--dataset", "d.jsonl", "--predictions", "p.jsonl", "--repo-timeout", bad])
        assert info.value.code == 2
        assert "--repo-timeout" in capsys.readouterr().err
