"""The trajectory runner's patch on the real backends (private dockerd, bwrap).

The agent is a function acting on the real agent sandbox by ``exec``, as the policy's shell
would; the sandboxes, ``copy_out`` and the host-side extraction are real. The adapter is a
recording double (its close-body limit is tested in tests/integration/adapter/routes), and the
evaluation a recording one that resolves exactly the gold patch: what is under test is which
patch reaches the evaluation and how the trajectory ends, not the grading.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sandbox_worker.adapter_client import CloseResult
from sandbox_worker.backends import Sandbox, SandboxBackend
from sandbox_worker.evaluation import EvalReport
from sandbox_worker.openhands.result import AgentRunResult, EndReason, EventSummary
from sandbox_worker.openhands.server import AgentServerBundle
from sandbox_worker.runner import CancelToken, RunContext
from sandbox_worker.sandbox_runner import RunnerSettings, SandboxTrajectoryRunner
from services.protocol.instance import SWEInstance
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome, OutcomeStatus, TrajectoryMeta
from tests.integration.sandbox_worker.conftest import SessionEnv
from tests.support import sandboxes

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]

GOLD = (
    "diff --git a/calc.py b/calc.py\nindex 0000000..1111111 100644\n--- a/calc.py\n"
    "+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a + b\n"
    "+    return a + b  # the gold fix\n"
)


@dataclass
class RecordingAdapter:
    """The adapter's open/close as the runner sees them (a double: no LLM calls are made)."""

    closes: list[tuple[str, Outcome | None]] = field(default_factory=list)

    def open(self, meta: TrajectoryMeta) -> str | None:
        return "swt_integration-test-token"

    def close(self, trajectory_id: str, outcome: Outcome | None = None) -> CloseResult:
        self.closes.append((trajectory_id, outcome))
        return CloseResult(outcome, {"turns": 1})

    def close_connection(self) -> None:
        pass

    def healthy(self) -> bool:
        return True


@dataclass
class RecordingEval:
    """Resolves exactly the gold patch; records every patch it is given."""

    patches: list[str] = field(default_factory=list)

    def __call__(self, backend: Any, instance: SWEInstance, patch: str, *a: Any, **k: Any) -> Any:
        self.patches.append(patch)
        return EvalReport(instance_id=instance.instance_id, applied=bool(patch),
                          resolved=patch == instance.patch)  # fmt: skip


def agent(action: Callable[[Sandbox], None]) -> Callable[..., AgentRunResult]:
    def run(sandbox: Sandbox, *_a: Any, **_k: Any) -> AgentRunResult:
        action(sandbox)
        return AgentRunResult(EndReason.FINISHED, 2, 0.1, None, "finished",
                              EventSummary(n_steps=2, n_tool_calls=2))  # fmt: skip

    return run


def _sh(sandbox: Sandbox, script: str) -> None:
    res = sandbox.exec(script, workdir="/testbed", timeout_s=60)
    assert res.exit_code == 0, res.output


def _run(
    backend: SandboxBackend,
    env: SessionEnv,
    node: str,
    tmp_path: Path,
    action: Callable[[Sandbox], None],
) -> tuple[Outcome, RecordingAdapter, RecordingEval]:
    base = sandboxes.tiny_base_commit(tmp_path)
    instance = SWEInstance(instance_id=sandboxes.TINY_INSTANCE_ID, repo=sandboxes.TINY_REPO,
                           base_commit=base, patch=GOLD, problem_statement="fix add",
                           FAIL_TO_PASS=["test_calc.py::test_add"], PASS_TO_PASS=[],
                           test_cmd="python3 -m pytest")  # fmt: skip
    bundle_dir = env.root / f"bundle-{tmp_path.name[-8:]}"
    (bundle_dir / "py").mkdir(parents=True)
    (bundle_dir / "venv").mkdir()
    adapter, evaluation = RecordingAdapter(), RecordingEval()
    runner = SandboxTrajectoryRunner(
        backend, env.hub, AgentServerBundle(str(bundle_dir / "py"), str(bundle_dir / "venv")),
        adapter, {instance.instance_id: instance},
        RunnerSettings(adapter_host="127.0.0.1", adapter_port=9),
        image_for=lambda _id: env.image, agent_fn=agent(action), eval_fn=evaluation,
    )  # fmt: skip
    task = RolloutTask(task_id="b1:0:0", batch_id="b1", group_id="b1:0",
                       instance_id=instance.instance_id)  # fmt: skip
    ctx = RunContext(node=node, cancel=CancelToken(), log=logging.getLogger("t"))
    return runner.run(task, ctx), adapter, evaluation


def test_an_agent_that_forges_its_patch_with_diff_external_is_graded_on_its_tree(
    backend: SandboxBackend, sandbox_env: SessionEnv, node: str, tmp_path: Path
) -> None:
    def forge(sandbox: Sandbox) -> None:
        sandbox.write_file("/tmp/gold.diff", GOLD.encode())
        sandbox.write_file("/tmp/forge.sh", b"#!/bin/sh\ncat /tmp/gold.diff\n", mode=0o755)
        _sh(sandbox, "git config diff.external /tmp/forge.sh && echo '# noise' >> README.md")

    outcome, adapter, evaluation = _run(backend, sandbox_env, node, tmp_path, forge)
    [patch] = evaluation.patches
    assert "the gold fix" not in patch and "+# noise" in patch  # the tree's real patch
    assert (outcome.status, outcome.reward, outcome.patch) == (OutcomeStatus.COMPLETED, 0.0, patch)
    assert adapter.closes[-1][1] is not None and adapter.closes[-1][1].reward == 0.0


def test_a_patch_over_the_cap_is_reward_0_with_its_reason_not_an_abort(
    backend: SandboxBackend, sandbox_env: SessionEnv, node: str, tmp_path: Path
) -> None:
    def flood(sandbox: Sandbox) -> None:
        _sh(sandbox, "head -c 3000000 /dev/urandom | base64 > big.txt")  # ~4 MiB of patch

    outcome, adapter, evaluation = _run(backend, sandbox_env, node, tmp_path, flood)
    assert (outcome.status, outcome.reward, outcome.patch) == (OutcomeStatus.COMPLETED, 0.0, "")
    assert outcome.test_report["patch_refused"] == "patch_too_large"
    assert "patch_too_large" in outcome.test_report["patch_error"]
    assert evaluation.patches == [""]
    final = adapter.closes[-1][1]
    assert final is not None and final.status is OutcomeStatus.COMPLETED and final.reward == 0.0


def test_a_git_dir_the_agent_replaced_is_reward_0_not_an_abort(
    backend: SandboxBackend, sandbox_env: SessionEnv, node: str, tmp_path: Path
) -> None:
    def replace_git(sandbox: Sandbox) -> None:
        _sh(sandbox, "echo change >> calc.py && mv .git /tmp/g && echo 'gitdir: /tmp/g' > .git")

    outcome, _, _ = _run(backend, sandbox_env, node, tmp_path, replace_git)
    assert (outcome.status, outcome.reward, outcome.patch) == (OutcomeStatus.COMPLETED, 0.0, "")
    assert outcome.test_report["patch_refused"] == "git_dir_invalid"
