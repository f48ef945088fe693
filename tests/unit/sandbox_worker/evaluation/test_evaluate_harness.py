"""evaluate_patch with the official harness's eval script (eval_script="harness") and the
harness's parser choice (log_parser="auto"), on the LocalDir test double.

The mini repositories have no harness spec, so the rows carry their own ``eval_script`` (the
swebench 5.0.2 row shape) written the way the harness writes one.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sandbox_worker.evaluation import EvalConfig, EvalReport, evaluate_patch
from sandbox_worker.evaluation.patches import directives_of_test_patch, modified_files
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from services.protocol.instance import SWEInstance
from tests.unit.sandbox_worker.evaluation.conftest import LOCAL_TEST_CMD, image_of

INSTANCE = "swerl__strkit-1"


def _with_eval_script(inst: SWEInstance, workdir: str, *, run: str | None = None) -> SWEInstance:
    reset = f"git checkout {inst.base_ref} {' '.join(modified_files(inst.test_patch))}"
    tests = run or " ".join([LOCAL_TEST_CMD, *directives_of_test_patch(inst.test_patch)])
    script = "\n".join(
        [
            "#!/bin/bash",
            "set -uxo pipefail",
            f"cd {workdir}",
            reset,
            f"git apply -v - <<'EOF_114329324912'\n{inst.test_patch}\nEOF_114329324912",
            ": '>>>>> Start Test Output'",
            tests,
            ": '>>>>> End Test Output'",
            reset,
        ]
    )
    row = {**inst.model_dump(), "eval_script": script, "log_parser": "parse_log_pytest"}
    return SWEInstance.model_validate(row)


def _grade(
    backend: LocalDirBackend, config: EvalConfig, inst: SWEInstance, patch: str
) -> EvalReport:
    harness = config.model_copy(
        update={"eval_script": "harness", "grading": "swebench", "log_parser": "auto"}
    )
    return evaluate_patch(backend, inst, patch, image_of(inst), config=harness)


@pytest.mark.slow
def test_harness_script_grades_gold_and_a_non_fix(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = _with_eval_script(mini_instances[INSTANCE], local_config.workdir)
    gold = _grade(local_backend, local_config, inst, inst.patch)
    assert gold.infra_error is None, gold.log_tail
    assert gold.resolved and gold.test_exit_code == 0
    assert "harness eval script" in gold.log_tail
    assert sorted(gold.f2p_success) == sorted(inst.FAIL_TO_PASS)
    # A patch that changes nothing the tests look at: applied, the F2P tests still fail.
    noop = (
        "diff --git a/NOTES b/NOTES\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES\n"
        "@@ -0,0 +1 @@\n+x\n"
    )
    report = _grade(local_backend, local_config, inst, noop)
    assert report.infra_error is None and report.applied, report.log_tail
    assert not report.resolved and sorted(report.f2p_failure) == sorted(inst.FAIL_TO_PASS)


@pytest.mark.slow
def test_harness_script_past_the_test_timeout_is_graded_not_aborted(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = _with_eval_script(mini_instances[INSTANCE], local_config.workdir, run="sleep 30")
    config = local_config.model_copy(update={"test_timeout_s": 1})
    report = _grade(local_backend, config, inst, inst.patch)
    assert report.infra_error is None, report.log_tail
    assert report.tests_timed_out and not report.resolved
    # the same through the repository's own timeout, under a default that would wait it out
    by_repo = {"test_timeout_s": 600, "test_timeout_by_repo": {inst.repo: 1}}
    report = _grade(local_backend, local_config.model_copy(update=by_repo), inst, inst.patch)
    assert report.infra_error is None, report.log_tail
    assert report.tests_timed_out and not report.resolved


def test_row_without_script_or_spec_is_an_infrastructure_error(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances[INSTANCE]
    report = _grade(local_backend, local_config, inst, inst.patch)
    assert report.infra_error is not None
    assert f"no SWE-bench or SWE-Gym test spec for repository {inst.repo!r}" in report.infra_error
    # deterministic: not retried, and the message names the key to change
    assert report.config_error and "evaluation.eval_script" in report.infra_error


def test_config_rejects_inconsistent_choices() -> None:
    with pytest.raises(ValidationError, match='needs grading="swebench"'):
        EvalConfig(eval_script="harness")
    with pytest.raises(ValidationError, match="unknown log_parser 'parse_log_nothing'"):
        EvalConfig(log_parser="parse_log_nothing")
    assert EvalConfig(log_parser="parse_log_django").log_parser == "parse_log_django"


def test_unknown_row_parser_aborts_before_the_tests_run(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = _with_eval_script(mini_instances[INSTANCE], local_config.workdir)
    inst = SWEInstance.model_validate({**inst.model_dump(), "log_parser": "parse_log_cargo"})
    report = _grade(local_backend, local_config, inst, inst.patch)
    assert report.infra_error is not None and "parse_log_cargo" in report.infra_error
    assert report.config_error and "evaluation.log_parser" in report.infra_error
    assert not report.tests_run
