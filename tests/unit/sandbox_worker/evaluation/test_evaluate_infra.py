"""Infrastructure failures become ``infra_error`` (an aborted trajectory), never reward 0."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_worker.backends.base import (
    ExecResult,
    NetworkPolicy,
    Sandbox,
    SandboxInfraError,
    SandboxSpec,
)
from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from sandbox_worker.evaluation.evaluate import sandbox_id_for
from sandbox_worker.testing.local_sandbox import LocalDirBackend, LocalDirSandbox
from services.protocol.instance import SWEInstance
from tests.unit.sandbox_worker.evaluation.conftest import image_of


@dataclass
class Fault:
    """Make the sandbox misbehave on the first exec whose command contains ``marker``."""

    marker: str
    kind: str  # "timeout" | "raise"


class FaultyBackend(LocalDirBackend):
    fault: Fault | None = None
    fail_destroy: bool = False

    def create(self, spec: SandboxSpec) -> Sandbox:
        self.last_spec = spec
        real = super().create(spec)
        assert isinstance(real, LocalDirSandbox)
        backend = self

        class Faulty(LocalDirSandbox):
            def exec(self, cmd: str | list[str], **kwargs: object) -> ExecResult:
                fault = backend.fault
                if fault and isinstance(cmd, str) and fault.marker in cmd:
                    if fault.kind == "raise":
                        raise SandboxInfraError("daemon connection lost")
                    return ExecResult(exit_code=-9, output="(killed)", timed_out=True)
                return super().exec(cmd, **kwargs)  # type: ignore[arg-type]

            def destroy(self) -> None:
                super().destroy()
                if backend.fail_destroy:
                    raise SandboxInfraError("container removal failed")

        faulty = Faulty(real.spec, real.scratch, self)
        self.live[spec.sandbox_id] = faulty
        self.created[-1] = faulty
        return faulty


@pytest.fixture
def faulty(templates: dict[str, Path], tmp_path: Path) -> FaultyBackend:
    return FaultyBackend(templates, tmp_path / "scratch")


def test_missing_image_is_an_infra_error(
    faulty: FaultyBackend, local_config: EvalConfig, mini_instances: dict[str, SWEInstance]
) -> None:
    inst = mini_instances["swerl__strkit-1"]
    report = evaluate_patch(faulty, inst, inst.patch, "no-such-image", config=local_config)
    assert report.infra_error is not None and "no template for image" in report.infra_error
    assert report.reward is None and not report.resolved and not report.applied


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (Fault("git reset", "timeout"), "reset to the base commit failed"),
        (Fault("git apply --verbose", "timeout"), "harness step timed out"),
        (Fault("swerl-eval.sh", "timeout"), "exceeded its exec timeout"),
        (Fault("swerl-eval.sh", "raise"), "daemon connection lost"),
    ],
    ids=["reset-timeout", "apply-timeout", "eval-timeout", "backend-raises"],
)
def test_harness_failures_are_infra_errors(
    faulty: FaultyBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
    fault: Fault,
    expected: str,
) -> None:
    inst = mini_instances["swerl__strkit-1"]
    faulty.fault = fault
    report = evaluate_patch(faulty, inst, inst.patch, image_of(inst), config=local_config)
    assert report.infra_error is not None and expected in report.infra_error
    assert report.reward is None and not report.resolved
    assert faulty.created[-1].destroyed and not faulty.live


def test_reset_failure_for_a_missing_base_commit(
    faulty: FaultyBackend, local_config: EvalConfig, mini_instances: dict[str, SWEInstance]
) -> None:
    inst = mini_instances["swerl__strkit-1"].model_copy(update={"base_commit": "0" * 40})
    report = evaluate_patch(faulty, inst, inst.patch, image_of(inst), config=local_config)
    assert report.infra_error == "reset to the base commit failed (exit 3)"
    assert "is not in the repository" in report.log_tail


@pytest.mark.slow  # runs the mini repo's test suite
def test_destroy_failure_keeps_the_result(
    faulty: FaultyBackend,
    local_config: EvalConfig,
    mini_instances: dict[str, SWEInstance],
    caplog: pytest.LogCaptureFixture,
) -> None:
    inst = mini_instances["swerl__tinyini-3"]
    faulty.fail_destroy = True
    with caplog.at_level(logging.WARNING):
        report = evaluate_patch(faulty, inst, inst.patch, image_of(inst), config=local_config)
    assert report.resolved and report.infra_error is None
    assert "could not destroy evaluation sandbox" in caplog.text


def test_sandbox_spec_is_fresh_isolated_and_labelled(
    faulty: FaultyBackend, local_config: EvalConfig, mini_instances: dict[str, SWEInstance]
) -> None:
    inst = mini_instances["swerl__tinyini-3"]
    evaluate_patch(faulty, inst, "", image_of(inst), node="node-7", config=local_config)
    spec = faulty.last_spec
    assert spec.network is NetworkPolicy.NONE
    assert spec.node == "node-7" and spec.image == "tinyini"
    assert spec.labels["swerl.instance"] == inst.instance_id
    assert spec.limits == local_config.limits


def test_sandbox_ids_are_unique_and_valid() -> None:
    ids = {sandbox_id_for("Django__Django-11099.x") for _ in range(50)}
    assert len(ids) == 50
    for sid in ids:
        assert sid.startswith("eval-django-djang-")
        SandboxSpec(image="i", node="n", sandbox_id=sid)  # the contract's own validation
    long_id = sandbox_id_for("scikit-learn__scikit-learn-13142")
    SandboxSpec(image="i", node="n", sandbox_id=long_id)
    # Short enough for "<node>.<id>" state paths with unix sockets (see sandbox_id_for).
    assert len(long_id) <= 5 + 12 + 1 + 10


def test_malformed_instance_test_patch_is_not_the_agents_fault(
    faulty: FaultyBackend, local_config: EvalConfig, mini_instances: dict[str, SWEInstance]
) -> None:
    inst = mini_instances["swerl__strkit-1"]
    bad = inst.model_copy(update={"test_patch": "--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n"})
    report = evaluate_patch(faulty, bad, inst.patch, image_of(inst), config=local_config)
    assert report.infra_error is not None and "test patch is malformed" in report.infra_error
    assert faulty.created[-1].destroyed
