"""End to end: rollout tasks through the real trajectory runner (issue 4).

Real dockerd, real Redis, the real OpenHands agent server inside the task's container (from the
read-only bundle), the real adapter, the reference engine. The successful agent is the
**SCRIPTED** engine replaying each instance's gold patch (:mod:`sandbox_worker.tasks.scripted`):
test machinery, not a model that solves anything. The random tiny model shows an unsuccessful
trajectory ending cleanly.

* ``test_scripted_agent_fixes_instance_*``: reward 1, ``completed``, the full token record
  (one segment, the scripted outputs as the generated tokens, logprobs, weight version), the
  outcome attached to the record; docker and bwrap.
* ``test_random_model_*``: ends cleanly with reward 0 and a full record.
* ``test_missing_image_is_aborted``: ``aborted`` with the image in the reason, never a 0.
* ``test_worker_process_and_manager_*``: ``python -m sandbox_worker --backend docker`` and the
  rollout manager run 2 instances x 2 samples, all reward 1.
"""

from __future__ import annotations

import contextlib
import math
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import redis
import yaml
from transformers import AutoTokenizer

from sandbox_worker.config import WorkerConfig
from sandbox_worker.factory import KindRouter, build_runner
from sandbox_worker.sandbox_runner import DIFF_BASE_COMMIT, SandboxTrajectoryRunner
from sandbox_worker.tasks.scripted import build_script
from services.manager import ManagerConfig, RolloutManager
from services.processes import launch
from services.protocol.tasks import AgentLimits, RolloutRequest, RolloutTask, SamplingConfig
from services.protocol.trajectory import Outcome, OutcomeStatus, TrajectoryMeta
from services.queue.config import QueueConfig
from services.store import load_trajectory
from tests.e2e.conftest import (
    ENGINE_WEIGHT_VERSION,
    WORKER_TOKEN,
    AdapterProcess,
    RolloutStack,
    run_context,
)
from tests.support.engines import REPO_ROOT

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPTED_INSTANCE = "swerl__spanlib-1"
LIMITS = AgentLimits(max_steps=8, wall_time_s=600, max_context_tokens=32768)
SAMPLING = SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=2048)


def make_runner(
    stack: RolloutStack, adapter: AdapterProcess, backend: str = "docker"
) -> SandboxTrajectoryRunner:
    cfg = WorkerConfig(
        backend=backend,
        rollout={
            "adapter_url": adapter.url,
            "adapter_token": WORKER_TOKEN,
            "sandbox": {"cpus": 1.0, "memory_mb": 2048, "pids": 512},
            "evaluation": {"test_timeout_s": 300},
            "openhands": {"num_retries": 0},
        },
    )
    router, _ = build_runner(
        cfg, backend=stack.backends[backend], hub=stack.hub, instances=stack.instances
    )
    assert isinstance(router, KindRouter)
    runner = router.runner_for("swe")
    assert isinstance(runner, SandboxTrajectoryRunner)
    return runner


def task(batch: str, instance_id: str, **kw: Any) -> RolloutTask:
    return RolloutTask(
        task_id=f"{batch}:0:0",
        batch_id=batch,
        group_id=f"{batch}:0",
        instance_id=instance_id,
        limits=kw.pop("limits", LIMITS),
        sampling=kw.pop("sampling", SAMPLING),
        **kw,
    )


