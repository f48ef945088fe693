"""``python -m sandbox_worker``: the sandbox worker of one node (see ``--help``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from sandbox_worker.config import WorkerConfig
from sandbox_worker.factory import build_runner
from sandbox_worker.runner import RunnerUnavailableError
from sandbox_worker.worker import NodeConflictError, Worker
from services.cli import (
    EXIT_CONFIG,
    add_common_arguments,
    configure_logging,
    load_cli_config,
    service_parser,
)
from services.metrics_server import MetricsServerError, add_metrics_argument, serve_metrics
from services.queue.connection import connect

DESCRIPTION = """\
Sandbox worker of swerl: runs rollout tasks of one node from Redis.

It reads tasks from this node's Redis stream only when a slot is free (--slots), runs each
trajectory (sandbox -> OpenHands agent -> patch -> evaluation in a fresh sandbox) and reports
the outcome; it heartbeats to Redis with its slot and busy counts. On SIGTERM/SIGINT it stops
taking work, hands back queued tasks, lets running ones finish for worker.shutdown_grace_s,
then stops and hands back the rest (a second signal skips the wait). On start it removes the
sandboxes a crashed previous run of the same --node left behind.

--backend simulated runs the SIMULATED runner (it only sleeps; for scheduling tests and
benchmarks): a "sleep<ms>" token in the instance id sets the duration, "abort" / "abort<k>"
fail attempts as infrastructure, see sandbox_worker/testing/simulated.py.
"""

EPILOG = """\
configuration (lowest precedence first): defaults < YAML file (--config or $SWERL_CONFIG,
section "worker:") < environment (SWERL_WORKER__SLOTS=4, SWERL_WORKER__QUEUE__PREFIX=x:) < flags.
The queue.prefix must match the rollout manager's. --print-config shows every key; the ones
a task set usually sets (SWERL_WORKER__ROLLOUT__..., SWERL_WORKER__ROLLOUT__EVALUATION__...):
  rollout.instances           dataset files of the task rows (JSONL/JSON/parquet)
  rollout.image_dataset       swebench | swegym | swesmith: the published image names to run
  evaluation.eval_script      auto (default: per row, the harness's script where the row's
                              repository has a harness spec, swerl's otherwise) | swerl
                              (test_cmd + the row's test files) | harness (the official
                              harness's script; SWE-smith rows: their profile's command)
  evaluation.grading          auto (default: structured with swerl's script, swebench with
                              the harness's) | structured | swebench
  evaluation.log_parser       auto (default: the parser of the row's script) | pytest |
                              parse_log_<name>
  evaluation.test_cmd         swerl's test command (python3 -m pytest -rA -p no:cacheprovider)
  evaluation.test_timeout_by_repo  seconds per repository, e.g. {"django/django": 1800}
A choice that cannot grade a row (swerl's pytest script on a django row ...) fails its task at
once, not retried, with a message naming these keys.

environment: DOCKER_HOST, the docker backend's engine (default unix:///run/swerl/docker.sock);
SWERL_IMAGE_NAMESPACE, the prefix of locally built image names (default swerl).

examples:
  python -m sandbox_worker --redis redis://head:6379/0 --node node3 --slots 8 --backend docker
  python -m sandbox_worker --redis redis://127.0.0.1:6379/0 --node sim1 --slots 2 \\
      --backend simulated
exit status: 0 after a clean shutdown, 2 for a configuration error, 1 when the worker cannot start.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = service_parser("python -m sandbox_worker", DESCRIPTION, EPILOG)
    p.add_argument("--redis", metavar="URL", help="Redis URL, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--node", help="node name (default: the host name); one worker per node")
    p.add_argument("--slots", type=int, help="trajectories run at once on this node (1)")
    p.add_argument("--backend", choices=["docker", "bwrap", "simulated"], help="sandbox backend")
    p.add_argument(
        "--kinds",
        type=lambda text: [k.strip() for k in text.split(",") if k.strip()],
        metavar="K1,K2",
        help="task kinds this worker runs, of swe,toy (default both; toy needs no container)",
    )
    p.add_argument("--grace", type=float, metavar="S", help="shutdown grace period in seconds")
    p.add_argument("--prefix", help="Redis key prefix shared with the manager (swerl:)")
    add_metrics_argument(p)
    add_common_arguments(p, "worker")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {
        "redis_url": args.redis,
        "node": args.node,
        "slots": args.slots,
        "backend": args.backend,
        "kinds": args.kinds,
        "shutdown_grace_s": args.grace,
        "queue.prefix": args.prefix,
        "metrics_port": args.metrics_port,
    }
    cfg = load_cli_config(WorkerConfig, "worker", args, overrides)
    if isinstance(cfg, int):
        return cfg
    configure_logging(cfg.log_level, tag=cfg.node)
    client = connect(cfg.redis_url, cfg.queue)
    try:
        runner, backend = build_runner(cfg, client)
    except RunnerUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    from services.queue.worker import WorkerQueue

    worker = Worker(cfg, runner, backend=backend, queue=WorkerQueue(client, cfg.queue))
    try:
        serve_metrics(
            worker.metrics.registry,
            cfg.metrics_port,
            cfg.metrics_addr,
            logging.getLogger("swerl.worker"),
        )
    except MetricsServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        client.close()
        return 1

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("swerl.worker").info("signal %d: shutting down", signum)
        worker.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        return worker.run()
    except NodeConflictError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        client.close()


if __name__ == "__main__":
    sys.exit(main())
