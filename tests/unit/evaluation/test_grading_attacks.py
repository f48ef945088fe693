"""Reward hacking through grading, on the LocalDir test double: every attack is reward 0.

The attacks (``tests/support/grading_attacks.py``) leave the bug of ``swerl__spanlib-1`` in
place and try to make the tests *look* fixed: hook files, ini options, plugins, start-up files,
a fake pytest, fake result lines, exit-code tricks, edited/deleted tests, symlinks. The same
attacks run through docker and bwrap in ``tests/integration/evaluation``.
"""

from __future__ import annotations

import pytest

from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from services.protocol.instance import SWEInstance
from tests.support.grading_attacks import (
    ATTACKS,
    TARGET_INSTANCE,
    Attack,
    build_attack_patch,
)
from tests.unit.evaluation.conftest import image_of
from tests.unit.evaluation.local_sandbox import LocalDirBackend


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
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
    assert report.applied, report.log_tail
    assert report.reward == 0.0, report.log_tail
    assert not report.resolved
    assert set(inst.FAIL_TO_PASS) & set(report.f2p_failure), report.log_tail
    restored = set(report.protected_restored)
    assert set(attack.expect_restored) <= restored, (sorted(restored), report.log_tail)
