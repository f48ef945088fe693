"""Which script and grading an instance gets, and how an evaluation maps to the harness's
categories (resolved / unresolved / error), without sandboxes."""

from __future__ import annotations

import pytest

from sandbox_worker.evaluation import EvalReport
from services.datasets import load_instances
from services.eval.grade import eval_config, eval_script_for, hardened_config, verdict
from tests.support.paths import TEST_DATA

VERIFIED = load_instances(TEST_DATA / "swebench_verified" / "rows.jsonl")
MINI = load_instances(TEST_DATA / "instances.jsonl")


@pytest.mark.parametrize("row", VERIFIED, ids=lambda r: r.instance_id)
def test_published_verified_rows_get_the_harness_script(row: object) -> None:
    assert eval_script_for(row, "auto") == "harness"  # type: ignore[arg-type]


def test_the_mini_set_has_no_harness_spec_and_gets_swerls_script() -> None:
    assert {eval_script_for(inst, "auto") for inst in MINI} == {"swerl"}
    assert eval_script_for(MINI[0], "harness") == "harness"  # asked for: as asked
    assert eval_script_for(VERIFIED[0], "swerl") == "swerl"


def test_the_grading_is_the_harness_semantics() -> None:
    config = eval_config(VERIFIED[0], "auto", 900)
    assert (config.grading, config.eval_script, config.log_parser) == (
        "swebench",
        "harness",
        "auto",
    )
    assert config.restore_test_infra is False and config.keep_test_output is True
    assert config.patch_policy == "harness"  # the apply cascade, GNU patch included
    assert config.test_timeout_s == 900


def test_the_hardened_pass_grades_as_training_rewards_are_graded() -> None:
    """Strict patches, restored test infrastructure; structured grading where swerl's script
    runs (the mini set), the harness's parser where only the harness's script can grade."""
    by_repo = {"swerl/strkit": 30}
    for row, script, grading in ((MINI[0], "swerl", "structured"),
                                 (VERIFIED[0], "harness", "swebench")):  # fmt: skip
        config = hardened_config(row, "auto", 900, by_repo)
        assert (config.patch_policy, config.restore_test_infra) == ("strict", True)
        chosen = config.for_row(row)
        assert (chosen.eval_script, chosen.grading) == (script, grading)
        assert chosen.canary_test is True
    strkit = next(r for r in MINI if r.repo == "swerl/strkit")
    assert hardened_config(strkit, "auto", 900, by_repo).test_timeout_s == 30
    assert hardened_config(VERIFIED[0], "auto", 900, by_repo).test_timeout_s == 900
    assert hardened_config(MINI[0], "swerl", 900).for_row(MINI[0]).grading == "structured"


def _report(**fields: object) -> EvalReport:
    return EvalReport(instance_id="a__b-1", grading="swebench", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "status", "infra"),
    [
        ({"infra_error": "sandbox creation failed: no image"}, "error", True),
        ({"patch_rejected": "writes into .git"}, "error", False),
        ({"applied": False}, "error", False),
        ({"applied": True, "tests_run": True, "tests_timed_out": True}, "error", False),
        ({"applied": True, "tests_run": True, "log_valid": True, "resolved": True},
         "resolved", False),
        ({"applied": True, "tests_run": True, "log_valid": False}, "unresolved", False),
        ({"applied": True, "tests_run": True, "log_valid": True, "f2p_failure": ["t::x"]},
         "unresolved", False),
    ],
)  # fmt: skip
def test_verdicts(fields: dict[str, object], status: str, infra: bool) -> None:
    got_status, detail, got_infra = verdict(_report(**fields))
    assert (got_status, got_infra) == (status, infra)
    assert (detail == "") == (status == "resolved")
    if fields.get("f2p_failure"):
        assert "t::x" in detail


def test_a_repository_timeout_overrides_the_global_one() -> None:
    """``--repo-timeout owner/name=S``: the worker's evaluation.test_timeout_by_repo shape."""
    by_repo = {"django/django": 3000, "sympy/sympy": 60}
    timeouts = {row.repo: eval_config(row, "auto", 900, by_repo).test_timeout_s for row in VERIFIED}
    assert timeouts["django/django"] == 3000 and timeouts["sympy/sympy"] == 60
    assert timeouts["astropy/astropy"] == 900  # no entry: the global --timeout
    assert eval_config(VERIFIED[0], "auto", 900).test_timeout_s == 900


def test_a_configuration_error_names_swerl_evals_flags() -> None:
    """The evaluation names the worker's config keys; ``swerl eval`` says which flag sets them."""
    report = _report(infra_error="x: set evaluation.eval_script to auto", config_error=True)
    status, detail, infra = verdict(report)
    assert (status, infra) == ("error", True)
    assert detail.startswith("configuration error:") and "--eval-script" in detail
    _, plain, _ = verdict(_report(infra_error="sandbox failed: boom"))
    assert "--eval-script" not in plain
