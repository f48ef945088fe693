"""The trajectory runner's pipeline and outcome mapping, on test doubles (no docker, no SDK).

Each test drives :class:`SandboxTrajectoryRunner.run` with a fake agent acting on a LocalDir
sandbox (a copy of the spanlib mini repository) and checks the outcome, what the adapter was
told, and that every sandbox is gone afterwards (the ``harness`` fixture fails otherwise).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox_worker.adapter_client import AdapterError, AdapterUnavailableError
from sandbox_worker.backends.base import NetworkPolicy, Sandbox
from sandbox_worker.evaluation import EvalReport
from sandbox_worker.openhands.result import AgentRunResult, EndReason, EventSummary
from sandbox_worker.runner import SHUTDOWN, CancelToken
from sandbox_worker.sandbox_runner import DIFF_BASE_COMMIT, DIFF_START_HEAD
from services.protocol.instance import SWEInstance
from services.protocol.progress import ProgressPhase
from services.protocol.trajectory import Outcome, OutcomeStatus
from tests.unit.sandbox_worker.conftest import (
    COUNTERS,
    IMAGE,
    INSTANCE_ID,
    Harness,
    make_ctx,
    make_task,
)

pytestmark = pytest.mark.slow  # every run grades a patch with the mini repo's test suite

N_TOKENS = COUNTERS["prompt_tokens"] + COUNTERS["observation_tokens"] + COUNTERS["generated_tokens"]


def agent(
    end: EndReason,
    action: Callable[[Sandbox], None] | None = None,
    error: str | None = None,
    calls: list[dict[str, Any]] | None = None,
    tool_calls: int = 0,
) -> Callable[..., AgentRunResult]:
    """A fake ``run_agent_in_sandbox``: runs ``action`` on the sandbox, ends with ``end``."""

    def run(sandbox: Sandbox, hub: Any, bundle: Any, trajectory_id: str, prompt: str,
            limits: Any, sampling: Any, **kw: Any) -> AgentRunResult:  # fmt: skip
        if calls is not None:
            calls.append({"sandbox": sandbox, "trajectory_id": trajectory_id, "prompt": prompt,
                          "limits": limits, "sampling": sampling, **kw})  # fmt: skip
        if action is not None:
            action(sandbox)
        summary = EventSummary(n_steps=3, n_tool_calls=tool_calls)
        return AgentRunResult(end, 3, 0.5, error, "finished", summary)

    return run


def apply_gold(h: Harness) -> Callable[[Sandbox], None]:
    def act(sandbox: Sandbox) -> None:
        sandbox.write_file(f"{h.settings.workdir}/../gold.diff", h.instance.patch.encode())
        res = sandbox.exec("git apply ../gold.diff", workdir=h.settings.workdir)
        assert res.exit_code == 0, res.output

    return act


def no_eval(*_a: Any, **_k: Any) -> EvalReport:
    raise AssertionError("the evaluation must not run")


def test_gold_patch_is_completed_with_reward_1(harness: Harness) -> None:
    calls: list[dict[str, Any]] = []
    runner = harness.runner(agent(EndReason.FINISHED, apply_gold(harness), calls=calls))
    task = make_task()
    outcome = runner.run(task, make_ctx())

    assert outcome.status is OutcomeStatus.COMPLETED and outcome.reward == 1.0
    assert outcome.patch == harness.instance.patch
    report = outcome.test_report
    assert report["diff_base"] == {"commit": harness.instance.base_commit, "kind": DIFF_BASE_COMMIT}
    assert report["evaluation"]["resolved"] is True and report["evaluation"]["applied"] is True
    assert report["agent"]["end_reason"] == "finished" and report["record"] == COUNTERS
    assert (outcome.n_turns, outcome.n_tokens) == (COUNTERS["turns"], N_TOKENS)
    assert {"open", "sandbox_create", "agent", "patch", "eval", "close", "total"} <= set(
        outcome.durations
    )
    # The agent got the task's prompt, limits, sampling and the cancel token, in a sandbox
    # whose only network is the relay to the adapter.
    [call] = calls
    assert harness.instance.problem_statement.strip() in call["prompt"]
    assert call["limits"] == task.limits and call["sampling"] == task.sampling
    assert call["trajectory_id"] == task.trajectory_id == "b1:0:0.a1"
    spec = call["sandbox"].spec
    assert spec.network is NetworkPolicy.LLM_RELAY_ONLY
    assert (spec.llm_relay.target_host, spec.llm_relay.target_port) == ("127.0.0.1", 8100)
    # ... bound to this trajectory, with the token the open returned (added on the host)
    assert spec.llm_relay.trajectory_id == task.trajectory_id
    assert spec.llm_relay.token == harness.adapter.token
    assert harness.adapter.token not in repr(spec) and not any(
        harness.adapter.token in v for v in [*spec.env.values(), *spec.labels.values()]
    )
    assert spec.labels["swerl.trajectory"] == task.trajectory_id and spec.node == "node-1"
    # Adapter: opened with the identifiers; frozen after the agent; closed with the outcome.
    [meta] = harness.adapter.opened
    assert (meta.trajectory_id, meta.task_id, meta.batch_id, meta.group_id, meta.instance_id) == (
        task.trajectory_id, task.task_id, task.batch_id, task.group_id, task.instance_id
    )  # fmt: skip
    assert meta.extra["kind"] == "swe" and meta.extra["node"] == "node-1"
    assert [c[1] is None for c in harness.adapter.closes] == [True, False]
    final = harness.adapter.closes[1][1]
    assert final is not None and final.reward == 1.0 and final.n_turns == COUNTERS["turns"]


@pytest.mark.parametrize(
    ("end", "status"),
    [(EndReason.MAX_STEPS, OutcomeStatus.TIMEOUT), (EndReason.TIMEOUT, OutcomeStatus.TIMEOUT),
     (EndReason.CONTEXT_LIMIT, OutcomeStatus.TIMEOUT), (EndReason.AGENT_ERROR, OutcomeStatus.ERROR),
     (EndReason.AGENT_MESSAGE, OutcomeStatus.COMPLETED)],
)  # fmt: skip
def test_limits_and_agent_errors_are_graded_on_the_patch(
    harness: Harness, end: EndReason, status: OutcomeStatus
) -> None:
    outcome = harness.runner(agent(end, apply_gold(harness), error="x")).run(
        make_task(), make_ctx()
    )
    assert outcome.status is status
    assert outcome.reward == 1.0  # the patch the agent left resolves the issue


def test_no_change_is_reward_0(harness: Harness) -> None:
    outcome = harness.runner(agent(EndReason.AGENT_ERROR)).run(make_task(), make_ctx())
    assert (outcome.status, outcome.reward, outcome.patch) == (OutcomeStatus.ERROR, 0.0, "")
    assert outcome.test_report["evaluation"]["applied"] is False


@pytest.mark.parametrize(
    "end", [EndReason.LLM_UNAVAILABLE, EndReason.LLM_REJECTED, EndReason.AGENT_SERVER_ERROR]
)
def test_infrastructure_endings_are_aborted_without_evaluation(
    harness: Harness, end: EndReason
) -> None:
    runner = harness.runner(agent(end, apply_gold(harness), error="boom"), eval_fn=no_eval)
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None
    assert outcome.abort_reason == f"{end.value}: boom"
    final = harness.adapter.closes[-1][1]
    assert final is not None and final.status is OutcomeStatus.ABORTED


def test_agent_server_lost_after_tool_calls_is_graded_not_aborted(harness: Harness) -> None:
    # The policy's shell shares the sandbox with the agent server: `kill` of the server after a
    # failing attempt must not turn its 0 into an excluded infrastructure failure.
    def fail_then_kill(sandbox: Sandbox) -> None:
        sandbox.write_file(f"{harness.settings.workdir}/notes.txt", b"giving up\n")

    runner = harness.runner(
        agent(EndReason.AGENT_SERVER_ERROR, fail_then_kill, error="server gone", tool_calls=2)
    )
    outcome = runner.run(make_task(), make_ctx())
    assert (outcome.status, outcome.reward) == (OutcomeStatus.ERROR, 0.0)
    assert "notes.txt" in outcome.patch  # graded on what the agent left
    agent_report = outcome.test_report["agent"]
    assert agent_report["end_reason"] == "agent_server_error"
    assert agent_report["attributed_to_policy"] is True


def test_agent_server_lost_with_the_sandbox_is_aborted(harness: Harness) -> None:
    def lose_sandbox(sandbox: Sandbox) -> None:
        sandbox.destroy()  # the sandbox itself is gone: not the policy's doing

    runner = harness.runner(
        agent(EndReason.AGENT_SERVER_ERROR, lose_sandbox, error="gone", tool_calls=2),
        eval_fn=no_eval,
    )
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None
    assert outcome.abort_reason == "agent_server_error: gone"


@pytest.mark.parametrize("reason", ["cancelled", SHUTDOWN])
def test_cancel_during_the_agent_is_aborted_with_the_cancel_reason(
    harness: Harness, reason: str
) -> None:
    token = CancelToken()

    def act(_sandbox: Sandbox) -> None:
        token.cancel(reason)

    runner = harness.runner(agent(EndReason.CANCELLED, act), eval_fn=no_eval)
    outcome = runner.run(make_task(), make_ctx(cancel=token))
    assert (outcome.status, outcome.abort_reason) == (OutcomeStatus.ABORTED, reason)


def test_cancel_wins_over_a_finished_agent(harness: Harness) -> None:
    token = CancelToken()

    def act(sandbox: Sandbox) -> None:
        apply_gold(harness)(sandbox)
        token.cancel("cancelled")

    runner = harness.runner(agent(EndReason.FINISHED, act), eval_fn=no_eval)
    outcome = runner.run(make_task(), make_ctx(cancel=token))
    assert (outcome.status, outcome.abort_reason) == (OutcomeStatus.ABORTED, "cancelled")


def test_cancelled_before_start_touches_nothing(harness: Harness) -> None:
    token = CancelToken()
    token.cancel("cancelled")
    runner = harness.runner(agent(EndReason.FINISHED), eval_fn=no_eval)
    outcome = runner.run(make_task(), make_ctx(cancel=token))
    assert (outcome.status, outcome.abort_reason) == (OutcomeStatus.ABORTED, "cancelled")
    assert harness.adapter.opened == [] and harness.backend.created == []


def test_missing_image_is_aborted_and_recorded(harness: Harness) -> None:
    runner = harness.runner(agent(EndReason.FINISHED), image_for=lambda _id: "no-such-image")
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None
    assert outcome.abort_reason is not None
    assert outcome.abort_reason.startswith("sandbox creation failed:")
    assert "no-such-image" in outcome.abort_reason
    [(_, final)] = harness.adapter.closes
    assert final is not None and final.status is OutcomeStatus.ABORTED


def test_task_image_overrides_the_naming_rule(harness: Harness) -> None:
    runner = harness.runner(agent(EndReason.FINISHED), image_for=lambda _id: IMAGE)
    outcome = runner.run(make_task(image="other/image:1"), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED
    assert "other/image:1" in (outcome.abort_reason or "")
    assert outcome.retryable is False  # a missing image is not retried (never pulled)
    assert "image_namespace" in (outcome.abort_reason or "")


def test_unknown_instance_is_aborted_before_opening(harness: Harness) -> None:
    outcome = harness.runner(agent(EndReason.FINISHED)).run(
        make_task(instance_id="nobody__nothing-1"), make_ctx()
    )
    assert outcome.status is OutcomeStatus.ABORTED
    assert "unknown instance 'nobody__nothing-1'" in (outcome.abort_reason or "")
    assert "SWERL_WORKER__ROLLOUT__INSTANCES" in (outcome.abort_reason or "")  # the key to fix
    assert outcome.retryable is False  # a configuration error: final at once, not retried
    assert harness.adapter.opened == [] and harness.adapter.closes == []


def test_unreachable_adapter_is_aborted_before_any_sandbox(harness: Harness) -> None:
    harness.adapter.open_error = AdapterUnavailableError("connection refused")
    outcome = harness.runner(agent(EndReason.FINISHED)).run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED
    assert outcome.abort_reason == "LLM endpoint: cannot open the trajectory: connection refused"
    assert outcome.retryable is True  # a transient infrastructure failure: another attempt
    assert harness.backend.created == [] and harness.adapter.closes == []


def test_existing_record_is_not_reused(harness: Harness) -> None:
    from sandbox_worker.adapter_client import TrajectoryExistsError

    harness.adapter.open_error = TrajectoryExistsError("trajectory 'b1:0:0.a1' already exists")
    outcome = harness.runner(agent(EndReason.FINISHED)).run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and "not reusing" in (outcome.abort_reason or "")
    assert harness.adapter.closes == []  # somebody else's record is left alone


def test_lost_open_answer_closes_our_record_as_aborted(harness: Harness) -> None:
    from sandbox_worker.adapter_client import OpenReplyLostError

    harness.adapter.open_error = OpenReplyLostError("opened but the token was lost")
    outcome = harness.runner(agent(EndReason.FINISHED)).run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and "token was lost" in outcome.abort_reason
    assert harness.backend.created == []  # no sandbox without a token for its relay
    [(tid, closed)] = harness.adapter.closes
    assert tid == "b1:0:0.a1" and closed is not None and closed.status is OutcomeStatus.ABORTED


def test_abort_recorded_by_the_adapter_wins(harness: Harness) -> None:
    harness.adapter.kept_abort = Outcome(
        status=OutcomeStatus.ABORTED, abort_reason="engine_unavailable: all engines down"
    )
    runner = harness.runner(agent(EndReason.FINISHED, apply_gold(harness)), eval_fn=no_eval)
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED
    assert outcome.abort_reason == "adapter: engine_unavailable: all engines down"


def test_outcome_not_recorded_means_aborted(harness: Harness) -> None:
    harness.adapter.close_errors = [None, AdapterUnavailableError("adapter gone")]
    outcome = harness.runner(agent(EndReason.FINISHED, apply_gold(harness))).run(
        make_task(), make_ctx()
    )
    assert outcome.status is OutcomeStatus.ABORTED
    assert outcome.abort_reason == "could not record the outcome at the adapter: adapter gone"
    assert outcome.patch == harness.instance.patch  # kept for inspection


def test_freeze_close_failure_is_retried_at_the_end(harness: Harness) -> None:
    harness.adapter.close_errors = [AdapterError("503 store_unavailable")]
    outcome = harness.runner(agent(EndReason.FINISHED, apply_gold(harness))).run(
        make_task(), make_ctx()
    )
    assert outcome.status is OutcomeStatus.COMPLETED and outcome.reward == 1.0
    assert outcome.n_turns == COUNTERS["turns"]  # from the final close


def test_evaluation_infrastructure_failure_is_aborted(harness: Harness) -> None:
    def broken_eval(*_a: Any, **_k: Any) -> EvalReport:
        return EvalReport(instance_id=INSTANCE_ID, infra_error="sandbox creation failed: boom")

    runner = harness.runner(agent(EndReason.FINISHED, apply_gold(harness)), eval_fn=broken_eval)
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None
    assert outcome.abort_reason == (
        "evaluation infrastructure failed: sandbox creation failed: boom"
    )


def test_a_deterministic_evaluation_failure_is_not_retried(harness: Harness) -> None:
    def misconfigured(*_a: Any, **_k: Any) -> EvalReport:
        return EvalReport(
            instance_id=INSTANCE_ID,
            infra_error="no SWE-smith profile for 'acme__tool' (evaluation.eval_script)",
            config_error=True,
        )

    runner = harness.runner(agent(EndReason.FINISHED, apply_gold(harness)), eval_fn=misconfigured)
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None
    assert outcome.retryable is False  # the same on every attempt: final at once
    reason = outcome.abort_reason or ""
    assert "evaluation.eval_script" in reason and "SWERL_WORKER__ROLLOUT__EVALUATION__" in reason


def test_a_row_the_evaluation_cannot_grade_fails_before_the_agent(harness: Harness) -> None:
    """swerl's pytest script on a django row would score every patch 0: the task fails at once,
    naming the keys, before a sandbox or a trajectory record exists."""
    django = SWEInstance.model_validate(
        {**harness.instance.model_dump(), "repo": "django/django", "version": "3.0"}
    )
    settings = dataclasses.replace(
        harness.settings,
        evaluation=harness.settings.evaluation.model_copy(
            update={"eval_script": "swerl", "grading": "structured", "log_parser": "pytest"}
        ),
    )
    harness = dataclasses.replace(harness, settings=settings)
    runner = harness.runner(no_agent, eval_fn=no_eval, instances={INSTANCE_ID: django})
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.retryable is False
    reason = outcome.abort_reason or ""
    assert "not pytest" in reason and "evaluation.eval_script" in reason
    assert harness.backend.created == [] and harness.adapter.opened == []
    # the default (auto) grades the same row with the harness's script instead
    auto = harness.settings.evaluation.model_copy(
        update={"eval_script": "auto", "grading": "auto", "log_parser": "auto"}
    ).for_row(django)
    assert (auto.eval_script, auto.log_parser) == ("harness", "parse_log_django")


def no_agent(*_a: Any, **_k: Any) -> AgentRunResult:
    raise AssertionError("the agent must not run")


def test_repository_broken_by_the_agent_is_an_empty_patch(harness: Harness) -> None:
    def break_repo(sandbox: Sandbox) -> None:
        sandbox.exec("rm -rf .git", workdir=harness.settings.workdir)

    outcome = harness.runner(agent(EndReason.FINISHED, break_repo)).run(make_task(), make_ctx())
    assert (outcome.status, outcome.reward, outcome.patch) == (OutcomeStatus.COMPLETED, 0.0, "")
    assert "git diff failed" in outcome.test_report["patch_error"]


def test_runner_bug_is_aborted_and_still_cleans_up(harness: Harness) -> None:
    def crash(_sandbox: Sandbox) -> None:
        raise KeyError("bug")

    outcome = harness.runner(agent(EndReason.FINISHED, crash)).run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED
    assert outcome.abort_reason == "runner failed: KeyError: 'bug'"
    assert harness.adapter.closes[-1][1] is not None  # the record is closed as aborted
    assert [s.destroyed for s in harness.backend.created] == [True]


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x", "GIT_CONFIG_GLOBAL": "/dev/null",
           "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(
        ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_image_with_setup_commit_diffs_against_its_start_head(
    harness: Harness, tmp_path: Path
) -> None:
    """Like an official SWE-bench image: HEAD is a commit on top of base_commit."""
    template = tmp_path / "setup-image"
    shutil.copytree(harness.templates[IMAGE], template, symlinks=True)
    (template / "SETUP.txt").write_text("environment setup\n")
    _git(template, "add", "-A")
    _git(template, "commit", "-q", "-m", "setup")
    head = _git(template, "rev-parse", "HEAD")
    harness.backend.templates["setup-image"] = template
    runner = harness.runner(
        agent(EndReason.FINISHED, apply_gold(harness)), image_for=lambda _id: "setup-image"
    )
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.test_report["diff_base"] == {"commit": head, "kind": DIFF_START_HEAD}
    assert "SETUP.txt" not in outcome.patch  # the image's own commit is not the agent's work
    assert outcome.patch == harness.instance.patch
    assert (outcome.status, outcome.reward) == (OutcomeStatus.COMPLETED, 1.0)


def test_wrong_image_is_aborted_before_the_agent(harness: Harness, tmp_path: Path) -> None:
    import shutil

    template = tmp_path / "wrong-image"
    shutil.copytree(harness.templates[IMAGE], template, symlinks=True)
    _git(template, "checkout", "-q", "--orphan", "other")
    _git(template, "commit", "-q", "-m", "unrelated")
    harness.backend.templates["wrong-image"] = template
    calls: list[dict[str, Any]] = []
    runner = harness.runner(
        agent(EndReason.FINISHED, calls=calls), image_for=lambda _id: "wrong-image"
    )
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED
    assert (outcome.abort_reason or "").startswith("wrong image: its HEAD")
    assert calls == []


def test_image_labelled_for_another_commit_is_aborted_before_anything_runs(
    harness: Harness,
) -> None:
    inst = harness.instance
    assert inst.base_commit is not None
    other = "0" * 40
    harness.backend.labels[IMAGE] = {"swerl.repo": inst.repo, "swerl.base_commit": other}
    calls: list[dict[str, Any]] = []
    runner = harness.runner(agent(EndReason.FINISHED, calls=calls), image_for=lambda _id: IMAGE)
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.retryable is False
    reason = outcome.abort_reason or ""
    assert reason.startswith(f"wrong image: image {IMAGE} holds {inst.repo}@{other}"), reason
    assert f"the instance wants {inst.repo}@{inst.base_commit}" in reason
    assert calls == [] and harness.backend.created == [] and harness.adapter.opened == []
    # the right labels pass the check and the run goes on as usual
    labels = {"swerl.repo": inst.repo, "swerl.base_commit": inst.base_commit}
    harness.backend.labels[IMAGE] = labels
    outcome = harness.runner(agent(EndReason.FINISHED)).run(make_task(), make_ctx())
    assert outcome.status is not OutcomeStatus.ABORTED, outcome.abort_reason


def test_a_swesmith_snapshot_image_must_hold_the_repository_and_commit_its_id_names(
    harness: Harness,
) -> None:
    """rollout.image_dataset swesmith: one image per repository snapshot, so the label check
    compares the repository and the 8-hex commit of the instance id, not the row's commit."""
    inst = harness.instance
    assert inst.base_commit is not None
    harness.settings = dataclasses.replace(harness.settings, snapshot_images=True)
    labels = {"swerl.repo": inst.repo, "swerl.base_commit": inst.base_commit}
    harness.backend.labels[IMAGE] = labels

    def run(instance_id: str) -> Any:
        smith = inst.model_copy(update={"instance_id": instance_id})
        runner = harness.runner(agent(EndReason.FINISHED), instances={instance_id: smith})
        return runner.run(make_task(instance_id), make_ctx())

    owner, name = inst.repo.split("/")
    # the id names another snapshot commit: the row's own base commit does not save it
    other = run(f"{owner}__{name}.{'0' * 8}.lm_rewrite__abc")
    assert other.status is OutcomeStatus.ABORTED and other.retryable is False
    assert f"the instance wants {inst.repo}@00000000" in (other.abort_reason or "")
    # another repository with the same commit
    elsewhere = run(f"{owner}__other.{inst.base_commit[:8]}.lm_rewrite__abc")
    assert f"wants {owner}/other@{inst.base_commit[:8]}" in (elsewhere.abort_reason or "")
    # an id that is not of SWE-smith's form cannot be checked: a naming error, no retry
    bad = run(inst.instance_id)
    assert "wrong image naming: not a SWE-smith instance id" in (bad.abort_reason or "")
    assert bad.retryable is False
    # the snapshot the id names: the check passes
    ok = run(f"{owner}__{name}.{inst.base_commit[:8]}.lm_rewrite__abc")
    assert "wrong image" not in (ok.abort_reason or ""), ok.abort_reason


