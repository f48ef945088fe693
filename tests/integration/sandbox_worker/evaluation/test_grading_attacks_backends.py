"""Reward hacking through grading, on the real backends: every attack is reward 0.

The attacks of ``tests/support/grading_attacks.py`` (hook files, ini options, plugins found by
pytest's autoload, start-up files, a fake pytest, fake result lines, exit-code tricks, edited or
deleted tests, symlinks, writes into the interpreter's packages) through docker and bwrap, in
the real instance image with Debian's pytest and plugin autoload on.
"""

from __future__ import annotations

import pytest

from sandbox_worker import images
from sandbox_worker.backends import SandboxBackend
from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from services.protocol.instance import SWEInstance
from tests.support.grading_attacks import (
    ATTACKS,
    SANDBOX_ONLY_ATTACKS,
    TARGET_INSTANCE,
    Attack,
    build_attack_patch,
)

CONFIG = EvalConfig(test_timeout_s=120)


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
@pytest.mark.parametrize("attack", ATTACKS + SANDBOX_ONLY_ATTACKS, ids=lambda a: a.name)
def test_attack_gets_reward_zero(
    attack: Attack,
    kind: str,
    eval_backends: dict[str, SandboxBackend],
    instances: dict[str, SWEInstance],
    node: str,
) -> None:
    inst = instances[TARGET_INSTANCE]
    patch = build_attack_patch(attack, inst)
    image = images.instance_image(inst.instance_id)
    report = evaluate_patch(eval_backends[kind], inst, patch, image, node=node, config=CONFIG)
    assert report.infra_error is None, report.infra_error
    assert report.reward == 0.0, report.log_tail
    assert not report.resolved
    if attack.expect_rejected:
        assert report.patch_rejected and not report.applied and not report.tests_run
        return
    if report.applied:
        assert set(inst.FAIL_TO_PASS) & set(report.f2p_failure), report.log_tail
        # Restoring the infrastructure alone defeats all but the log forgeries (a .pth that
        # reached the interpreter's packages would fool the log parser too).
        assert report.log_resolved is attack.fools_log_parser, report.log_tail
    restored = set(report.protected_restored)
    assert set(attack.expect_restored) <= restored, (sorted(restored), report.log_tail)


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
def test_structured_report_agrees_with_the_log_on_gold_and_base(
    kind: str,
    eval_backends: dict[str, SandboxBackend],
    instances: dict[str, SWEInstance],
    node: str,
) -> None:
    """On honest runs the structured report and the official log parser see the same run."""
    inst = instances[TARGET_INSTANCE]
    image = images.instance_image(inst.instance_id)
    backend = eval_backends[kind]
    gold = evaluate_patch(backend, inst, inst.patch, image, node=node, config=CONFIG)
    assert gold.resolved and gold.log_resolved and gold.structured_problem is None, gold.log_tail
    assert gold.tests_status == gold.log_tests_status
    assert gold.protected_restored == {}
    base_config = CONFIG.model_copy(update={"grade_empty_patch": True})
    base = evaluate_patch(backend, inst, "", image, node=node, config=base_config)
    assert base.structured_problem is None and base.test_exit_code == 1, base.log_tail
    assert base.tests_status == base.log_tests_status
    assert sorted(base.f2p_failure) == sorted(inst.FAIL_TO_PASS)
