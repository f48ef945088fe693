"""``python -m trainer serve``: the trainer service (see ``--help``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from services.cli import add_common_arguments, configure_logging, load_cli_config, service_parser
from services.metrics_server import MetricsServerError, add_metrics_argument, serve_metrics
from services.queue.connection import connect
from trainer.service.config import SECTION, TrainerServiceConfig
from trainer.service.follower import TrainerFollower
from trainer.service.service import TrainerService

DESCRIPTION = """\
Trainer service of swerl: claims the train jobs of its trainer group from the job API's Redis
(one active train job per group; the rest wait in line), writes each job's run config
(<runs_dir>/<job id>/run.yaml: the base config with the job's spec over it), runs the training
command on it, heartbeats the job's lease with the run's progress (step, phase, reward from
metrics.jsonl), honours cancel, and marks the job succeeded or failed from the exit status.
A job whose trainer died is claimed again and started with --resume from its checkpoint dir.

A group spanning N nodes (nnodes = N): the service on node rank 0 (the leader) claims a job
only while the services of ranks 1..N-1 (the followers) are present, and hands it to them;
each follower runs the same run config with its own command (its torchrun --node-rank) and
stops when the job ends. A follower never claims.
See docs/training.md ("The trainer service") and docs/api.md ("Execution").
"""

EPILOG = """\
configuration (lowest precedence first): defaults < YAML file (--config or $SWERL_CONFIG,
section "trainer_service:") < environment (SWERL_TRAINER_SERVICE__GROUP=a) < flags.
trainer_service.command is the training command before --config FILE [--resume] (default:
this Python's -m trainer train), e.g. [torchrun, --nproc-per-node=8, -m, trainer, train].

exit status: 0 stopped (SIGTERM/SIGINT; a running job is given back to the queue);
2 configuration error; 1 the metrics port (--metrics-port) cannot be served.

examples:
  python -m trainer serve --redis redis://127.0.0.1:6379/0 --group default
  python -m trainer serve --config node.yaml --base-config /etc/swerl/trainer.yaml
  python -m trainer serve --print-config
  python -m trainer serve --nnodes 4 --node-rank 2   # a follower node of a 4-node group
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = service_parser("python -m trainer serve", DESCRIPTION, EPILOG)
    p.add_argument("--redis", metavar="URL", help="Redis URL of the job API")
    p.add_argument("--group", metavar="NAME", help="trainer group whose jobs it claims (default)")
    p.add_argument("--base-config", metavar="FILE", help="run config the job's spec is laid over")
    p.add_argument("--runs-dir", metavar="DIR", help="where job run dirs go (runs)")
    p.add_argument(
        "--lease-ttl", type=float, metavar="S", help="lease of a claimed job in seconds (30)"
    )
    p.add_argument("--nnodes", type=int, metavar="N", help="nodes of the group's torchrun (1)")
    p.add_argument("--node-rank", type=int, metavar="R", help="this node's rank; 0 leads (0)")
    add_metrics_argument(p)
    add_common_arguments(p, SECTION)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {
        "redis_url": args.redis,
        "group": args.group,
        "base_config": args.base_config,
        "runs_dir": args.runs_dir,
        "lease_ttl_s": args.lease_ttl,
        "nnodes": args.nnodes,
        "node_rank": args.node_rank,
        "metrics_port": args.metrics_port,
    }
    cfg = load_cli_config(TrainerServiceConfig, SECTION, args, overrides)
    if isinstance(cfg, int):
        return cfg
    configure_logging(cfg.log_level)
    client = connect(cfg.redis_url)
    service = TrainerFollower(cfg, client) if cfg.node_rank > 0 else TrainerService(cfg, client)
    if isinstance(service, TrainerService):  # a follower claims nothing: the leader reports
        try:
            serve_metrics(service.metrics.registry, cfg.metrics_port, cfg.metrics_addr,
                          logging.getLogger(service.log_name))  # fmt: skip
        except MetricsServerError as exc:
            print(f"python -m trainer serve: {exc}", file=sys.stderr)
            client.close()
            return 1
    signal.signal(signal.SIGTERM, lambda *_: service.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: service.stop_event.set())
    try:
        service.serve()
    finally:
        client.close()
    return 0