def test_worker_node_names_are_mapped_to_the_backend_alphabet(harness: Harness) -> None:
    calls: list[dict[str, Any]] = []
    runner = harness.runner(agent(EndReason.AGENT_ERROR, calls=calls))
    runner.run(make_task(), make_ctx(node="GPU_Node.7"))
    node = calls[0]["sandbox"].spec.node
    assert node != "GPU_Node.7" and node.startswith("gpu-node-") and len(node) <= 20


def test_a_swesmith_row_runs_on_its_task_state(harness: Harness, tmp_path: Path) -> None:
    """A SWE-smith row over a repository snapshot (the fixed code and its tests): the agent
    starts with the bug in and the FAIL_TO_PASS test files hidden, its patch is taken against
    that task commit, and the fix (the reverse of the row's patch) earns reward 1."""
    from sandbox_worker.evaluation.patches import files_of_test_ids
    from services.protocol.diff_reverse import reverse_unified_diff
    from tests.unit.sandbox_worker.test_task_state import git

    inst = harness.instance
    snapshot = tmp_path / "snapshot"
    shutil.copytree(harness.templates[IMAGE], snapshot, symlinks=True)
    for diff in (inst.patch, inst.test_patch):
        (tmp_path / "p.diff").write_text(diff)
        git(snapshot, "apply", str(tmp_path / "p.diff"))
    git(snapshot, "add", "-A")
    git(snapshot, "commit", "-q", "-m", "snapshot")
    harness.backend.templates[IMAGE] = snapshot
    commit8 = git(snapshot, "rev-parse", "HEAD")[:8]
    smith = inst.model_copy(
        update={
            "instance_id": f"swerl__spanlib.{commit8}.lm_rewrite__x1",
            "repo": f"swesmith/swerl__spanlib.{commit8}",
            "patch": reverse_unified_diff(inst.patch),
            "base_commit": None,
            "test_patch": "",
        }
    )
    hidden = files_of_test_ids(smith.FAIL_TO_PASS)
    seen: list[bool] = []

    def fix(sandbox: Sandbox) -> None:
        work = Path(harness.settings.workdir)
        seen.extend((work / f).exists() for f in hidden)
        sandbox.write_file(f"{work}/../fix.diff", smith.gold_patch.encode())
        res = sandbox.exec("git apply ../fix.diff", workdir=str(work))
        assert res.exit_code == 0, res.output

    runner = harness.runner(agent(EndReason.FINISHED, fix), instances={smith.instance_id: smith})
    outcome = runner.run(make_task(smith.instance_id), make_ctx())
    assert hidden and seen == [False] * len(hidden)  # the graded tests were out of sight
    assert outcome.status is OutcomeStatus.COMPLETED and outcome.reward == 1.0, outcome
    assert outcome.patch == smith.gold_patch  # against the task commit: no test deletions
    assert outcome.test_report["diff_base"]["kind"] == DIFF_BASE_COMMIT


