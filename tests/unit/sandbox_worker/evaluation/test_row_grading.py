"""How each row is graded by default, and choices that cannot grade a row right
(sandbox_worker/evaluation/row_grading.py).

The rows are SWE-bench Verified rows as published (tests/data/swebench_verified/) and the mini
set; the parsers expected are the harness's own choice per repository (swebench's
``MAP_REPO_TO_PARSER_PY``: Django's runner for django, sympy's ``bin/test`` for sympy).
"""

from __future__ import annotations

from typing import Any

import pytest

from sandbox_worker.backends.base import SandboxSpec
from sandbox_worker.config import WorkerConfig
from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from sandbox_worker.evaluation.row_grading import GradingConfigError
from sandbox_worker.factory import runner_settings
from services.datasets import load_instances
from services.protocol.instance import SWEInstance
from tests.support.paths import TEST_DATA

VERIFIED_ROWS = TEST_DATA / "swebench_verified" / "rows.jsonl"
VERIFIED = {i.instance_id: i for i in load_instances(VERIFIED_ROWS)}
MINI = {i.instance_id: i for i in load_instances(TEST_DATA / "instances.jsonl")}
DJANGO = VERIFIED["django__django-11099"]
SYMPY = VERIFIED["sympy__sympy-20590"]
PYTEST_REPO = VERIFIED["pytest-dev__pytest-7521"]
SPANLIB = MINI["swerl__spanlib-1"]


def worker_eval(**evaluation: Any) -> EvalConfig:
    """The EvalConfig a worker with these ``evaluation`` settings grades with."""
    config = WorkerConfig(backend="docker", rollout={"evaluation": evaluation})
    return runner_settings(config.rollout).evaluation


def with_fields(instance: SWEInstance, **fields: Any) -> SWEInstance:
    return SWEInstance.model_validate({**instance.model_dump(), **fields})


def choices(config: EvalConfig) -> tuple[str, str, str]:
    return (config.eval_script, config.grading, config.log_parser)


@pytest.mark.parametrize(
    ("instance", "parser"),
    [(DJANGO, "parse_log_django"), (SYMPY, "parse_log_sympy"), (PYTEST_REPO, "parse_log_pytest")],
    ids=lambda v: getattr(v, "repo", v),
)
def test_by_default_a_harness_repository_gets_the_harness_script_and_parser(
    instance: SWEInstance, parser: str
) -> None:
    assert choices(worker_eval().for_row(instance)) == ("harness", "swebench", parser)


def test_by_default_swerls_rows_keep_structured_grading() -> None:
    """The mini set and users' pytest repositories: swerl's script, the structured report."""
    for instance in MINI.values():
        assert choices(worker_eval().for_row(instance)) == (
            "swerl", "structured", "parse_log_pytest"
        )  # fmt: skip
    # a row with its own test_cmd is the user's to run, even in a repository the harness knows
    own = with_fields(DJANGO, test_cmd="python -m pytest -rA")
    assert worker_eval().for_row(own).eval_script == "swerl"
    # a row carrying the harness's eval_script is graded by it
    scripted = with_fields(SPANLIB, eval_script="#!/bin/bash\npytest -rA\n")
    assert choices(worker_eval().for_row(scripted))[:2] == ("harness", "swebench")


def test_swerls_pytest_script_on_a_django_row_is_a_configuration_error() -> None:
    config = worker_eval(eval_script="swerl", log_parser="pytest", grading="structured")
    with pytest.raises(GradingConfigError) as caught:
        config.for_row(DJANGO)
    message = str(caught.value)
    assert "django__django-11099" in message and "not pytest" in message
    assert "evaluation.eval_script" in message and "evaluation.log_parser" in message
    with pytest.raises(GradingConfigError, match="sympy"):
        config.for_row(SYMPY)
    # the same explicit choice still grades pytest repositories and the mini set
    assert config.for_row(PYTEST_REPO).eval_script == "swerl"
    assert config.for_row(SPANLIB).log_parser == "pytest"


