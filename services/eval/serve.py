"""``python -m services.eval serve``: the evaluator service (see ``--help``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys

from services.cli import add_common_arguments, configure_logging, load_cli_config, service_parser
from services.eval.service import EvalService
from services.eval.service_config import SECTION, EvalServiceConfig
from services.metrics_server import MetricsServerError, add_metrics_argument, serve_metrics
from services.queue.connection import connect

DESCRIPTION = """\
Evaluator service of swerl: claims the eval jobs submitted to the job API (POST /v1/jobs/eval)
from its Redis, one at a time, and runs the evaluation script on each (python -m services.eval,
the same code as swerl eval) with the job's dataset and checkpoint or predictions, in
<runs_dir>/<job id>/ (run id: the job id). It heartbeats the job's lease with the progress
(instances graded / total), honours cancel (the script is interrupted and removes its
sandboxes), and ends the job with the run report: one result row per instance, the counts and
resolved_rate as metrics. An infrastructure failure fails the job (it is never counted as a
wrong answer). A job whose evaluator died is claimed again and resumed (--resume).
See docs/api.md ("Execution") and docs/eval.md.
"""

EPILOG = """\
configuration (lowest precedence first): defaults < YAML file (--config or $SWERL_CONFIG,
section "eval_service:") < environment (SWERL_EVAL_SERVICE__BACKEND=bwrap) < flags.

exit status: 0 stopped (SIGTERM/SIGINT; a running job is given back to the queue);
2 configuration error; 1 the metrics port (--metrics-port) cannot be served.

examples:
  python -m services.eval serve --redis redis://127.0.0.1:6379/0 --backend docker --workers 8
  python -m services.eval serve --config node.yaml --runs-dir /shared/eval-runs
  python -m services.eval serve --print-config
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = service_parser("python -m services.eval serve", DESCRIPTION, EPILOG)
    p.add_argument("--redis", metavar="URL", help="Redis URL of the job API")
    p.add_argument("--runs-dir", metavar="DIR", help="where job report dirs go (eval-runs)")
    p.add_argument("--backend", choices=("docker", "bwrap"), help="sandbox backend (docker)")
    p.add_argument("--state-root", metavar="DIR",
                   help="sandbox state directory (absolute; the same path inside a container "
                        "and on the host whose engine it drives)")  # fmt: skip
    p.add_argument("--workers", type=int, metavar="N", help="instances graded at once (4)")
    p.add_argument(
        "--lease-ttl", type=float, metavar="S", help="lease of a claimed job in seconds (30)"
    )
    add_metrics_argument(p)
    add_common_arguments(p, SECTION)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {
        "redis_url": args.redis,
        "runs_dir": args.runs_dir,
        "backend": args.backend,
        "state_root": args.state_root,
        "workers": args.workers,
        "lease_ttl_s": args.lease_ttl,
        "metrics_port": args.metrics_port,
    }
    cfg = load_cli_config(EvalServiceConfig, SECTION, args, overrides)
    if isinstance(cfg, int):
        return cfg
    configure_logging(cfg.log_level)
    client = connect(cfg.redis_url)
    service = EvalService(cfg, client)
    try:
        serve_metrics(service.metrics.registry, cfg.metrics_port, cfg.metrics_addr,
                      logging.getLogger(service.log_name))  # fmt: skip
    except MetricsServerError as exc:
        print(f"python -m services.eval serve: {exc}", file=sys.stderr)
        client.close()
        return 1
    signal.signal(signal.SIGTERM, lambda *_: service.stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: service.stop_event.set())
    try:
        service.serve()
    finally:
        client.close()
    return 0