def test_llm_call_lost_after_tool_calls_with_a_healthy_adapter_is_graded(harness: Harness) -> None:
    # From its shell the policy can hold every relay connection (503 over the relay's cap):
    # with the adapter healthy from the host, the failed call is the policy's, graded 0.
    def leave_a_note(sandbox: Sandbox) -> None:
        sandbox.write_file(f"{harness.settings.workdir}/notes.txt", b"hold the relay\n")

    runner = harness.runner(
        agent(EndReason.LLM_UNAVAILABLE, leave_a_note, error="503 from the relay", tool_calls=3)
    )
    outcome = runner.run(make_task(), make_ctx())
    assert (outcome.status, outcome.reward) == (OutcomeStatus.ERROR, 0.0)
    assert outcome.test_report["agent"]["attributed_to_policy"] is True


@pytest.mark.parametrize(("health", "tool_calls"), [(False, 3), (True, 0)])
def test_llm_call_lost_stays_an_abort_when_the_adapter_is_down_or_no_tool_ran(
    harness: Harness, health: bool, tool_calls: int
) -> None:
    harness.adapter.health = health
    runner = harness.runner(
        agent(EndReason.LLM_UNAVAILABLE, None, error="unreachable", tool_calls=tool_calls),
        eval_fn=no_eval,
    )
    outcome = runner.run(make_task(), make_ctx())
    assert outcome.status is OutcomeStatus.ABORTED and outcome.reward is None


