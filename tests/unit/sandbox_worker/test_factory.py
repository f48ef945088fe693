"""``build_runner`` (the worker's one runner factory) and the worker CLI's refusal."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandbox_worker.config import WorkerConfig
from sandbox_worker.factory import (
    KindRouter,
    NodeCleanup,
    backend_kwargs,
    build_runner,
    load_task_instances,
    runner_settings,
)
from sandbox_worker.openhands.server import AgentServerBundle
from sandbox_worker.relay.host_relay import RelayHub
from sandbox_worker.runner import (
    CancelToken,
    RunContext,
    RunnerUnavailableError,
    TrajectoryRunner,
)
from sandbox_worker.sandbox_names import sandbox_node_name
from sandbox_worker.sandbox_runner import SandboxTrajectoryRunner
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from sandbox_worker.testing.simulated import SimulatedRunner
from sandbox_worker.toy import ToyTrajectoryRunner
from services.datasets import DatasetError
from services.protocol.trajectory import OutcomeStatus
from tests.support.paths import REPO_ROOT
from tests.unit.sandbox_worker.conftest import INSTANCES, make_task


def cfg(**rollout: object) -> WorkerConfig:
    return WorkerConfig(backend="docker", rollout=rollout)


def test_settings_follow_the_config() -> None:
    c = cfg(
        adapter_url="http://10.1.2.3:8200/",
        relay_port=19000,
        sandbox={"cpus": 2.0, "memory_mb": 1024, "pids": 64, "disk_mb": 512, "inodes": 5000},
        evaluation={
            "test_timeout_s": 60,
            "test_timeout_by_repo": {"sympy/sympy": 3600},
            "limits": {"cpus": 0.5, "disk_mb": 300},
            "grading": "swebench",
            "infra_rules": {"o/p": {"protected_paths": ["bin/test"]}},
        },
    )
    s = runner_settings(c.rollout)
    assert s.evaluation.grading == "swebench" and s.evaluation.restore_test_infra
    assert s.evaluation.infra_rules["o/p"].protected_paths == ("bin/test",)
    assert (s.adapter_host, s.adapter_port, s.relay_port) == ("10.1.2.3", 8200, 19000)
    assert (s.limits.cpus, s.limits.memory_mb, s.limits.pids) == (2.0, 1024, 64)
    assert (s.limits.disk_mb, s.limits.inodes) == (512, 5000)
    assert (s.evaluation.test_timeout_s, s.evaluation.limits.cpus) == (60, 0.5)
    assert s.evaluation.for_repo("sympy/sympy").test_timeout_s == 3600
    assert s.evaluation.limits.disk_mb == 300
    assert s.evaluation.workdir == s.workdir == "/testbed"
    assert runner_settings(cfg(adapter_url="https://adapter").rollout).adapter_port == 443
    assert s.snapshot_images is False  # one image per instance unless the images are SWE-smith's
    for dataset, snapshot in (("swesmith", True), ("swegym", False), ("swebench", False)):
        assert runner_settings(cfg(image_dataset=dataset).rollout).snapshot_images is snapshot
    # per row by default: the harness's script and parser where the row has a spec
    assert (s.evaluation.eval_script, s.evaluation.log_parser) == ("auto", "auto")
    assert runner_settings(cfg().rollout).evaluation.grading == "auto"


def test_the_harness_eval_script_is_a_worker_setting() -> None:
    """evaluation.eval_script / log_parser / test_cmd reach the evaluation; inconsistent or
    unknown values fail at start-up naming the key."""
    harness = {"eval_script": "harness", "grading": "swebench", "log_parser": "auto"}
    ev = runner_settings(cfg(evaluation={**harness, "test_cmd": "pytest -x"}).rollout).evaluation
    assert (ev.eval_script, ev.grading, ev.log_parser, ev.test_cmd) == (
        "harness", "swebench", "auto", "pytest -x"
    )  # fmt: skip
    with pytest.raises(ValidationError, match=r'eval_script "harness" needs evaluation\.grading'):
        cfg(evaluation={"eval_script": "harness", "grading": "structured"})
    with pytest.raises(ValidationError, match=r"evaluation\.log_parser 'parse_log_nope'"):
        cfg(evaluation={"log_parser": "parse_log_nope"})


def test_backend_kwargs() -> None:
    rc = cfg(
        backend={"state_root": "/s", "docker_host": "unix:///d.sock", "rootfs_cache": "/c"}
    ).rollout
    assert backend_kwargs("docker", rc) == {
        "state_root": Path("/s"),
        "docker_host": "unix:///d.sock",
    }
    assert backend_kwargs("bwrap", rc) == {
        "state_root": Path("/s"),
        "cgroups": "auto",
        "rootfs_cache": Path("/c"),
    }


def test_instances_default_to_the_mini_set_and_must_be_distinct(tmp_path: Path) -> None:
    assert "swerl__strkit-1" in load_task_instances([])
    with pytest.raises(DatasetError, match="also in another file"):
        load_task_instances([str(INSTANCES), str(INSTANCES)])


def _local(tmp_path: Path) -> tuple[LocalDirBackend, RelayHub]:
    return LocalDirBackend({}, tmp_path / "scratch"), RelayHub()


def test_build_runner_builds_the_simulated_runner() -> None:
    runner, cleaner = build_runner(WorkerConfig(backend="simulated"))
    assert isinstance(runner, SimulatedRunner) and cleaner is None
    assert runner.probe is None
    with pytest.raises(ValueError, match="probe needs a Redis client"):
        build_runner(WorkerConfig(backend="simulated", simulated={"probe": True}))


def test_build_runner_sends_the_worker_token(tmp_path: Path) -> None:
    backend, hub = _local(tmp_path)
    try:
        router, _ = build_runner(cfg(adapter_token="t" * 24), backend=backend, hub=hub)
        runner = router.runner_for("swe")  # type: ignore[attr-defined]
        headers = runner.adapter._client.headers  # type: ignore[attr-defined]
        assert headers["authorization"] == "Bearer " + "t" * 24
    finally:
        hub.close()


def test_build_runner_wires_a_runner_and_a_name_mapping_cleaner(tmp_path: Path) -> None:
    backend, hub = _local(tmp_path)
    try:
        router, cleaner = build_runner(cfg(image_namespace="swebench"), backend=backend, hub=hub)
        assert isinstance(router, KindRouter) and isinstance(router, TrajectoryRunner)
        runner = router.runner_for("swe")
        assert isinstance(runner, SandboxTrajectoryRunner) and isinstance(cleaner, NodeCleanup)
        assert isinstance(router.runner_for("toy"), ToyTrajectoryRunner)
        assert router.runner_for("toy").adapter is runner.adapter  # one adapter client
        assert runner.image_for("django__django-11099") == (
            "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
        )
        assert "swerl__spanlib-1" in runner.instances
        # The cleaner speaks worker node names; the backend sees the mapped name.
        spec = runner.agent_spec(make_task(), sandbox_node_name("Node_A"), "img")
        (tmp_path / "template").mkdir()
        backend.templates["img"] = tmp_path / "template"
        spec = dataclasses.replace(spec, workdir=str(tmp_path / "wd"))
        backend.create(spec)
        assert cleaner.list_sandboxes("Node_A") == [spec.sandbox_id]
        assert cleaner.cleanup_node("Node_A") == 1 and backend.live == {}
    finally:
        hub.close()


def test_image_dataset_maps_rows_to_their_published_images(tmp_path: Path) -> None:
    """SWE-Gym and SWE-smith rows in the worker's task files run in their datasets' images."""
    patch = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"
    base = {"patch": patch, "problem_statement": "", "FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": []}
    gym = {**base, "instance_id": "Project-MONAI__MONAI-1121", "repo": "Project-MONAI/MONAI"}
    smith = {**base, "instance_id": "oauthlib__oauthlib.1fd52536.lm_rewrite__q9ve64pd"}
    smith |= {"repo": "swesmith/oauthlib__oauthlib.1fd52536"}
    expected = {
        "swegym": (gym, "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-1121:latest"),
        "swesmith": (smith, "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536:latest"),
    }
    backend, hub = _local(tmp_path)
    try:
        for dataset, (row, image) in expected.items():
            path = tmp_path / f"{dataset}.jsonl"
            path.write_text(json.dumps(row) + "\n")
            config = cfg(instances=[str(path)], image_dataset=dataset)
            router, _ = build_runner(config, backend=backend, hub=hub)
            runner = router.runner_for("swe")
            assert isinstance(runner, SandboxTrajectoryRunner)
            assert runner.image_for(str(row["instance_id"])) == image
            with pytest.raises(ValueError, match="no instance 'other-1'"):
                runner.image_for("other-1")
        # the paper's mixture in one task file: SWE-smith rows keep SWE-smith's images
        both = tmp_path / "mixture.jsonl"
        both.write_text(json.dumps(gym) + "\n" + json.dumps(smith) + "\n")
        config = cfg(instances=[str(both)], image_dataset="swegym")
        router, _ = build_runner(config, backend=backend, hub=hub)
        runner = router.runner_for("swe")
        assert isinstance(runner, SandboxTrajectoryRunner)
        for dataset, (row, image) in expected.items():
            assert runner.image_for(str(row["instance_id"])) == image, dataset
        with pytest.raises(ValidationError, match="image_dataset"):
            cfg(image_dataset="swe-other")
    finally:
        hub.close()


def test_build_runner_refusals(tmp_path: Path) -> None:
    backend, hub = _local(tmp_path)
    try:
        with pytest.raises(RunnerUnavailableError, match="cannot load the task instances"):
            build_runner(cfg(instances=[str(tmp_path / "none.jsonl")]), backend=backend, hub=hub)
        with pytest.raises(RunnerUnavailableError, match="bad image naming"):
            build_runner(cfg(image_namespace="Bad Namespace"), backend=backend, hub=hub)
        with pytest.raises(RunnerUnavailableError, match="agent server"):
            build_runner(
                cfg(), backend=backend, hub=hub, bundle=AgentServerBundle("/nope", "/nope-venv")
            )
        with pytest.raises(ValueError, match="RelayHub"):
            build_runner(cfg(), backend=backend)
    finally:
        hub.close()


def test_a_toy_only_worker_needs_no_sandbox_backend_nor_agent_bundle() -> None:
    """kinds ["toy"]: nothing of the SWE runner is built (no backend, bundle or instances)."""
    toy_only = WorkerConfig(
        backend="docker",
        kinds=["toy"],
        rollout={"instances": ["/nonexistent.jsonl"], "adapter_url": "http://127.0.0.1:9"},
    )
    router, cleaner = build_runner(toy_only, bundle=AgentServerBundle("/nope", "/nope-venv"))
    assert cleaner is None and isinstance(router, KindRouter)
    assert isinstance(router.runner_for("toy"), ToyTrajectoryRunner)
    with pytest.raises(KeyError, match="no 'swe' runner on this worker"):
        router.runner_for("swe")


def test_the_router_aborts_a_task_of_a_kind_it_does_not_run_for_good() -> None:
    toy_only = WorkerConfig(backend="bwrap", kinds=["toy"])
    router, _ = build_runner(toy_only)
    outcome = router.run(make_task(), RunContext("n", CancelToken(), logging.getLogger("t")))
    assert outcome.status is OutcomeStatus.ABORTED and outcome.retryable is False
    assert outcome.abort_reason is not None
    assert "runs no 'swe' tasks" in outcome.abort_reason and "worker.kinds" in outcome.abort_reason


def test_worker_kinds_are_validated() -> None:
    with pytest.raises(ValidationError, match="distinct"):
        WorkerConfig(kinds=["toy", "toy"])
    with pytest.raises(ValidationError, match="kinds"):
        WorkerConfig(kinds=["math"])
    with pytest.raises(ValidationError, match="kinds"):
        WorkerConfig(kinds=[])


@pytest.mark.slow  # starts the worker CLI
def test_worker_cli_exits_2_when_the_runner_cannot_be_built(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "SWERL_WORKER__ROLLOUT__INSTANCES": f"[{tmp_path / 'missing.jsonl'}]",
    }
    res = subprocess.run(
        [sys.executable, "-m", "sandbox_worker", "--backend", "docker",
         "--redis", "redis://127.0.0.1:1/0", "--node", "n1"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "cannot load the task instances" in res.stderr
    assert "missing.jsonl" in res.stderr
