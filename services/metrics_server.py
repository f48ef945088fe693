"""The Prometheus endpoint of the services that have no HTTP server of their own (the sandbox
worker, the rollout manager, the evaluator service, the trainer service).

Each service config has ``metrics_port`` (:data:`MetricsPort`: None, the default, serves
nothing) and ``metrics_addr`` (:data:`MetricsAddr`: the bind address, default 127.0.0.1; a
container sets 0.0.0.0). :func:`start_metrics_server` serves one service's own registry on
``GET /metrics`` from a daemon thread (``prometheus_client.start_http_server``).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import time
from dataclasses import dataclass
from threading import Thread
from typing import Annotated
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Gauge, start_http_server
from pydantic import AfterValidator, Field

DEFAULT_ADDR = "127.0.0.1"
# The port each service's Prometheus endpoint uses in the compose files and the scrape configs
# (deploy/prometheus/); any free port works.
DEFAULT_PORTS = {"manager": 9301, "eval_service": 9302, "worker": 9303, "trainer_service": 9304}


def _check_port(port: int | None) -> int | None:
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(
            f"metrics_port must be a TCP port 1-65535 that Prometheus scrapes (e.g. 9303), or "
            f"unset (null) to serve no metrics; got {port}"
        )
    return port


def _check_addr(addr: str) -> str:
    if addr == "localhost":
        return addr
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        raise ValueError(
            f"metrics_addr must be an IP address to bind the metrics endpoint to: 127.0.0.1 "
            f"(this host only), 0.0.0.0 (every interface, e.g. in a container) or one "
            f"interface's address; got {addr!r}"
        ) from None
    return addr


MetricsPort = Annotated[
    int | None,
    AfterValidator(_check_port),
    Field(description="port of the Prometheus endpoint GET /metrics (null: no endpoint)"),
]
MetricsAddr = Annotated[
    str,
    AfterValidator(_check_addr),
    Field(description="address the metrics endpoint binds (0.0.0.0 in a container)"),
]


class MetricsServerError(RuntimeError):
    """The metrics endpoint cannot listen (port in use, address not on this host)."""


@dataclass
class MetricsServer:
    """A running endpoint; ``port`` is the bound one (the real port when asked for 0)."""

    server: WSGIServer
    thread: Thread
    addr: str

    @property
    def port(self) -> int:
        return int(self.server.server_port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start_metrics_server(registry: CollectorRegistry, port: int, addr: str) -> MetricsServer:
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread."""
    try:
        server, thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise MetricsServerError(
            f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc} (set metrics_port "
            "to a free port, metrics_addr to an address of this host, or unset metrics_port)"
        ) from exc
    return MetricsServer(server, thread, addr)


def serve_metrics(
    registry: CollectorRegistry, port: int | None, addr: str, log: logging.Logger
) -> MetricsServer | None:
    """:func:`start_metrics_server` when ``port`` is set (logged), else None: no endpoint."""
    if port is None:
        return None
    server = start_metrics_server(registry, port, addr)
    log.info("Prometheus metrics on http://%s:%d/metrics", addr, server.port)
    return server


def add_metrics_argument(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port PORT`` (the config key ``metrics_port``)."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on http://<metrics_addr>:PORT/metrics (default: off; "
        "metrics_addr defaults to 127.0.0.1)",
    )


class HeartbeatGauges:
    """``<prefix>_last_heartbeat_timestamp_seconds`` (0: none yet) and
    ``<prefix>_heartbeat_age_seconds`` (computed at each scrape; NaN: none) of one heartbeat
    (``what`` says whose, in the help texts)."""

    def __init__(self, registry: CollectorRegistry, prefix: str, what: str) -> None:
        self._last: float | None = None
        self.last = Gauge(f"{prefix}_last_heartbeat_timestamp_seconds",
                          f"Unix time of {what} (0: none yet).", registry=registry)  # fmt: skip
        self.age = Gauge(f"{prefix}_heartbeat_age_seconds",
                         f"Seconds since {what} (NaN: none).", registry=registry)  # fmt: skip
        self.age.set_function(self._age)

    def beat(self, now: float | None = None) -> None:
        self._last = time.time() if now is None else now
        self.last.set(self._last)

    def clear(self) -> None:
        """No heartbeat to age from (the age reads NaN until the next beat)."""
        self._last = None

    def _age(self) -> float:
        return math.nan if self._last is None else max(0.0, time.time() - self._last)