def check_record(stack: RolloutStack, adapter: AdapterProcess, t: RolloutTask) -> dict[str, Any]:
    """The record is complete: identifiers, turns with generated tokens and logprobs, version,
    the outcome attached; returns it (JSON view)."""
    rec = adapter.record(t.trajectory_id)
    assert rec["status"] == "closed"
    meta = rec["meta"]
    assert (meta["task_id"], meta["batch_id"], meta["group_id"], meta["instance_id"]) == (
        t.task_id,
        t.batch_id,
        t.group_id,
        t.instance_id,
    )
    turns = [turn for seg in rec["segments"] for turn in seg["turns"]]
    assert turns, "no turn recorded"
    for turn in turns:
        n = len(turn["output_ids"])
        assert n > 0 and len(turn["output_logprobs"]) == n
        assert all(math.isfinite(lp) and lp <= 0.0 for lp in turn["output_logprobs"])
        assert turn["weight_version"] == int(ENGINE_WEIGHT_VERSION)
    # The binary record (what the trainer reads) agrees: action mask 1 exactly on the
    # generated tokens, the behaviour logprobs on them.
    client = redis.Redis.from_url(stack.redis_url)
    try:
        record = load_trajectory(client, t.trajectory_id)
    finally:
        client.close()
    for seg_json, seg in zip(rec["segments"], record.segments, strict=True):
        flat = seg.flatten()
        mask = flat["action_mask"]
        assert [tok for tok, m in zip(flat["tokens"], mask, strict=True) if m] == [
            i for turn in seg_json["turns"] for i in turn["output_ids"]
        ]
        assert [lp for lp, m in zip(flat["logprobs"], mask, strict=True) if m] == pytest.approx(
            [lp for turn in seg_json["turns"] for lp in turn["output_logprobs"]]
        )
        versions = {v for v, m in zip(flat["versions"], mask, strict=True) if m}
        assert versions == {int(ENGINE_WEIGHT_VERSION)}
    assert record.outcome is not None
    return rec


@dataclass
class Run:
    backend: str
    node: str
    task: RolloutTask
    outcome: Outcome


SCRIPTED_RUNS = {"docker": "swerl__spanlib-1", "bwrap": "swerl__strkit-3"}  # strkit-3: base64
RANDOM_MAX_TOKENS = 32