def test_choices_that_disagree_with_the_row_name_the_key() -> None:
    # structured grading cannot read the harness's script
    with pytest.raises(GradingConfigError, match=r"evaluation\.grading"):
        worker_eval(grading="structured").for_row(DJANGO)
    # a parser of another runner than the script's
    with pytest.raises(GradingConfigError, match=r"evaluation\.log_parser 'parse_log_pytest'"):
        worker_eval(eval_script="harness", log_parser="parse_log_pytest").for_row(DJANGO)
    with pytest.raises(GradingConfigError, match=r"evaluation\.log_parser 'parse_log_django'"):
        worker_eval(eval_script="swerl", log_parser="parse_log_django").for_row(SPANLIB)


def test_rows_no_choice_can_grade_are_configuration_errors() -> None:
    unknown_version = with_fields(DJANGO, version="0.1")
    with pytest.raises(GradingConfigError, match=r"django/django version '0\.1'.*eval_script"):
        worker_eval().for_row(unknown_version)
    unknown_parser = with_fields(SPANLIB, eval_script="pytest -rA", log_parser="parse_log_cargo")
    with pytest.raises(GradingConfigError, match=r"parse_log_cargo.*evaluation\.log_parser"):
        worker_eval().for_row(unknown_parser)
    smith = SWEInstance(
        instance_id="tornadoweb__tornado.d1b0280f.func_pm__x",
        repo="swesmith/tornadoweb__tornado.d1b0280f",
        patch="diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n",
        problem_statement="p",
        FAIL_TO_PASS=["t.py::t"],
        PASS_TO_PASS=[],
    )
    with pytest.raises(GradingConfigError, match=r"evaluation\.eval_script: swerl with a test_cmd"):
        worker_eval().for_row(smith)
    # ... which is how such a row is graded
    assert worker_eval().for_row(with_fields(smith, test_cmd="pytest -rA")).eval_script == "swerl"


def test_the_repository_timeout_comes_with_the_row() -> None:
    config = worker_eval(test_timeout_s=60, test_timeout_by_repo={"django/django": 900})
    assert config.for_row(DJANGO).test_timeout_s == 900
    assert config.for_row(SPANLIB).test_timeout_s == 60


class _NoSandboxes:
    """A backend that must not be asked for a sandbox."""

    def create(self, spec: SandboxSpec) -> Any:
        raise AssertionError(f"a sandbox was created for {spec.sandbox_id}")


def test_evaluate_patch_fails_a_misconfiguration_before_any_sandbox() -> None:
    config = EvalConfig(eval_script="swerl", log_parser="pytest", grading="structured")
    report = evaluate_patch(_NoSandboxes(), DJANGO, DJANGO.patch, "img", config=config)  # type: ignore[arg-type]
    assert report.config_error is True and report.reward is None
    assert report.infra_error is not None and "evaluation.eval_script" in report.infra_error
    assert not report.tests_run


def test_swerls_pytest_script_on_a_swesmith_unittest_repository_is_a_configuration_error() -> None:
    """SWE-smith's tornado and python-slugify run unittest, and their F2P ids are unittest
    descriptions: pytest's ids would never match them (every patch 0). By default the profile
    grades them; an explicit swerl script without a test_cmd is refused naming the keys."""
    smith = {"patch": DJANGO.patch, "problem_statement": "p", "PASS_TO_PASS": []}
    slugify = SWEInstance(
        instance_id="un33k__python-slugify.872b3750.func_pm_op_change__x1",
        repo="swesmith/un33k__python-slugify.872b3750",
        FAIL_TO_PASS=["test_lower (__main__.T.test_lower)"],
        **smith,
    )
    tornado = SWEInstance(
        instance_id="tornadoweb__tornado.d5ac65c1.func_pm_op_change__x1",
        repo="swesmith/tornadoweb__tornado.d5ac65c1",
        FAIL_TO_PASS=["test_a (tornado.test.util_test.UtilTest)"],
        **smith,
    )
    for row, parser in (
        (slugify, "swesmith_unittest_verbose"),
        (tornado, "swesmith_unittest_headers"),
    ):
        assert choices(worker_eval().for_row(row)) == ("harness", "swebench", parser)
        with pytest.raises(
            GradingConfigError, match=r"run under unittest.*evaluation\.eval_script"
        ):
            worker_eval(eval_script="swerl", grading="structured").for_row(row)
        own = with_fields(row, test_cmd="python -m pytest -rA")  # the user's command: theirs
        assert worker_eval(eval_script="swerl").for_row(own).eval_script == "swerl"
