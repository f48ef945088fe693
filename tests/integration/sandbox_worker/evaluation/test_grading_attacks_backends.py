"""Reward hacking through grading, on the real backends: every attack is reward 0.

The attacks of ``tests/support/grading_attacks.py`` (hook files, ini options, plugins found by
pytest's autoload, start-up files, a fake pytest, fake result lines, exit-code tricks, edited or
deleted tests, symlinks, writes into the interpreter's packages) through docker and bwrap, in
the real instance image with Debian's pytest and plugin autoload on.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from sandbox_worker import images
from sandbox_worker.backends import SandboxBackend
from sandbox_worker.backends.base import SandboxLimits, SandboxSpec
from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from services.protocol.instance import SWEInstance
from tests.support.grading_attacks import (
    ATTACKS,
    ROUND_TWO_ATTACKS,
    SANDBOX_ONLY_ATTACKS,
    STDLIB_LAZY_IMPORT,
    TARGET_INSTANCE,
    Attack,
    build_attack_patch,
)

CONFIG = EvalConfig(test_timeout_s=120)


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
@pytest.mark.parametrize(
    "attack",
    ATTACKS + ROUND_TWO_ATTACKS + SANDBOX_ONLY_ATTACKS + (STDLIB_LAZY_IMPORT,),
    ids=lambda a: a.name,
)
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


# -- What the patch or the code under test can cause is graded, never an excluded abort --------

_KILLERS = {
    # The eval container's PID 1 (tini on docker): SIGTERM it has a handler for.
    "kill_pid1": "import os, signal\nos.kill(1, signal.SIGTERM)\n",
    # Every process the tests can see, the harness's shell included.
    "kill_everything": "import os, signal\nos.kill(-1, signal.SIGKILL)\n",
    # A detached process holding the test output open: the exec would wait for it.
    "hold_the_output": (
        "import subprocess\nsubprocess.Popen(['sleep', '600'], start_new_session=True)\n"
    ),
}
_BOUNDED = EvalConfig(test_timeout_s=60, harness_grace_s=15)


def _appended_to_package(inst: SWEInstance, code: str) -> str:
    """The instance's package ``__init__`` with ``code`` appended (a git-format patch)."""

    def mutate(repo: Path, _: SWEInstance) -> None:
        init = repo / "spanlib/__init__.py"
        init.write_text(init.read_text() + "\n" + code)

    return build_attack_patch(Attack("killer", mutate), inst)


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
@pytest.mark.parametrize("killer", sorted(_KILLERS))
def test_code_under_test_that_kills_or_holds_the_sandbox_is_graded_zero(
    killer: str,
    kind: str,
    eval_backends: dict[str, SandboxBackend],
    instances: dict[str, SWEInstance],
    node: str,
) -> None:
    inst = instances[TARGET_INSTANCE]
    patch = _appended_to_package(inst, _KILLERS[killer])
    image = images.instance_image(inst.instance_id)
    report = evaluate_patch(eval_backends[kind], inst, patch, image, node=node, config=_BOUNDED)
    assert report.infra_error is None, (report.infra_error, report.log_tail)
    assert report.reward == 0.0 and not report.resolved
    assert report.duration_s < _BOUNDED.test_timeout_s, report.log_tail


def _inode_filler(count: int) -> str:
    """A git-format patch creating ``count`` empty files (one inode each) under ``fill/``."""
    return "".join(
        f"diff --git a/fill/f{i} b/fill/f{i}\nnew file mode 100644\nindex 0000000..e69de29\n"
        for i in range(count)
    )


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
def test_a_patch_that_exhausts_the_quota_after_the_apply_is_graded_zero(
    kind: str,
    eval_backends: dict[str, SandboxBackend],
    instances: dict[str, SWEInstance],
    node: str,
) -> None:
    """The patch leaves the sandbox's inode quota a few inodes short, so a harness step after
    the apply hits ENOSPC: the patch's doing (graded 0), never an abort; whatever the window."""
    inst = instances[TARGET_INSTANCE]
    image = images.instance_image(inst.instance_id)
    limits = SandboxLimits(inodes=2048, disk_mb=256)
    config = EvalConfig(test_timeout_s=60, limits=limits)
    spec = SandboxSpec(image=image, node=node, sandbox_id=f"probe-{uuid.uuid4().hex[:8]}",
                       limits=limits)  # fmt: skip
    with eval_backends[kind].create(spec) as probe:
        free = int(probe.exec("stat -f -c %d /testbed").output.split()[0])
    caused = []
    for short_by in (2, 5, 8):
        patch = _inode_filler(free - short_by - 8)
        backend = eval_backends[kind]
        report = evaluate_patch(backend, inst, patch, image, node=node, config=config)
        assert report.infra_error is None, (short_by, report.infra_error, report.log_tail)
        assert report.reward == 0.0
        caused.append(report.patch_caused_failure)
    assert any(caused), caused  # the window was hit at least once