@pytest.fixture(scope="module")
def agent_runs(rollout_stack: RolloutStack) -> dict[str, Run]:
    """The in-process trajectories of this module, run **concurrently** (one thread each, as a
    worker's slots would) to keep the suite short: the scripted engine in docker and in bwrap,
    the random model in docker. Each test below checks one of them."""
    stack = rollout_stack
    plans: dict[str, tuple[str, AdapterProcess, RolloutTask]] = {
        f"scripted-{b}": (b, stack.scripted, task(f"e2e-scripted-{b}", i))
        for b, i in SCRIPTED_RUNS.items()
    }
    plans["random"] = (
        "docker",
        stack.random,
        task(
            "e2e-random",
            "swerl__tinyini-2",
            limits=AgentLimits(max_steps=2, wall_time_s=600, max_context_tokens=32768),
            sampling=SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=RANDOM_MAX_TOKENS),
        ),
    )

    def run(backend: str, adapter: AdapterProcess, t: RolloutTask) -> Run:
        node = stack.node()
        outcome = make_runner(stack, adapter, backend).run(t, run_context(node))
        return Run(backend, node, t, outcome)

    with ThreadPoolExecutor(len(plans)) as pool:
        futures = {name: pool.submit(run, *plan) for name, plan in plans.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
def test_scripted_agent_fixes_instance(
    rollout_stack: RolloutStack, agent_runs: dict[str, Run], backend: str
) -> None:
    stack = rollout_stack
    run = agent_runs[f"scripted-{backend}"]
    node, t, outcome = run.node, run.task, run.outcome
    instance = stack.instances[SCRIPTED_RUNS[backend]]

    assert outcome.status is OutcomeStatus.COMPLETED, outcome.abort_reason or outcome.test_report
    assert outcome.reward == 1.0
    report = outcome.test_report
    assert report["agent"]["end_reason"] == "finished"
    assert report["agent"]["tools_called"] == ["terminal", "terminal", "finish"]
    assert report["evaluation"]["resolved"] is True
    assert report["diff_base"] == {"commit": instance.base_commit, "kind": DIFF_BASE_COMMIT}
    assert outcome.patch == instance.patch  # git's diff of the applied gold patch
    for phase in ("agent", "eval", "sandbox_create", "total"):
        assert outcome.durations[phase] > 0, outcome.durations

    rec = check_record(stack, stack.scripted, t)
    assert rec["outcome"]["status"] == "completed" and rec["outcome"]["reward"] == 1.0
    assert len(rec["segments"]) == 1, rec["counters"]
    turns = rec["segments"][0]["turns"]
    tok = AutoTokenizer.from_pretrained(str(stack.model_dir))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    [entry] = build_script([instance])
    assert [turn["output_ids"] for turn in turns] == [
        [*tok.encode(text, add_special_tokens=False), im_end] for text in entry["turns"]
    ]
    changed = instance.patch.split(" b/", 1)[1].split("\n", 1)[0]
    assert changed in tok.decode(turns[2]["observation_ids"])  # `git status --short`
    assert outcome.n_turns == 3
    assert outcome.n_tokens == len(rec["segments"][0]["prompt_ids"]) + sum(
        len(x["observation_ids"]) + len(x["output_ids"]) for x in turns
    )
    assert stack.backends[backend].list_sandboxes(node) == []


def test_random_model_ends_cleanly_with_reward_0(
    rollout_stack: RolloutStack, agent_runs: dict[str, Run]
) -> None:
    stack = rollout_stack
    run = agent_runs["random"]
    node, t, outcome, max_tokens = run.node, run.task, run.outcome, RANDOM_MAX_TOKENS

    # The random model's replies are plain text (the SDK ends the run: completed) or, should
    # it produce tool calls, the step limit ends it (timeout) or a call fails (error).
    assert outcome.status in (
        OutcomeStatus.COMPLETED,
        OutcomeStatus.TIMEOUT,
        OutcomeStatus.ERROR,
    ), outcome.abort_reason
    assert outcome.reward == 0.0
    agent = outcome.test_report["agent"]
    assert agent["end_reason"] in ("agent_message", "max_steps", "agent_error")
    assert 1 <= agent["n_steps"] <= 2
    assert outcome.test_report["evaluation"]["resolved"] is False
    rec = check_record(stack, stack.random, t)
    turns = [turn for seg in rec["segments"] for turn in seg["turns"]]
    assert len(turns) == agent["n_steps"] == outcome.n_turns  # every LLM call is recorded
    assert all(len(turn["output_ids"]) <= max_tokens for turn in turns)
    assert rec["outcome"]["reward"] == 0.0
    assert stack.backends["docker"].list_sandboxes(node) == []


def test_missing_image_is_aborted(rollout_stack: RolloutStack) -> None:
    stack = rollout_stack
    runner = make_runner(stack, stack.scripted)
    node = stack.node()
    t = task("e2e-noimage", SCRIPTED_INSTANCE, image="swerl/sweb.eval.x86_64.not-built:latest")

    outcome = runner.run(t, run_context(node))

    assert outcome.status is OutcomeStatus.ABORTED
    assert outcome.reward is None
    assert "sandbox creation failed" in (outcome.abort_reason or "")
    assert "swerl/sweb.eval.x86_64.not-built:latest" in (outcome.abort_reason or "")
    rec = stack.scripted.record(t.trajectory_id)
    assert rec["status"] == "closed"
    assert rec["outcome"]["status"] == "aborted" and rec["outcome"]["reward"] is None
    assert rec["segments"] == []
    assert stack.backends["docker"].list_sandboxes(node) == []


def test_worker_process_and_manager_run_a_batch(rollout_stack: RolloutStack) -> None:
    """``python -m sandbox_worker --backend docker`` + the rollout manager: 2 x 2 -> reward 1."""
    stack = rollout_stack
    node = stack.node()
    prefix = f"{node}:"
    config = stack.root / f"worker-{node}.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "worker": {
                    "heartbeat_interval_s": 1.0,
                    "rollout": {
                        "adapter_url": stack.scripted.url,
                        "adapter_token": WORKER_TOKEN,
                        "backend": {"state_root": str(stack.root / "docker")},
                        "sandbox": {"cpus": 1.0, "memory_mb": 2048, "pids": 512},
                        "evaluation": {"test_timeout_s": 300},
                        "openhands": {"num_retries": 0},
                    },
                }
            }
        )
    )
    argv = [
        sys.executable, "-m", "sandbox_worker",
        "--redis", stack.redis_url, "--node", node, "--slots", "4",
        "--backend", "docker", "--config", str(config), "--prefix", prefix,
    ]  # fmt: skip
    log_path = stack.root / "logs" / f"worker-{node}.log"
    env = {"PYTHONPATH": str(REPO_ROOT)}
    worker = launch("worker", argv, log_path, env=env, cwd=REPO_ROOT, grace_s=60)
    manager = RolloutManager(stack.redis_url, ManagerConfig(queue=QueueConfig(prefix=prefix)))
    try:
        manager.start()
        ids = ["swerl__tinyini-1", "swerl__strkit-2"]
        batch = manager.submit(
            RolloutRequest(
                batch_id="e2e-worker",
                instance_ids=ids,
                n_samples=2,
                limits=LIMITS,
                sampling=SAMPLING,
                max_attempts=1,  # an infrastructure failure must show, not be retried away
            )
        )
        results = manager.collect(batch, timeout_s=600)
    finally:
        manager.close()
        rc = worker.stop()  # SIGTERM: the worker drains and exits 0
    log_text = worker.log()
    assert rc == 0, log_text[-3000:]
    assert len(results) == 4, log_text[-3000:]
    by_instance: dict[str, int] = {}
    for r in results:
        assert r.outcome.status is OutcomeStatus.COMPLETED, (
            r.outcome.abort_reason,
            log_text[-3000:],
        )
        assert r.outcome.reward == 1.0
        assert r.node == node and r.attempt == 1
        by_instance[r.outcome.test_report["image"]] = (
            by_instance.get(r.outcome.test_report["image"], 0) + 1
        )
        rec = stack.scripted.record(r.trajectory_id)
        assert rec["outcome"]["reward"] == 1.0 and rec["meta"]["batch_id"] == batch
        assert len(rec["segments"]) == 1 and len(rec["segments"][0]["turns"]) == 3
    assert sorted(by_instance.values()) == [2, 2]
    assert sorted(r.task_id for r in results) == [
        f"{batch}:{p}:{s}" for p in (0, 1) for s in (0, 1)
    ]
    assert stack.backends["docker"].list_sandboxes(node) == []


