"""evaluate_patch through the LocalDir test double: apply fallbacks, restoration, outcomes."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox_worker.evaluation import EvalConfig, EvalReport, evaluate_patch
from sandbox_worker.evaluation.evaluate import ALREADY_APPLIED
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from services.protocol.instance import SWEInstance
from tests.support.grading_attacks import HANG_INSTANCE, hanging_patch
from tests.unit.sandbox_worker.evaluation.conftest import image_of

pytestmark = pytest.mark.slow  # every case runs the mini repo's test suite

Grade = Callable[..., EvalReport]


@pytest.fixture
def grade(local_backend: LocalDirBackend, local_config: EvalConfig) -> Grade:
    """``grade(inst, patch, **config_changes)``: evaluate_patch on the LocalDir double."""

    def run(inst: SWEInstance, patch: str | None, **config_changes: object) -> EvalReport:
        config = local_config.model_copy(update=config_changes) if config_changes else local_config
        return evaluate_patch(local_backend, inst, patch, image_of(inst), config=config)

    return run


def test_gold_patch_resolves(
    local_backend: LocalDirBackend,
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances["swerl__strkit-1"]
    report = grade(inst, inst.patch)
    assert report.infra_error is None, report.log_tail
    assert report.applied and report.apply_method == "git apply --verbose"
    assert report.resolved and report.reward == 1.0
    assert sorted(report.f2p_success) == sorted(inst.FAIL_TO_PASS)
    assert sorted(report.p2p_success) == sorted(inst.PASS_TO_PASS)
    assert report.f2p_failure == [] and report.p2p_failure == []
    assert report.tests_status["tests/test_text.py::test_truncate_custom_suffix"] == "PASSED"
    # The planted canaries fail (and stay out of the reported statuses): exit status 1.
    assert report.test_exit_code == 1 and report.structured_problem is None
    assert set(report.tests_status) == set(inst.FAIL_TO_PASS) | set(inst.PASS_TO_PASS)
    assert report.tamper == []
    assert local_backend.created[-1].destroyed
    official = grade(inst, inst.patch, grading="swebench")  # no canaries
    assert official.resolved and official.test_exit_code == 0


def test_empty_patch_is_not_applied_and_runs_no_tests(
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances["swerl__spanlib-1"]
    for patch in ("", "  \n", None):
        report = grade(inst, patch)
        assert report.infra_error is None
        assert not report.applied and report.apply_method is None
        assert not report.resolved and report.reward == 0.0
        assert not report.tests_run and report.tests_status == {}


def test_empty_patch_graded_shows_the_base_state(
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances["swerl__spanlib-1"]
    report = grade(inst, "", grade_empty_patch=True)
    assert report.tests_run and report.log_valid and not report.applied
    assert not report.resolved
    assert sorted(report.f2p_failure) == sorted(inst.FAIL_TO_PASS)
    assert sorted(report.p2p_success) == sorted(inst.PASS_TO_PASS)
    assert report.test_exit_code == 1


@pytest.mark.parametrize("policy", ["harness", "strict"])
def test_patch_that_does_not_apply_is_reward_zero_not_abort(
    local_backend: LocalDirBackend,
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
    policy: str,
) -> None:
    inst = mini_instances["swerl__tinyini-2"]
    garbage = inst.patch.replace("-        if value in _TRUE:", "-        if value in TRUE_VALUES:")
    assert garbage != inst.patch
    report = grade(inst, garbage, patch_policy=policy)
    assert report.infra_error is None and report.reward == 0.0
    assert not report.applied and not report.tests_run
    # Every fallback was tried, with a pristine tree before each retry; the strict policy
    # (training rewards) never hands the patch to GNU patch.
    commands = local_backend.created[-1].commands
    tried = [c.split("\n")[-1] for c in commands if "swerl-model.diff" in c]
    cascade = [
        "git apply --verbose",
        "git apply --verbose --3way",
        "git apply --verbose --reject",
        *(["patch --batch --forward --fuzz=5 -p1 -i"] if policy == "harness" else []),
        "git apply --check --reverse",
    ]
    assert [c.split(" /")[0] for c in tried] == cascade
    restores = [c for c in commands if c.endswith("git checkout -- . ; git clean -fd")]
    assert len(restores) == len(cascade) - 2
    assert ">>>>> Patch Apply Failed" in report.log_tail


def test_fuzzy_patch_applies_with_the_patch_fallback_only_for_the_harness(
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances["swerl__strkit-1"]
    # One context line no longer matches the code: git apply refuses, patch --fuzz copes.
    fuzzy = inst.patch.replace(
        '         raise ValueError(f"width must be >= 0, got {width}")',
        '         raise ValueError(f"width must not be negative: {width}")',
    )
    assert fuzzy != inst.patch
    report = grade(inst, fuzzy, patch_policy="harness", grading="swebench")
    assert report.applied and report.apply_method == "patch --batch --forward --fuzz=5 -p1 -i"
    assert report.resolved, report.log_tail
    strict = grade(inst, fuzzy)
    assert not strict.applied and strict.reward == 0.0 and strict.infra_error is None


def test_already_applied_patch_counts_as_applied(
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
    templates: dict[str, Path],
    tmp_path: Path,
) -> None:
    inst = mini_instances["swerl__strkit-2"]
    # A patch whose result is the base itself (the gold patch reversed).
    checkout = tmp_path / "reverse"
    subprocess.run(["cp", "-a", str(templates["strkit"]), str(checkout)], check=True)
    subprocess.run(["git", "apply"], input=inst.patch, text=True, cwd=checkout, check=True)
    reverse = subprocess.run(
        ["git", "diff", "-R"], cwd=checkout, capture_output=True, text=True, check=True
    ).stdout
    report = grade(inst, reverse)
    assert report.applied and report.apply_method == ALREADY_APPLIED
    assert report.tests_run and not report.resolved
    assert sorted(report.f2p_failure) == sorted(inst.FAIL_TO_PASS)


def test_tampered_protected_test_file_is_restored(
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances["swerl__spanlib-3"]
    # Gold patch + an edit that would make the new F2P tests pass trivially if kept.
    cheat = inst.patch + (
        "diff --git a/tests/test_daterange.py b/tests/test_daterange.py\n"
        "--- a/tests/test_daterange.py\n+++ b/tests/test_daterange.py\n"
        "@@ -1,3 +1,4 @@\n+import pytest; pytest.skip(allow_module_level=True)\n"
        " from datetime import date\n \n import pytest\n"
    )
    report = grade(inst, cheat)
    assert report.applied and report.apply_method == "git apply --verbose"
    assert report.resolved, report.log_tail


def test_skipping_the_failing_tests_does_not_resolve(
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances["swerl__spanlib-3"]
    # No fix; a new conftest.py skips every test instead. Skipped F2P tests are failures.
    skip_all = (
        "diff --git a/conftest.py b/conftest.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/conftest.py\n@@ -0,0 +1,6 @@\n"
        "+import pytest\n+\n+\n+def pytest_collection_modifyitems(items):\n"
        "+    for item in items:\n+        item.add_marker(pytest.mark.skip(reason='nope'))\n"
    )
    report = grade(inst, skip_all)
    assert report.applied and report.tests_run
    assert not report.resolved and report.reward == 0.0
    assert sorted(report.f2p_failure) == sorted(inst.FAIL_TO_PASS)


def test_hanging_tests_time_out_as_reward_zero(
    grade: Grade,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances[HANG_INSTANCE]
    hang = hanging_patch(inst)
    report = grade(inst, hang, test_timeout_s=2)
    assert report.infra_error is None, report.infra_error
    assert report.applied and report.tests_timed_out
    assert report.test_exit_code == 124
    assert not report.resolved and not report.log_valid and report.reward == 0.0


def test_a_repository_timeout_overrides_the_default(
    grade: Grade, mini_instances: dict[str, SWEInstance]
) -> None:
    """The hanging patch again, with a generous default: only the repository's own short
    timeout ends it (an entry for another repository changes nothing)."""
    inst = mini_instances[HANG_INSTANCE]
    other = "someone/else"
    report = grade(
        inst,
        hanging_patch(inst),
        test_timeout_s=600,
        test_timeout_by_repo={inst.repo: 2, other: 900},
    )
    assert report.infra_error is None, report.infra_error
    assert report.tests_timed_out and report.test_exit_code == 124 and report.reward == 0.0
    gold = grade(inst, inst.patch, test_timeout_s=600, test_timeout_by_repo={inst.repo: 60})
    assert gold.resolved and not gold.tests_timed_out


@pytest.mark.parametrize(
    ("timeouts", "message"),
    [({"not-a-repo": 5}, "not an owner/name repository"), ({"a/b": 0}, "must be >= 1")],
)
def test_bad_repository_timeouts_are_named(timeouts: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EvalConfig(test_timeout_by_repo=timeouts)


def test_for_repo_picks_the_repository_entry() -> None:
    config = EvalConfig(test_timeout_s=100, test_timeout_by_repo={"a/b": 7})
    assert config.for_repo("a/b").test_timeout_s == 7
    assert config.for_repo("c/d") is config
