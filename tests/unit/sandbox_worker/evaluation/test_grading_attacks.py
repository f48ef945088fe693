"""Reward hacking through grading, on the LocalDir test double: every attack is reward 0.

The attacks (``tests/support/grading_attacks.py``) leave the bug of ``swerl__spanlib-1`` in
place and try to make the tests *look* fixed: hook files, ini options, plugins, start-up files,
a fake pytest, fake result lines, exit-code tricks, edited/deleted tests, symlinks. The same
attacks run through docker and bwrap in ``tests/integration/evaluation``.
"""

from __future__ import annotations

import pytest

from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from services.protocol.instance import SWEInstance
from tests.support.grading_attacks import (
    ATTACKS,
    ROUND_TWO_ATTACKS,
    TARGET_INSTANCE,
    Attack,
    build_attack_patch,
)
from tests.unit.sandbox_worker.evaluation.conftest import image_of

pytestmark = pytest.mark.slow  # every attack is graded by running the test suite


@pytest.mark.parametrize("attack", ATTACKS + ROUND_TWO_ATTACKS, ids=lambda a: a.name)
def test_attack_gets_reward_zero(
    attack: Attack,
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    inst = mini_instances[TARGET_INSTANCE]
    patch = build_attack_patch(attack, inst)
    report = evaluate_patch(local_backend, inst, patch, image_of(inst), config=local_config)
    assert report.infra_error is None, report.infra_error
    assert report.reward == 0.0, report.log_tail
    if attack.expect_rejected:
        assert report.patch_rejected and not report.applied and not report.tests_run
        return
    assert report.applied, report.log_tail
    assert not report.resolved
    assert set(inst.FAIL_TO_PASS) & set(report.f2p_failure), report.log_tail
    # Restoring the infrastructure alone defeats all but the log forgeries.
    assert report.log_resolved is attack.fools_log_parser, report.log_tail
    restored = set(report.protected_restored)
    assert set(attack.expect_restored) <= restored, (sorted(restored), report.log_tail)


def _new_file(path: str, text: str) -> str:
    lines = text.splitlines(keepends=True)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\n--- /dev/null\n+++ b/{path}\n"
        f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{line}" for line in lines)
    )


def test_legitimate_patch_keeps_swebench_semantics(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    """The fix plus new source files (a top-level module too) resolves; nothing restored."""
    inst = mini_instances[TARGET_INSTANCE]
    patch = (
        inst.patch
        + _new_file("spanlib/calendar_utils.py", "WEEK = 7\n")
        + _new_file("spanlib_compat.py", "from spanlib import Interval\n")
        + _new_file("docs/notes.md", "touching intervals do not overlap\n")
    )
    report = evaluate_patch(local_backend, inst, patch, image_of(inst), config=local_config)
    assert report.resolved and report.reward == 1.0, report.log_tail
    assert report.protected_restored == {}
    assert report.log_resolved and report.structured_problem is None
    assert report.tests_status == report.log_tests_status


def test_fix_plus_infrastructure_edits_is_graded_on_the_fix(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    """Restoring, not rejecting: a real fix that also touched infrastructure keeps reward 1,
    and the report counts what was restored (odd file names included)."""
    inst = mini_instances[TARGET_INSTANCE]
    odd = ["tests/-rf *.py", "tests/con test[1].py", "conftest.py"]
    patch = inst.patch + "".join(_new_file(path, "raise SystemExit(3)\n") for path in odd)
    report = evaluate_patch(local_backend, inst, patch, image_of(inst), config=local_config)
    assert report.infra_error is None, report.log_tail
    assert report.resolved and report.reward == 1.0, report.log_tail
    assert sorted(report.protected_restored) == sorted(odd)


def test_swebench_grading_mode_is_the_official_parser_alone(
    local_backend: LocalDirBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
) -> None:
    """Benchmark parity: grading="swebench" reads the log like the harness (and shares its
    blind spot for forged lines printed at exit); training uses the structured default."""
    inst = mini_instances[TARGET_INSTANCE]
    attack = next(a for a in ATTACKS if a.name == "fake_lines_at_exit")
    config = local_config.model_copy(update={"grading": "swebench"})
    report = evaluate_patch(
        local_backend, inst, build_attack_patch(attack, inst), image_of(inst), config=config
    )
    assert report.grading == "swebench" and report.log_resolved is None
    assert report.resolved  # the official parser is fooled; see docs/tasks-and-rewards.md
    gold = evaluate_patch(local_backend, inst, inst.patch, image_of(inst), config=config)
    assert gold.resolved and gold.structured_problem is None