@dataclasses.dataclass
class ToolStarts:
    """The fields of the OpenHands SDK's ActionEvent the progress callback reads."""

    tool_name: str
    tool_call_id: str = "call-1"
    action: object = None


def test_the_run_tells_its_phases_and_the_running_tool(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Progress for users: sandbox start, agent (the tool that runs now, from the agent's event
    callbacks), grading; in that order, each observed while it is the current phase."""
    ctx = make_ctx()
    seen: list[tuple[ProgressPhase, str | None]] = []

    def run_agent(sandbox: Sandbox, *_a: Any, callbacks: Any = (), **_k: Any) -> AgentRunResult:
        seen.append(ctx.progress.snapshot())
        for on_event in callbacks:
            on_event(ToolStarts("terminal"))
        seen.append(ctx.progress.snapshot())
        return AgentRunResult(EndReason.FINISHED, 1, 0.1, None, "finished", EventSummary())

    def evaluation(*_a: Any, **_k: Any) -> EvalReport:
        seen.append(ctx.progress.snapshot())
        return EvalReport(instance_id=harness.instance.instance_id, infra_error="stop here")

    create = harness.backend.create

    def creating(spec: Any) -> Sandbox:
        seen.append(ctx.progress.snapshot())
        return create(spec)

    monkeypatch.setattr(harness.backend, "create", creating)
    harness.runner(run_agent, eval_fn=evaluation).run(make_task(), ctx)
    assert seen == [
        (ProgressPhase.SANDBOX_START, None),
        (ProgressPhase.AGENT, None),
        (ProgressPhase.AGENT, "terminal"),
        (ProgressPhase.GRADING, None),
    ]
