"""Redis clients that ride out a Redis restart.

Every command is retried with capped exponential backoff (redis-py's ``Retry``), which covers
short outages transparently. Longer outages surface as :class:`redis.ConnectionError`; loops
catch it and call :func:`backoff_sleep`, and writes that must not be lost (a finished result)
go through :func:`retry_forever`. That is safe because every state change of the queue is an
idempotent Lua script: replaying one whose reply was lost changes nothing.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.retry import Retry

from services.queue.config import QueueConfig

#: Errors that mean "Redis is (temporarily) unreachable", as opposed to a bad command.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    ConnectionResetError,
)


def connect(url: str, cfg: QueueConfig | None = None) -> redis.Redis:
    """A client for ``url`` with retries/backoff; raises ``ValueError`` for a malformed URL."""
    cfg = cfg or QueueConfig()
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"not a Redis URL (redis://, rediss:// or unix://): {url!r}")
    retry = Retry(
        ExponentialWithJitterBackoff(cap=cfg.backoff_cap_s, base=0.05),
        cfg.connect_retries,
        supported_errors=TRANSIENT_ERRORS,
    )
    return redis.Redis.from_url(
        url,
        retry=retry,
        socket_timeout=cfg.socket_timeout_s,
        socket_connect_timeout=min(cfg.socket_timeout_s, 5.0),
        health_check_interval=30,
    )


def backoff_delay(failures: int, cap_s: float = 2.0, base_s: float = 0.05) -> float:
    """Delay before the ``failures``-th consecutive retry: exponential, jittered, capped."""
    exp = min(cap_s, base_s * (2 ** min(failures, 30)))
    return exp / 2 + random.random() * exp / 2


def backoff_sleep(failures: int, stop: threading.Event | None = None, cap_s: float = 2.0) -> None:
    delay = backoff_delay(failures, cap_s)
    if stop is None:
        time.sleep(delay)
    else:
        stop.wait(delay)


def retry_forever[T](
    fn: Callable[[], T],
    *,
    what: str,
    log: logging.Logger,
    give_up: threading.Event | None = None,
    cap_s: float = 2.0,
) -> T | None:
    """Call ``fn`` until it succeeds, backing off while Redis is unreachable.

    Returns ``None`` only when ``give_up`` is set (a forced shutdown); the caller then relies
    on at-least-once delivery: the un-acked task is re-delivered and re-run.
    """
    failures = 0
    while True:
        try:
            return fn()
        except TRANSIENT_ERRORS as exc:
            failures += 1
            if failures == 1 or failures % 20 == 0:
                log.warning("%s: Redis unreachable (%s); retrying", what, exc)
            if give_up is not None and give_up.is_set():
                log.error("%s: giving up (forced shutdown)", what)
                return None
            backoff_sleep(failures, give_up, cap_s)
