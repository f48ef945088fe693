"""validate's own logic on the LocalDir double: bad checks, a wrong instance, CLI exit status.

The mini set itself is validated exhaustively once per run, through the real backends:
tests/integration/sandbox_worker/evaluation/test_validate_backends.py (every instance, all four
checks, through bwrap; two through docker).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_worker import validate
from sandbox_worker.evaluation import EvalConfig, EvalReport
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from services.protocol.instance import SWEInstance
from tests.unit.sandbox_worker.evaluation.conftest import INSTANCES, image_of


def test_unknown_checks_are_rejected(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances["swerl__strkit-1"]
    for checks in ((), ("gold", "golden")):
        with pytest.raises(ValueError, match="subset"):
            validate.validate_instance(
                local_backend, inst, image_of(inst), config=local_config, checks=checks
            )


def test_an_instance_no_image_can_be_named_for_is_its_own_failure(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    """An id the image naming refuses (SWE-bench ids may hold a ``+``) fails that instance,
    named, and validation goes on: it does not end the run with a traceback."""
    import io

    from sandbox_worker.images import instance_image

    inst = mini_instances["swerl__strkit-1"]
    odd = inst.model_copy(update={"instance_id": "swerl__strkit+1"})
    progress = io.StringIO()
    results = validate.validate_all(
        local_backend, [odd], instance_image, config=local_config, progress=progress
    )
    assert [r.instance_id for r in results] == ["swerl__strkit+1"] and not results[0].ok
    assert "no image name: invalid instance id 'swerl__strkit+1'" in (results[0].load_error or "")
    assert "[1/1] swerl__strkit+1: no image name" in progress.getvalue()
    assert "invalid instance id" in validate.format_table(results)


@pytest.mark.slow  # runs the test suite twice
def test_a_wrong_instance_fails_validation_with_reasons(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    good = mini_instances["swerl__tinyini-2"]
    # A PASS_TO_PASS test declared FAIL_TO_PASS: it passes at base, which "empty" must catch.
    wrong = good.model_copy(update={"FAIL_TO_PASS": [*good.FAIL_TO_PASS, good.PASS_TO_PASS[0]]})
    result = validate.validate_instance(
        local_backend, wrong, image_of(wrong), config=local_config, checks=("gold", "empty")
    )
    checks = {check.name: check for check in result.checks}
    assert not result.ok
    assert checks["gold"].ok and not checks["empty"].ok
    assert "FAIL_TO_PASS passing at base" in checks["empty"].detail
    table = validate.format_table([result])
    assert "0/1 instances valid" in table and "swerl__tinyini-2 empty: FAIL_TO_PASS" in table


@pytest.mark.slow  # runs the test suite
def test_cli_exit_status(
    monkeypatch: pytest.MonkeyPatch,
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import sandbox_worker.backends
    import sandbox_worker.images

    monkeypatch.setattr(sandbox_worker.backends, "make_backend", lambda name: local_backend)
    monkeypatch.setattr(sandbox_worker.images, "instance_image", lambda iid: iid[7:-2])
    monkeypatch.setattr(validate, "validation_config", lambda timeout_s, by_repo: local_config)
    # (The passing run of the CLI is exercised with the real bwrap backend in
    # tests/integration/sandbox_worker/evaluation.) An instance whose gold patch does not fix
    # the bug:
    broken = tmp_path / "broken.jsonl"
    line = next(line for line in INSTANCES.read_text().splitlines() if "swerl__strkit-2" in line)
    inst = SWEInstance.model_validate_json(line)
    no_fix = inst.model_copy(update={"patch": inst.patch.replace("(?=[A-Z][a-z])", "(?=[A-Z])")})
    broken.write_text(no_fix.model_dump_json() + "\n")
    assert validate.main(["--backend", "bwrap", "--instances", str(broken)]) == 1
    out = capsys.readouterr()
    assert "0/1 instances valid" in out.out and "[1/1] swerl__strkit-2: gold FAIL" in out.err
    assert "swerl__strkit-2 gold: not resolved: FAIL_TO_PASS failing" in out.out
    # Bad arguments / files: exit status 2 with the reason.
    assert validate.main(["--instances", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such dataset file" in capsys.readouterr().err
    assert validate.main(["--only", "nope", "--instances", str(broken)]) == 2
    with pytest.raises(SystemExit) as exit_info:
        validate.main(["--backend", "podman"])
    assert exit_info.value.code == 2
    for bad in ("0", "ten"):
        with pytest.raises(SystemExit) as exit_info:
            validate.main(["--test-timeout", bad, "--instances", str(broken)])
        assert exit_info.value.code == 2
        assert "--test-timeout" in capsys.readouterr().err
    for bad in ("sympy/sympy", "sympy=60", "sympy/sympy=0"):
        with pytest.raises(SystemExit) as exit_info:
            validate.main(["--repo-timeout", bad, "--instances", str(broken)])
        assert exit_info.value.code == 2
        assert "--repo-timeout" in capsys.readouterr().err


def test_validation_grades_like_the_worker_with_per_repository_timeouts() -> None:
    args = validate._parser().parse_args(
        ["--test-timeout", "60", "--repo-timeout", "swerl/strkit=600", "--repo-timeout", "a/b=7"]
    )
    config = validate.validation_config(args.test_timeout, dict(args.repo_timeout))
    strkit = SWEInstance.model_validate_json(
        next(line for line in INSTANCES.read_text().splitlines() if "swerl__strkit-2" in line)
    )
    spanlib = SWEInstance.model_validate_json(INSTANCES.read_text().splitlines()[0])
    assert config.for_row(strkit).test_timeout_s == 600
    assert config.for_row(spanlib).test_timeout_s == 60
    assert (config.eval_script, config.grading, config.log_parser) == ("auto", "auto", "auto")
    assert config.for_row(spanlib).grading == "structured"  # swerl's rows: structured report


@pytest.mark.slow  # runs the test suite three times
def test_pass_to_pass_failing_on_gold_is_reported_and_excluded(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
    tmp_path: Path,
) -> None:
    """A PASS_TO_PASS test that never passes (here: absent from the suite, which counts as
    failing) no longer sinks the instance: gold holds, the test is reported and left out of
    the later checks and of the written dataset."""
    good = mini_instances["swerl__tinyini-2"]
    ghost = good.PASS_TO_PASS[0].rsplit("::", 1)[0] + "::test_not_in_the_suite"
    with_ghost = good.model_copy(update={"PASS_TO_PASS": [*good.PASS_TO_PASS, ghost]})
    result = validate.validate_instance(
        local_backend,
        with_ghost,
        image_of(good),
        config=local_config,
        checks=("gold", "empty", "tampered"),
    )
    assert result.ok, validate.format_table([result])
    assert result.excluded_p2p == (ghost,)
    assert result.instance is not None and result.instance.PASS_TO_PASS == good.PASS_TO_PASS
    table = validate.format_table([result])
    assert f"swerl__tinyini-2 PASS_TO_PASS failing on gold, excluded: {ghost}" in table
    out = tmp_path / "valid.jsonl"
    assert validate.write_valid([result], out) == 1
    (row,) = [SWEInstance.model_validate_json(line) for line in out.read_text().splitlines()]
    assert row.PASS_TO_PASS == good.PASS_TO_PASS and row.FAIL_TO_PASS == good.FAIL_TO_PASS


def test_only_a_gold_run_that_otherwise_holds_excludes_tests() -> None:
    ok = EvalReport(
        instance_id="a-1", applied=True, log_valid=True, p2p_failure=["t.py::x"], tests_run=True
    )
    assert validate.p2p_failing_on_gold(ok) == ("t.py::x",)
    for broken in (
        {"f2p_failure": ["t.py::y"]},  # the gold patch does not fix the bug
        {"applied": False},
        {"log_valid": False},
        {"tests_timed_out": True},
        {"infra_error": "sandbox died"},
        {"structured_problem": "canary missing"},
    ):
        assert validate.p2p_failing_on_gold(ok.model_copy(update=broken)) == (), broken
