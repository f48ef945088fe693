"""The evaluation script's planning and report without sandboxes: its options (``--state-root``,
``--no-hardened``), the deny-list, ``--resume`` with hardened verdicts, the progress line and
the run report's extra keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_worker.evaluation.run_report import LOG_REPORT, instance_log_dir, make_run_report
from services.eval.grade import Outcome
from services.eval.hardened import Verdict, write_verdict
from services.eval.main import (
    backend_settings,
    build_parser,
    main,
    plan_run,
    progress_line,
    write_report,
)
from tests.support.paths import REPO_ROOT


def parse(*extra: str):
    return build_parser().parse_args(["--dataset", "d.jsonl", "--predictions", "p.jsonl", *extra])


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
    args = build_parser().parse_args([
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
    plain = build_parser().parse_args([
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


def test_the_hardened_pass_is_on_unless_no_hardened_and_the_help_gives_its_cost(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert parse().hardened is True and parse("--no-hardened").hardened is False
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-hardened" in text and "doubles evaluation time" in text


def _plan_args(out: Path, *extra: str):
    return build_parser().parse_args([
        "--dataset", str(MINI), "--predictions", "gold", "--report-dir", str(out),
        "--instances", "swerl__strkit-1,swerl__strkit-3", *extra,
    ])  # fmt: skip


def _graded(out: Path, iid: str, verdict: Verdict | None) -> Path:
    """Leave the files of a graded gold instance of run ``gold``: report.json, hardened.json."""
    plan = plan_run(_plan_args(out, "--resume"))
    log_dir = instance_log_dir(out, "gold", plan.predictions[iid])
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / LOG_REPORT).write_text(json.dumps({iid: {"resolved": True}}))
    if verdict is not None:
        write_verdict(log_dir, verdict)
    return log_dir


def test_resume_grades_again_what_has_no_hardened_verdict(tmp_path: Path) -> None:
    """An instance graded with --no-hardened (or whose hardened pass failed) has no hardened
    verdict: a hardened --resume grades it again; a --no-hardened --resume does not."""
    out = tmp_path / "out"
    _graded(out, "swerl__strkit-1", Verdict("swerl__strkit-1", True, "resolved"))
    _graded(out, "swerl__strkit-3", Verdict("swerl__strkit-3", True, "not_run"))
    assert plan_run(_plan_args(out, "--resume")).todo == ["swerl__strkit-3"]
    assert plan_run(_plan_args(out, "--resume", "--no-hardened")).todo == []
    flaky = Verdict("swerl__strkit-3", True, "error", "infrastructure failure: x", True)
    _graded(out, "swerl__strkit-3", flaky)
    assert plan_run(_plan_args(out, "--resume")).todo == ["swerl__strkit-3"]


def test_the_run_report_adds_keys_and_keeps_the_harness_ones(tmp_path: Path) -> None:
    out = tmp_path / "out"
    forged = Verdict("swerl__strkit-3", True, "unresolved", "failing: t", False,
                     ("test_infra_touched",), {"conftest.py": "hook"})  # fmt: skip
    _graded(out, "swerl__strkit-3", forged)
    plan = plan_run(_plan_args(out, "--resume"))
    path, report = write_report(plan)
    harness = make_run_report(plan.predictions, [i.instance_id for i in plan.instances], out,
                              "gold")  # fmt: skip
    assert {k: report[k] for k in harness} == harness  # the harness's keys, unchanged
    assert json.loads(path.read_text()) == report
    assert report["resolved_ids"] == ["swerl__strkit-3"]  # official: resolved
    assert report["hardened_resolved_ids"] == [] and report["hardened_evaluation"] is True
    assert report["hardened_missing_ids"] == ["swerl__strkit-1"]  # not graded yet
    assert report["tamper_ids"]["resolved_only_official"] == ["swerl__strkit-3"]
    assert report["verdicts"]["swerl__strkit-3"]["infra_touched"] == {"conftest.py": "hook"}
    assert report["tampered_ids"] == ["swerl__strkit-3"]


def test_the_progress_line_names_both_verdicts_and_the_flags() -> None:
    forged = Verdict("x-1", True, "unresolved", "failing: t::a", False, ("test_infra_touched",))
    line = progress_line(Outcome("x-1", "resolved", "", False, 2.0, forged))
    assert line == (
        "x-1: resolved; hardened: unresolved: failing: t::a; tamper: resolved_only_official, "
        "test_infra_touched (2.0 s)"
    )
    off = Verdict("x-1", False, "not_run", "--no-hardened")
    plain = progress_line(Outcome("x-1", "error", "the tests timed out", False, 1.0, off))
    assert plain == "x-1: error: the tests timed out (1.0 s)"
