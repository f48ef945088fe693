"""Outcomes of evaluate_patch on the real backends: infrastructure failures abort, a patch
that hangs the tests is reward 0, the evaluation sandbox has no network."""

from __future__ import annotations

import pytest

from sandbox_worker import images
from sandbox_worker.backends import SandboxBackend
from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from services.protocol.instance import SWEInstance
from tests.support.grading_attacks import HANG_INSTANCE, hanging_patch


@pytest.mark.parametrize("kind", ["docker", "bwrap"])
def test_missing_image_is_an_infra_error(
    eval_backends: dict[str, SandboxBackend],
    instances: dict[str, SWEInstance],
    node: str,
    kind: str,
) -> None:
    inst = instances["swerl__strkit-1"]
    image = images.instance_image("swerl__no-such-instance-1")
    report = evaluate_patch(eval_backends[kind], inst, inst.patch, image, node=node)
    assert report.infra_error is not None and "sandbox creation failed" in report.infra_error
    assert report.reward is None and not report.applied and not report.resolved


def test_hanging_tests_are_reward_zero_not_abort(
    eval_backends: dict[str, SandboxBackend], instances: dict[str, SWEInstance], node: str
) -> None:
    inst = instances[HANG_INSTANCE]
    hang = hanging_patch(inst)
    image = images.instance_image(inst.instance_id)
    config = EvalConfig(test_timeout_s=3)
    report = evaluate_patch(eval_backends["bwrap"], inst, hang, image, node=node, config=config)
    assert report.infra_error is None and report.applied
    assert report.tests_timed_out and report.test_exit_code == 124
    assert report.reward == 0.0


def test_tests_run_without_network(
    eval_backends: dict[str, SandboxBackend], instances: dict[str, SWEInstance], node: str
) -> None:
    """A patch whose code needs the network fails its tests (loopback only in the sandbox)."""
    inst = instances["swerl__tinyini-2"]
    probe = inst.patch.replace(
        "+        normalized = value.strip().lower()\n",
        "+        import socket\n"
        "+        socket.create_connection(('1.1.1.1', 53), timeout=2).close()\n"
        "+        normalized = value.strip().lower()\n",
    ).replace("@@ -44,13 +44,14 @@", "@@ -44,13 +44,16 @@")
    assert probe != inst.patch
    image = images.instance_image(inst.instance_id)
    report = evaluate_patch(eval_backends["docker"], inst, probe, image, node=node)
    assert report.infra_error is None and report.applied, report.log_tail
    assert not report.resolved
    assert "Network is unreachable" in report.log_tail