CONTAINMENT_PROBE = """
import socket, sys, urllib.request
own = "http://127.0.0.1:18080/t/%s/v1/models" % sys.argv[3]
print("adapter", urllib.request.urlopen(own, timeout=20).status)
for host, port in [("127.0.0.1", int(sys.argv[1])), ("127.0.0.1", int(sys.argv[2])),
                   ("192.0.2.1", 80)]:
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        print("open", host, port)
    except OSError as exc:
        print("closed", host, port, type(exc).__name__)
    finally:
        s.close()
"""


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
def test_agent_sandbox_reaches_the_adapter_and_nothing_else(
    rollout_stack: RolloutStack, backend: str
) -> None:
    """The runner's own agent sandbox: the adapter answers through the relay (the trajectory's
    own routes; tests/e2e/test_sandbox_isolation.py has the rest); a TCP server on the host's
    loopback, the adapter's real port and any other address are unreachable."""
    stack = rollout_stack
    runner = make_runner(stack, stack.scripted, backend)
    node = stack.node()
    t = task(f"e2e-contain-{backend}", SCRIPTED_INSTANCE)
    token = runner.adapter.open(TrajectoryMeta(trajectory_id=t.trajectory_id))
    spec = runner.agent_spec(t, node, runner.image_for(SCRIPTED_INSTANCE), token)
    accepted: list[object] = []
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.2)
        host_port = server.getsockname()[1]
        with stack.backends[backend].create(spec) as sandbox:
            res = sandbox.exec(
                [
                    "python3",
                    "-c",
                    CONTAINMENT_PROBE,
                    str(host_port),
                    str(stack.scripted.port),
                    t.trajectory_id,
                ],
                timeout_s=120,
            )
        with contextlib.suppress(TimeoutError):
            accepted.append(server.accept())
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0] == "adapter 200"
    assert lines[1].startswith(f"closed 127.0.0.1 {host_port}")
    assert lines[2].startswith(f"closed 127.0.0.1 {stack.scripted.port}")
    assert lines[3].startswith("closed 192.0.2.1 80")
    assert accepted == [], "the sandbox reached a server on the host's loopback"
    assert stack.backends[backend].list_sandboxes(node) == []
