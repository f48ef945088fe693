"""Benchmark of the execution plane: the Redis queue, the manager and the sandbox workers.

Usage (from the repository root)::

    .venv/bin/python bench/bench_execution.py            # full sizes
    .venv/bin/python bench/bench_execution.py --quick    # smaller batches, about a minute
    .venv/bin/python bench/bench_execution.py --only queue --json out.json

Everything runs in real processes against a private ``redis-server`` with AOF on
(``--appendfsync everysec`` by default, the production setting; ``always`` fsyncs every write,
which costs about 6 ms per write on this machine's disk): the rollout manager is
``python -m services.manager`` and every node is ``python -m sandbox_worker --backend simulated``.
The SIMULATED runner only sleeps, so these sections measure scheduling, not sandboxes.

Sections (``--only`` picks some; each is a function registered with :func:`section`):

* ``queue``: no-op tasks. (a) back-to-back on one node with one slot: wall time per task from
  submission to the last result, i.e. the scheduling overhead per task (target < 5 ms);
  (b) submit->result latency of single tasks on an idle cluster; (c) throughput in tasks/s
  with 4 nodes x 4 slots.
* ``utilisation``: 8 nodes x 4 slots, task durations lognormal (long-tailed). Slot-time
  utilisation while tasks are queued: the busy slot-time (from every run's start and end,
  recorded by the runner's probe) divided by slots x the window from submission to the start of
  the last task; after that nothing is queued any more (target >= 95%).
* ``sandbox``: real dockerd and bubblewrap, side by side: create+destroy latency of a plain
  sandbox and of the agent sandbox as the trajectory runner makes it (LLM relay, read-only
  agent-server bundle), and one evaluation of a mini instance's gold patch in a fresh sandbox.

Nothing here asserts; the script prints the figures (and writes them with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sandbox_worker.testing.probe import SimulatedProbe  # noqa: E402
from services.manager.client import RolloutManager  # noqa: E402
from services.processes import ManagedProcess, launch  # noqa: E402
from services.protocol import RolloutRequest  # noqa: E402
from services.queue.config import QueueConfig  # noqa: E402
from services.queue.submitter import SubmitterQueue  # noqa: E402
from tests.support.redis import RedisServer, start_redis, stop_redis  # noqa: E402

Figures = dict[str, Any]


@dataclass
class Bench:
    """What a section gets: the sizes to use and the shared Redis."""

    quick: bool
    redis: RedisServer
    figures: dict[str, Figures] = field(default_factory=dict)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes so far (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


@dataclass
class Cluster:
    manager: RolloutManager
    pids: list[int]  # manager, workers and redis-server: the CPU the scheduling costs

    def cpu(self) -> float:
        return cpu_seconds(self.pids)


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    run: Callable[[Bench], Figures]


SECTIONS: dict[str, Section] = {}


def section(name: str, title: str) -> Callable[[Callable[[Bench], Figures]], Callable]:
    """Register a benchmark section (run in registration order)."""

    def register(fn: Callable[[Bench], Figures]) -> Callable[[Bench], Figures]:
        SECTIONS[name] = Section(name, title, fn)
        return fn

    return register


# ---------------------------------------------------------------------------- cluster
@contextmanager
def cluster(
    bench: Bench,
    prefix: str,
    nodes: int,
    slots: int,
    *,
    prefetch: int = 1,
    worker_env: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """A manager process and ``nodes`` worker processes on their own key prefix."""
    url = bench.redis.url
    env = {
        "PYTHONDONTWRITEBYTECODE": "1",
        "SWERL_WORKER__LOG_LEVEL": "WARNING",
        "SWERL_MANAGER__LOG_LEVEL": "WARNING",
        **(worker_env or {}),
    }
    logs = bench.redis.data_dir / f"logs-{prefix}"  # removed with the bench's Redis
    argvs = {"manager": [sys.executable, "-m", "services.manager", "--redis", url,
                         "--prefix", prefix, "--prefetch", str(prefetch)]}  # fmt: skip
    for i in range(nodes):
        argvs[f"node{i}"] = [sys.executable, "-m", "sandbox_worker", "--redis", url,
                             "--prefix", prefix, "--node", f"node{i}", "--slots", str(slots),
                             "--backend", "simulated"]  # fmt: skip
    procs: list[ManagedProcess] = []
    queue = SubmitterQueue(url, QueueConfig(prefix=prefix))
    try:
        for name, argv in argvs.items():
            procs.append(launch(name, argv, logs / f"{name}.log", env=env, cwd=ROOT))
        deadline = time.monotonic() + 60
        while sum(n.alive for n in queue.nodes()) < nodes:
            if time.monotonic() > deadline or any(not p.running() for p in procs):
                tails = "\n".join(f"--- {p.name}\n{p.log_tail(1000)}" for p in procs)
                raise RuntimeError(f"the {nodes} workers did not come up:\n{tails}")
            time.sleep(0.05)
        time.sleep(0.3)  # let the manager see every heartbeat
        assert bench.redis.proc is not None
        yield Cluster(RolloutManager(queue=queue), [p.pid for p in procs] + [bench.redis.proc.pid])
    finally:
        for p in procs:
            p.signal_group(signal.SIGTERM)
        for p in procs:
            p.stop()
        queue.close()


def run_batch(mgr: RolloutManager, instance_ids: list[str], n_samples: int = 1) -> float:
    """Submit one batch and read every result; returns the wall time in seconds."""
    if n_samples > 1000:  # a request allows at most 1024 samples per prompt
        instance_ids, n_samples = instance_ids * (n_samples // 1000), 1000
    t0 = time.perf_counter()
    batch = mgr.submit(RolloutRequest(instance_ids=instance_ids, n_samples=n_samples))
    n = sum(1 for _ in mgr.results(batch, timeout_s=600))
    wall = time.perf_counter() - t0
    if n != len(instance_ids) * n_samples:
        raise RuntimeError(f"batch {batch}: {n} results")
    return wall


# ---------------------------------------------------------------------------- sections
@section("queue", "queue throughput with no-op tasks")
def bench_queue(bench: Bench) -> Figures:
    n_serial = 300 if bench.quick else 1000
    n_parallel = 600 if bench.quick else 3000
    out: Figures = {}
    with cluster(bench, "bench-q1:", nodes=1, slots=1) as c:
        run_batch(c.manager, ["warmup"], 10)
        cpu0 = c.cpu()
        wall = run_batch(c.manager, ["noop"], n_serial)
        out["serial_tasks"] = n_serial
        out["overhead_ms_per_task"] = 1000 * wall / n_serial
        out["cpu_ms_per_task"] = 1000 * (c.cpu() - cpu0) / n_serial
        latencies = [1000 * run_batch(c.manager, ["single"]) for _ in range(20)]
        out["idle_latency_ms_median"] = statistics.median(latencies)
        out["idle_latency_ms_max"] = max(latencies)
    print(
        f"  1 node x 1 slot, {n_serial} back-to-back no-op tasks: "
        f"{out['overhead_ms_per_task']:.2f} ms per task end to end (target < 5 ms); "
        f"CPU of manager + worker + redis: {out['cpu_ms_per_task']:.2f} ms per task"
    )
    print(
        f"  submit -> result of a single task on an idle cluster (20 runs): median "
        f"{out['idle_latency_ms_median']:.1f} ms, max {out['idle_latency_ms_max']:.1f} ms"
    )
    with cluster(bench, "bench-q2:", nodes=4, slots=4) as c:
        run_batch(c.manager, ["warmup"], 32)
        cpu0 = c.cpu()
        wall = run_batch(c.manager, ["noop"], n_parallel)
        out["parallel_tasks"] = n_parallel
        out["throughput_tasks_per_s"] = n_parallel / wall
        out["parallel_cpu_ms_per_task"] = 1000 * (c.cpu() - cpu0) / n_parallel
    print(
        f"  4 nodes x 4 slots, {n_parallel} no-op tasks: "
        f"{out['throughput_tasks_per_s']:.0f} tasks/s end to end; "
        f"CPU {out['parallel_cpu_ms_per_task']:.2f} ms per task"
    )
    return out


def utilisation(
    runs: list[dict[str, Any]], slots: int, window: tuple[float, float]
) -> tuple[float, float]:
    """Busy slot-time inside ``window`` over its capacity; returns (utilisation, busy s)."""
    start, end = window
    busy = sum(max(0.0, min(r["t1"], end) - max(r["t0"], start)) for r in runs)
    return busy / (slots * (end - start)), busy


@section("utilisation", "slot-time utilisation, 8 nodes x 4 slots, lognormal durations")
def bench_utilisation(bench: Bench) -> Figures:
    nodes, slots = 8, 4
    n = 150 if bench.quick else 500
    # Real trajectories take minutes; 1 s keeps the run short while per-task scheduling cost
    # (a few ms) stays small next to the task, as it is in production.
    median_s, sigma = 1.0, 1.0
    env = {
        "SWERL_WORKER__SIMULATED__PROBE": "true",
        "SWERL_WORKER__SIMULATED__LOGNORMAL_MEDIAN_S": str(median_s),
        "SWERL_WORKER__SIMULATED__LOGNORMAL_SIGMA": str(sigma),
        "SWERL_WORKER__SIMULATED__MAX_DURATION_S": "30",
    }
    with cluster(bench, "bench-u:", nodes=nodes, slots=slots, worker_env=env) as c:
        mgr = c.manager
        # Workers are long-lived in production: warm them up (imports, script cache) first.
        run_batch(mgr, ["warmup.sleep1"], 2 * nodes * slots)
        cpu0 = c.cpu()
        t_submit = time.time()
        batch = mgr.submit(RolloutRequest(instance_ids=["lognormal"], n_samples=n))
        results = list(mgr.results(batch, timeout_s=600))
        t_done = time.time()
        cpu = c.cpu() - cpu0
        probe = SimulatedProbe(mgr.queue.redis, "bench-u:")
        runs = [r for r in probe.runs() if r["task_id"].startswith(f"{batch}:")]
        prog = mgr.progress(batch)
    if len(results) != n or len(runs) != n:
        raise RuntimeError(f"{len(results)} results, {len(runs)} runs for {n} tasks")
    last_start = max(r["t0"] for r in runs)
    util, busy_s = utilisation(runs, nodes * slots, (t_submit, last_start))
    total_run = sum(r["t1"] - r["t0"] for r in runs)
    out: Figures = {
        "tasks": n,
        "slots": nodes * slots,
        "lognormal_median_s": median_s,
        "lognormal_sigma": sigma,
        "mean_task_s": total_run / n,
        "window_s": last_start - t_submit,
        "makespan_s": t_done - t_submit,
        "ideal_makespan_s": total_run / (nodes * slots),
        "utilisation_while_queued": util,
        "busy_slot_s_in_window": busy_s,
        "rebalanced": prog.rebalanced,
        "cpu_s": cpu,
        "load_average_1m": os.getloadavg()[0],
    }
    print(
        f"  {n} tasks, durations lognormal(median {median_s} s, sigma {sigma}), "
        f"mean {out['mean_task_s']:.2f} s, max {max(r['t1'] - r['t0'] for r in runs):.1f} s"
    )
    print(
        f"  slot-time utilisation while tasks are queued: {100 * util:.1f}% "
        f"(target >= 95%) over {out['window_s']:.1f} s"
    )
    print(
        f"  makespan {out['makespan_s']:.1f} s (sum of durations / slots: "
        f"{out['ideal_makespan_s']:.1f} s); queued tasks moved to free slots: {prog.rebalanced}"
    )
    print(
        f"  CPU of manager + workers + redis: {cpu:.1f} s; "
        f"load average {out['load_average_1m']:.1f} on {os.cpu_count()} CPUs"
    )
    return out


# ---------------------------------------------------------------------------- sandboxes
SANDBOX_BENCH_INSTANCE = "swerl__spanlib-1"


def _create_destroy(backend: Any, spec: Any) -> float:
    """Seconds to create a sandbox and destroy it again."""
    t0 = time.perf_counter()
    backend.create(spec).destroy()
    return time.perf_counter() - t0


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "n": len(ordered),
        "min_s": ordered[0],
        "median_s": statistics.median(ordered),
        "max_s": ordered[-1],
    }


@section("sandbox", "sandbox create+destroy latency and one evaluation, docker vs bwrap")
def bench_sandbox(bench: Bench) -> Figures:
    """Real dockerd and bubblewrap (images built if missing). Per backend: create+destroy of
    (a) a plain sandbox (no network, as the evaluation uses), (b) the agent sandbox exactly as
    the trajectory runner makes it (LLM relay to a host port, the read-only agent-server bundle
    mounted); then the gold patch of one mini instance evaluated in a fresh sandbox."""
    import shutil
    import socket
    import tempfile

    from sandbox_worker.backends import make_backend
    from sandbox_worker.backends.base import SandboxLimits, SandboxSpec
    from sandbox_worker.evaluation import EvalConfig, evaluate_patch
    from sandbox_worker.images import DEFAULT_INSTANCES, instance_image
    from sandbox_worker.openhands.server import AgentServerBundle
    from sandbox_worker.relay.host_relay import RelayHub
    from sandbox_worker.sandbox_runner import RunnerSettings, SandboxTrajectoryRunner
    from services.datasets import load_instances
    from services.protocol.tasks import RolloutTask
    from tests.support.docker import build_task_images, ensure_dockerd

    reps = 3 if bench.quick else 10
    evals = 1 if bench.quick else 3
    ensure_dockerd()
    build_task_images()  # cached: a no-op when current
    [instance] = load_instances(DEFAULT_INSTANCES, only=[SANDBOX_BENCH_INSTANCE])
    image = instance_image(SANDBOX_BENCH_INSTANCE)
    node = f"bench-{os.getpid() % 100000}"
    root = Path(tempfile.mkdtemp(prefix="swerl-bs-"))  # short: unix socket paths
    hub = RelayHub()
    listener = socket.socket()  # stands in for the adapter: the relay's target
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    settings = RunnerSettings(adapter_host="127.0.0.1", adapter_port=listener.getsockname()[1])
    task = RolloutTask(task_id="bench:0:0", batch_id="bench", group_id="bench:0",
                       instance_id=SANDBOX_BENCH_INSTANCE)  # fmt: skip
    limits = SandboxLimits(cpus=1.0, memory_mb=2048, pids=512)
    out: Figures = {"instance": SANDBOX_BENCH_INSTANCE, "image": image}
    backends: dict[str, Any] = {}
    try:
        for kind in ("docker", "bwrap"):
            backend = backends[kind] = make_backend(kind, state_root=root / kind, hub=hub)
            runner = SandboxTrajectoryRunner(
                backend, hub, AgentServerBundle.current(), None, {}, settings,  # type: ignore[arg-type]
                image_for=lambda _id: image,
            )  # fmt: skip
            plain: list[float] = []
            agent: list[float] = []
            for i in range(reps + 1):  # the first round warms caches and is not counted
                spec = SandboxSpec(image=image, node=node, sandbox_id=f"plain-{i}", limits=limits)
                t_plain = _create_destroy(backend, spec)
                t_agent = _create_destroy(backend, runner.agent_spec(task, node, image))
                if i:
                    plain.append(t_plain)
                    agent.append(t_agent)
            reports = []
            for _ in range(evals):
                config = EvalConfig(test_timeout_s=300, limits=limits)
                reports.append(
                    evaluate_patch(
                        backend, instance, instance.patch, image, node=node, config=config
                    )
                )
            out[kind] = {
                "create_destroy_plain": _stats(plain),
                "create_destroy_agent": _stats(agent),
                "evaluation": _stats([r.duration_s for r in reports]),
                "evaluation_resolved": all(r.resolved for r in reports),
                "evaluation_infra_errors": [r.infra_error for r in reports if r.infra_error],
            }
            left = backend.list_sandboxes(node)
            if left:
                raise RuntimeError(f"{kind}: sandboxes left behind: {left}")
    finally:
        for backend in backends.values():
            backend.cleanup_node(node)
        listener.close()
        hub.close()
        shutil.rmtree(root, ignore_errors=True)
    out["load_average_1m"] = os.getloadavg()[0]

    def cell(kind: str, key: str) -> str:
        st = out[kind][key]
        return f"{st['median_s']:.2f} s ({st['min_s']:.2f}-{st['max_s']:.2f})"

    rows = [
        ("create+destroy, no network", "create_destroy_plain"),
        ("create+destroy, agent sandbox", "create_destroy_agent"),
        ("evaluation of the gold patch", "evaluation"),
    ]
    print(f"  median (min-max) of {reps} create+destroy and {evals} evaluation(s), {image}")
    print(f"  {'':32} {'docker':>24} {'bwrap':>24}")
    for label, key in rows:
        print(f"  {label:32} {cell('docker', key):>24} {cell('bwrap', key):>24}")
    resolved = {k: out[k]["evaluation_resolved"] for k in ("docker", "bwrap")}
    print(f"  gold patch resolved: {resolved}; load average {out['load_average_1m']:.1f}")
    return out


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller batches (about a minute)")
    p.add_argument("--only", action="append", choices=sorted(SECTIONS), help="run this section")
    p.add_argument("--json", type=Path, help="also write the figures to this file")
    p.add_argument(
        "--appendfsync", choices=["everysec", "always"], default="everysec", help="AOF fsync policy"
    )
    args = p.parse_args(argv)
    names = args.only or list(SECTIONS)
    server = start_redis(appendonly=True)
    client = redis.Redis(port=server.port)
    client.config_set("appendfsync", args.appendfsync)
    client.close()
    print(f"redis-server with AOF on, appendfsync {args.appendfsync}; {os.cpu_count()} CPUs")
    bench = Bench(quick=args.quick, redis=server)
    try:
        for name in names:
            sec = SECTIONS[name]
            print(f"== {name}: {sec.title}", flush=True)
            bench.figures[name] = sec.run(bench)
    finally:
        stop_redis(server)
    if args.json:
        args.json.write_text(json.dumps(bench.figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
