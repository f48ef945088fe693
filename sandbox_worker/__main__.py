"""``python -m sandbox_worker``: the sandbox worker of one node (see ``--help``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from sandbox_worker.config import WorkerConfig
from sandbox_worker.runner import RunnerUnavailableError, build_runner
from sandbox_worker.worker import NodeConflictError, Worker
from services.config import ConfigError, dump_config, load_config
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
fail attempts as infrastructure, see sandbox_worker/runner.py.
"""

EPILOG = """\
configuration (lowest precedence first): defaults < YAML file (--config or $SWERL_CONFIG,
section "worker:") < environment (SWERL_WORKER__SLOTS=4, SWERL_WORKER__QUEUE__PREFIX=x:) < flags.
The queue.prefix must match the rollout manager's.

examples:
  python -m sandbox_worker --redis redis://head:6379/0 --node node3 --slots 8 --backend docker
  python -m sandbox_worker --redis redis://127.0.0.1:6379/0 --node sim1 --slots 2 \\
      --backend simulated
exit status: 0 after a clean shutdown, 2 for a configuration error, 1 when the worker cannot start.
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m sandbox_worker",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--redis", metavar="URL", help="Redis URL, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--node", help="node name (default: the host name); one worker per node")
    p.add_argument("--slots", type=int, help="trajectories run at once on this node (1)")
    p.add_argument("--backend", choices=["docker", "bwrap", "simulated"], help="sandbox backend")
    p.add_argument("--config", metavar="FILE", help="YAML config file (section 'worker')")
    p.add_argument("--grace", type=float, metavar="S", help="shutdown grace period in seconds")
    p.add_argument("--prefix", help="Redis key prefix shared with the manager (swerl:)")
    p.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--print-config", action="store_true", help="print the effective config, exit")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides: dict = {
        "redis_url": args.redis,
        "node": args.node,
        "slots": args.slots,
        "backend": args.backend,
        "shutdown_grace_s": args.grace,
        "log_level": args.log_level,
    }
    if args.prefix is not None:
        overrides["queue"] = {"prefix": args.prefix}
    try:
        cfg = load_config(WorkerConfig, section="worker", path=args.config, overrides=overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_config(cfg), end="")
        return 0
    logging.basicConfig(
        level=cfg.log_level,
        format=f"%(asctime)s %(levelname)s [{cfg.node}] %(name)s: %(message)s",
    )
    client = connect(cfg.redis_url, cfg.queue)
    try:
        runner, backend = build_runner(cfg, client)
    except RunnerUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from services.queue.store import TaskQueue

    worker = Worker(cfg, runner, backend=backend, queue=TaskQueue(client, cfg.queue))

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
