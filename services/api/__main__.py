"""``python -m services.api``: the HTTP job API (see ``--help``)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

import uvicorn

from services.api.app import create_app
from services.api.config import ApiConfig, insecure_listen_problem
from services.api.runner import RolloutJobRunner
from services.cli import (
    EXIT_CONFIG,
    add_common_arguments,
    configure_logging,
    load_cli_config,
    service_parser,
)
from services.config import dump_config

DESCRIPTION = """\
Job API of swerl: submit and watch train, rollout and eval jobs over HTTP (/v1, see docs/api.md).

State lives in Redis. Rollout jobs are driven by the job runner threads of this process
(api.runner.concurrency) through the rollout manager; the tasks reach the sandbox workers
through the manager's dispatch loop (python -m services.manager, or api.runner.dispatcher: true).
Train jobs wait in Redis for a trainer service (python -m trainer serve), eval jobs for an
evaluator service (python -m services.eval serve).
"""

EPILOG = """\
configuration (lowest precedence first): defaults < YAML file (--config or $SWERL_CONFIG,
section "api:") < environment (SWERL_API__PORT=8300,
SWERL_API__TOKENS='[{name: ci, token: s3cret-token, scopes: [read, submit]}]') < flags.
Without tokens every caller has every scope (development only): the API then refuses to
listen on a non-loopback address unless --insecure-dev (SWERL_API__INSECURE_DEV=true) says
this is a development setup.

limits (docs/api.md "Limits"): job paths must lie under api.paths.inputs / api.paths.outputs
(SWERL_API__PATHS__INPUTS='[/data/datasets, /data/models]'); request bodies over
api.max_body_bytes (16 MiB) are a 413; api.quotas.max_jobs_in_flight (per token, 429) and
api.quotas.max_tasks_per_job (422).

exit status: 0 stopped cleanly; 2 configuration error (or no tokens on a non-loopback host).

examples:
  python -m services.api --redis redis://127.0.0.1:6379/0 --port 8300
  python -m services.api --redis redis://head:6379/0 --host 0.0.0.0 --config node.yaml
  python -m services.api --redis redis://head:6379/0 --runner-only   # job runner, no HTTP
  python -m services.api --print-config
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = service_parser("python -m services.api", DESCRIPTION, EPILOG)
    p.add_argument("--redis", metavar="URL", help="Redis URL, e.g. redis://127.0.0.1:6379/0")
    p.add_argument("--host", help="address to listen on (127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (8300)")
    p.add_argument(
        "--runner-threads", type=int, dest="concurrency", metavar="N",
        help="rollout jobs driven at once by this process (api.runner.concurrency, 4; 0: none)",
    )  # fmt: skip
    p.add_argument(
        "--runner-only", action="store_true", help="run the rollout job runner without HTTP"
    )
    p.add_argument(
        "--insecure-dev", action="store_true", default=None,
        help="allow a non-loopback --host without tokens (development only: every caller is "
        "an admin); api.insecure_dev",
    )  # fmt: skip
    add_common_arguments(p, "api")
    return p.parse_args(argv)


def run_runner_only(cfg: ApiConfig) -> int:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    runner = RolloutJobRunner(cfg)
    runner.start()
    stop.wait()
    runner.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = {
        "redis_url": args.redis,
        "host": args.host,
        "port": args.port,
        "runner.concurrency": args.concurrency,
        "insecure_dev": args.insecure_dev,
    }
    cfg = load_cli_config(ApiConfig, "api", args, overrides)
    if isinstance(cfg, int):
        return cfg
    configure_logging(cfg.log_level)
    logging.getLogger("swerl.api").info("effective config:\n%s", dump_config(cfg))
    if args.runner_only:
        return run_runner_only(cfg)
    problem = insecure_listen_problem(cfg)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_CONFIG
    app = create_app(cfg)
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level=cfg.log_level.lower(), log_config=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
