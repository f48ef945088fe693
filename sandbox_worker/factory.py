"""The one runner factory of the sandbox worker: :func:`build_runner`.

``build_runner(cfg, client) -> (runner, node_cleaner)`` builds the
:class:`~sandbox_worker.runner.TrajectoryRunner` that ``cfg.backend`` names:

* ``simulated``: :class:`sandbox_worker.testing.simulated.SimulatedRunner` (TEST MACHINERY: it
  only sleeps), with its Redis probe when ``cfg.simulated.probe`` is set; no node cleaner. It
  runs tasks of every kind.
* ``docker`` / ``bwrap``: a :class:`KindRouter` that runs each task with the runner of its
  ``kind`` (``cfg.kinds`` says which are built):

  - ``swe``: the real runner, :class:`sandbox_worker.sandbox_runner.SandboxTrajectoryRunner`,
    wired from ``cfg.rollout``: the sandbox backend with one shared relay hub, the agent-server
    bundle (this process's own Python and venv, mounted read-only into sandboxes), the adapter
    client, the task instances and the image naming rule;
  - ``toy``: :class:`sandbox_worker.toy.ToyTrajectoryRunner` (no container): the adapter client,
    the adapter's per-trajectory chat URL and the tool latency model (``toy_tool_latency``).

  A task of a kind this worker does not run is aborted with a reason naming ``worker.kinds``,
  final (no retry).

Anything missing is a :class:`~sandbox_worker.runner.RunnerUnavailableError` with what to do
(the worker then exits with status 2).

The returned node cleaner maps the worker's node name to the backends' alphabet
(:func:`sandbox_worker.sandbox_names.sandbox_node_name`) before ``cleanup_node``, so a restarted
worker removes exactly the sandboxes (agent and evaluation) its crashed predecessor left.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis

from sandbox_worker import image_pull, images, task_sets
from sandbox_worker.adapter_client import AdapterClient, TrajectoryRecords
from sandbox_worker.backends import SandboxBackend, SandboxInfraError, make_backend
from sandbox_worker.backends.base import SandboxLimits
from sandbox_worker.config import SandboxLimitsConfig, TrajectoryRunnerConfig, WorkerConfig
from sandbox_worker.evaluation import EvalConfig
from sandbox_worker.openhands.server import AgentServerBundle, AgentServerError
from sandbox_worker.outcomes import aborted
from sandbox_worker.relay.host_relay import RelayHub
from sandbox_worker.runner import (
    NodeCleaner,
    RunContext,
    RunnerUnavailableError,
    TrajectoryRunner,
)
from sandbox_worker.sandbox_names import sandbox_node_name
from sandbox_worker.sandbox_runner import RunnerSettings, SandboxTrajectoryRunner
from sandbox_worker.testing.probe import SimulatedProbe
from sandbox_worker.testing.simulated import SimulatedRunner
from sandbox_worker.toy import ChatEndpoint, ToyTrajectoryRunner
from services.datasets import DatasetError, load_instances
from services.protocol.instance import SWEInstance
from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome


class KindRouter:
    """Runs each task with the runner of its ``kind`` (thread-safe if the runners are)."""

    def __init__(self, runners: Mapping[str, TrajectoryRunner]) -> None:
        if not runners:
            raise ValueError("a KindRouter needs at least one runner")
        self.runners = dict(runners)

    def runner_for(self, kind: str) -> TrajectoryRunner:
        """The runner of ``kind``; KeyError naming the kinds served when there is none."""
        if kind not in self.runners:
            raise KeyError(f"no {kind!r} runner on this worker (kinds: {sorted(self.runners)})")
        return self.runners[kind]

    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        runner = self.runners.get(task.kind)
        if runner is None:
            return aborted(
                f"this worker runs no {task.kind!r} tasks (worker.kinds = "
                f"{sorted(self.runners)}; SWERL_WORKER__KINDS)",
                retryable=False,
            )
        return runner.run(task, ctx)


class NodeCleanup:
    """``cleanup_node`` / ``list_sandboxes`` of a backend, addressed by worker node name."""

    def __init__(self, backend: SandboxBackend) -> None:
        self.backend = backend

    def cleanup_node(self, node: str) -> int:
        return self.backend.cleanup_node(sandbox_node_name(node))

    def list_sandboxes(self, node: str) -> list[str]:
        return self.backend.list_sandboxes(sandbox_node_name(node))


def sandbox_limits(cfg: SandboxLimitsConfig) -> SandboxLimits:
    return SandboxLimits(
        cpus=cfg.cpus,
        memory_mb=cfg.memory_mb,
        pids=cfg.pids,
        disk_mb=cfg.disk_mb,
        inodes=cfg.inodes,
    )


def backend_kwargs(name: str, cfg: TrajectoryRunnerConfig) -> dict[str, Any]:
    """``make_backend`` arguments for backend ``name`` from the config (unset: defaults)."""
    b = cfg.backend
    kwargs: dict[str, Any] = {}
    if b.state_root is not None:
        kwargs["state_root"] = Path(b.state_root)
    if name == "docker" and b.docker_host is not None:
        kwargs["docker_host"] = b.docker_host
    if name == "bwrap":
        kwargs["cgroups"] = b.cgroups
        if b.rootfs_cache is not None:
            kwargs["rootfs_cache"] = Path(b.rootfs_cache)
    return kwargs


def load_task_instances(paths: list[str]) -> dict[str, SWEInstance]:
    """Every instance of the configured files (default: the mini task set), by id."""
    files = [Path(p) for p in paths] or [images.DEFAULT_INSTANCES]
    found: dict[str, SWEInstance] = {}
    for path in files:
        for inst in load_instances(path):
            if inst.instance_id in found:
                raise DatasetError(f"{path}: instance {inst.instance_id!r} is also in another file")
            found[inst.instance_id] = inst
    return found


def worker_task_instances(rc: TrajectoryRunnerConfig) -> dict[str, SWEInstance]:
    """The plain ids of ``rollout.instances`` and the ``<dataset>/<id>`` keys of
    ``rollout.datasets`` and the task-set directory (sandbox_worker/task_sets.py)."""
    found = load_task_instances(rc.instances)
    directory = Path(rc.task_sets_dir) if rc.task_sets_dir else task_sets.default_task_sets_dir()
    found.update(task_sets.load_keyed_instances(rc.datasets, directory))
    return found


def runner_settings(cfg: TrajectoryRunnerConfig) -> RunnerSettings:
    url = urlsplit(cfg.adapter_url)
    port = url.port or (443 if url.scheme == "https" else 80)
    return RunnerSettings(
        adapter_host=str(url.hostname),
        adapter_port=port,
        relay_port=cfg.relay_port,
        workdir=cfg.workdir,
        limits=sandbox_limits(cfg.sandbox),
        openhands=cfg.openhands,
        snapshot_images=cfg.image_dataset == "swesmith",
        evaluation=EvalConfig(
            workdir=cfg.workdir,
            test_timeout_s=cfg.evaluation.test_timeout_s,
            test_timeout_by_repo=cfg.evaluation.test_timeout_by_repo,
            step_timeout_s=cfg.evaluation.step_timeout_s,
            harness_grace_s=cfg.evaluation.harness_grace_s,
            limits=sandbox_limits(cfg.evaluation.limits),
            grading=cfg.evaluation.grading,
            restore_test_infra=cfg.evaluation.restore_test_infra,
            infra_rules=cfg.evaluation.infra_rules,
            eval_script=cfg.evaluation.eval_script,
            log_parser=cfg.evaluation.log_parser,
            test_cmd=cfg.evaluation.test_cmd,
            canary_count=cfg.evaluation.canary_count,
            hide_git=cfg.evaluation.hide_git,
        ),
        agent_server_startup_s=cfg.agent_server_startup_s,
        max_patch_bytes=cfg.max_patch_bytes,
    )


def build_runner(
    cfg: WorkerConfig,
    client: redis.Redis | None = None,
    *,
    backend: SandboxBackend | None = None,
    hub: RelayHub | None = None,
    instances: Mapping[str, SWEInstance] | None = None,
    adapter: TrajectoryRecords | None = None,
    bundle: AgentServerBundle | None = None,
) -> tuple[TrajectoryRunner, NodeCleaner | None]:
    """The runner and node cleaner for ``cfg.backend`` and ``cfg.kinds`` (see the module
    docstring).

    ``client`` is the worker's Redis connection (the simulated runner's probe writes there).
    The keyword arguments replace the parts of the real runners built from ``cfg`` (tests,
    embedding); a backend passed in must use the given ``hub`` for its relays.
    """
    if cfg.backend == "simulated":
        return _simulated_runner(cfg, client), None
    rc = cfg.rollout
    adapter = adapter or _adapter_client(rc)
    runners: dict[str, TrajectoryRunner] = {}
    cleaner: NodeCleanup | None = None
    if "swe" in cfg.kinds:
        runners["swe"], cleaner = _swe_runner(
            cfg, backend=backend, hub=hub, instances=instances, adapter=adapter, bundle=bundle
        )
    if "toy" in cfg.kinds:
        chat = ChatEndpoint(rc.adapter_url, timeout_s=rc.toy_call_timeout_s)
        runners["toy"] = ToyTrajectoryRunner(adapter, chat, latency=rc.toy_tool_latency)
    return KindRouter(runners), cleaner


def _swe_runner(
    cfg: WorkerConfig,
    *,
    backend: SandboxBackend | None,
    hub: RelayHub | None,
    instances: Mapping[str, SWEInstance] | None,
    adapter: TrajectoryRecords,
    bundle: AgentServerBundle | None,
) -> tuple[SandboxTrajectoryRunner, NodeCleanup]:
    rc = cfg.rollout
    bundle = _checked_bundle(bundle)
    task_instances = _task_instances(rc, instances)
    if backend is None:
        hub = hub or RelayHub()
        backend = _sandbox_backend(cfg.backend, rc, hub)
    elif hub is None:
        raise ValueError("a backend passed to build_runner needs the RelayHub it relays with")
    runner = SandboxTrajectoryRunner(
        backend,
        hub,
        bundle,
        adapter,
        task_instances,
        runner_settings(rc),
        image_for=_image_naming(rc, task_instances),
    )
    return runner, NodeCleanup(backend)


def _simulated_runner(cfg: WorkerConfig, client: redis.Redis | None) -> SimulatedRunner:
    probe = None
    if cfg.simulated.probe:
        if client is None:
            raise ValueError("the simulated runner's probe needs a Redis client")
        probe = SimulatedProbe(client, cfg.queue.prefix)
    return SimulatedRunner(cfg.simulated, probe)


def _checked_bundle(bundle: AgentServerBundle | None) -> AgentServerBundle:
    try:
        bundle = bundle or AgentServerBundle.current()
        bundle.check()
    except AgentServerError as exc:
        raise RunnerUnavailableError(f"cannot run the OpenHands agent server: {exc}") from exc
    return bundle


def _task_instances(
    rc: TrajectoryRunnerConfig, instances: Mapping[str, SWEInstance] | None
) -> dict[str, SWEInstance]:
    try:
        return dict(instances) if instances is not None else worker_task_instances(rc)
    except (DatasetError, OSError) as exc:
        raise RunnerUnavailableError(f"cannot load the task instances: {exc}") from exc


def _sandbox_backend(name: str, rc: TrajectoryRunnerConfig, hub: RelayHub) -> SandboxBackend:
    try:
        return make_backend(name, hub=hub, **backend_kwargs(name, rc))
    except (SandboxInfraError, OSError, ValueError) as exc:
        raise RunnerUnavailableError(f"the {name} backend is not usable: {exc}") from exc


def _adapter_client(rc: TrajectoryRunnerConfig) -> AdapterClient:
    return AdapterClient(
        rc.adapter_url,
        timeout_s=rc.adapter_timeout_s,
        attempts=rc.adapter_attempts,
        token=rc.adapter_token,
    )


def _image_naming(
    rc: TrajectoryRunnerConfig, task_instances: Mapping[str, SWEInstance]
) -> Callable[[str], str]:
    """The instance id -> image rule; a bad namespace or tag fails here, not once per task."""
    namespace, tag, dataset = rc.image_namespace, rc.image_tag, rc.image_dataset

    def image_for(instance_id: str) -> str:
        if "/" in instance_id:  # <dataset>/<id>: the dataset's own image rule
            keyed = task_instances.get(instance_id)
            if keyed is None:
                raise ValueError(f"no instance {instance_id!r} in the task sets")
            return task_sets.keyed_image(instance_id, keyed, rc.dataset_images)
        if dataset is not None:
            instance = task_instances.get(instance_id)
            if instance is None:
                raise ValueError(f"no instance {instance_id!r} in the task files")
            return image_pull.image_name(instance, dataset)
        return images.instance_image(instance_id, namespace=namespace, tag=tag)

    try:
        image_for(next(iter(task_instances)) if task_instances else "probe")
    except ValueError as exc:
        raise RunnerUnavailableError(f"bad image naming settings: {exc}") from exc
    return image_for
