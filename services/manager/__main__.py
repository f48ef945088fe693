"""``python -m services.manager``: the rollout manager service (see ``--help``)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from dataclasses import asdict

import redis.exceptions

from services.cli import add_common_arguments, configure_logging, load_cli_config, service_parser
from services.config import dump_config
from services.manager.config import ManagerConfig
from services.manager.dispatcher import Dispatcher
from services.metrics_server import MetricsServerError, add_metrics_argument, serve_metrics
from services.queue.connection import connect
from services.queue.dispatcher import DispatcherQueue
from services.queue.submitter import SubmitterQueue

DESCRIPTION = """\
Rollout manager of swerl: dispatches rollout tasks from Redis to the sandbox workers.

The trainer (or the job API) submits batches through the Python API
(services.manager.RolloutManager); this service moves their tasks onto per-node Redis streams,
never giving a node more than its free slots + --prefetch, takes back the tasks of nodes whose
heartbeat expired (XAUTOCLAIM after queue.claim_min_idle_s), and rides out Redis restarts.
All state lives in Redis, so the service can be restarted at any time; run one per deployment.
"""

EPILOG = """\
configuration (lowest precedence first): defaults < YAML file (--config or $SWERL_CONFIG,
section "manager:") < environment (SWERL_MANAGER__PREFETCH=2, SWERL_MANAGER__QUEUE__PREFIX=x:)
< flags. Workers must use the same queue.prefix.

examples:
  python -m services.manager --redis redis://head:6379/0
  python -m services.manager --redis redis://127.0.0.1:6379/0 --prefetch 2 --log-level DEBUG
  python -m services.manager --redis redis://127.0.0.1:6379/0 --status   # nodes and batches
  python -m services.manager --print-config                              # effective config
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = service_parser("python -m services.manager", DESCRIPTION, EPILOG)
    p.add_argument("--redis", metavar="URL", help="Redis URL, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--prefetch", type=int, help="tasks queued per node beyond its slots (1)")
    p.add_argument("--prefix", help="Redis key prefix shared with the workers (swerl:)")
    p.add_argument("--status", action="store_true", help="print nodes and batches as JSON, exit")
    add_metrics_argument(p)
    add_common_arguments(p, "manager")
    return p.parse_args(argv)


def cluster_status(queue: SubmitterQueue) -> dict[str, object]:
    """``--status``: the nodes, the pending count and every batch's progress."""
    return {
        "nodes": [asdict(n) for n in queue.nodes()],
        "pending": queue.pending_count(),
        "batches": [queue.progress(b).model_dump(mode="json") for b in queue.batch_ids()],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {
        "redis_url": args.redis,
        "prefetch": args.prefetch,
        "queue.prefix": args.prefix,
        "metrics_port": args.metrics_port,
    }
    cfg = load_cli_config(ManagerConfig, "manager", args, overrides)
    if isinstance(cfg, int):
        return cfg
    configure_logging(cfg.log_level)
    client = connect(cfg.redis_url, cfg.queue)
    if args.status:
        try:
            print(json.dumps(cluster_status(SubmitterQueue(client, cfg.queue)), indent=2))
        except redis.exceptions.RedisError as exc:
            print(
                f"python -m services.manager: cannot read the status from Redis at "
                f"{cfg.redis_url}: {exc} (is Redis running? set --redis or "
                "SWERL_MANAGER__REDIS_URL)",
                file=sys.stderr,
            )
            return 1
        finally:
            client.close()
        return 0
    logging.getLogger("swerl.manager").info("effective config:\n%s", dump_config(cfg))
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("swerl.manager").info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    dispatcher = Dispatcher(DispatcherQueue(client, cfg.queue), cfg)
    try:
        serve_metrics(
            dispatcher.metrics.registry,
            cfg.metrics_port,
            cfg.metrics_addr,
            logging.getLogger("swerl.manager"),
        )
    except MetricsServerError as exc:
        print(f"python -m services.manager: {exc}", file=sys.stderr)
        client.close()
        return 1
    dispatcher.run(stop)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
