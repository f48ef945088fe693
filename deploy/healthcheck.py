"""Container health checks of compose.yaml: ``python deploy/healthcheck.py CHECK [ARG]``.

* ``http URL``: a GET of URL answers 2xx within the timeout (the services' /readyz, /health);
* ``redis URL``: Redis at URL answers PING (a password in the URL is used);
* ``worker``: this node's sandbox worker heartbeat is in Redis (``<prefix>node:<node>``, see
  services/queue/keys.py), read from the worker's own ``SWERL_WORKER__*`` environment;
* ``process NAME``: a process whose command line contains NAME runs (besides this check).

Exit status 0 healthy, 1 unhealthy (the reason on stderr), 2 usage. Standard library only
except ``redis`` (in every swerl image), so it also runs where swerl itself does not import.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

TIMEOUT_S = 4.0
DEFAULT_PREFIX = "swerl:"
USAGE = "usage: healthcheck.py http URL | redis URL | worker | process NAME"


class Unhealthy(Exception):
    """The check failed; the message says why."""


def check_http(url: str, timeout_s: float = TIMEOUT_S) -> None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        raise Unhealthy(f"{url} answered {exc.code}") from None
    except (OSError, ValueError) as exc:
        raise Unhealthy(f"{url} unreachable: {exc}") from None
    if not 200 <= status < 300:
        raise Unhealthy(f"{url} answered {status}")


def _redis_client(url: str, timeout_s: float):
    import redis

    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def check_redis(url: str, timeout_s: float = TIMEOUT_S) -> None:
    client = _redis_client(url, timeout_s)
    try:
        client.ping()
    except Exception as exc:
        raise Unhealthy(f"redis {url.split('@')[-1]}: {exc}") from None
    finally:
        client.close()


def heartbeat_key(environ: Mapping[str, str]) -> tuple[str, str]:
    """The worker's Redis URL and heartbeat key, from its environment."""
    try:
        url = environ["SWERL_WORKER__REDIS_URL"]
        node = environ["SWERL_WORKER__NODE"]
    except KeyError as exc:
        raise Unhealthy(f"worker check: {exc.args[0]} is not set") from None
    prefix = environ.get("SWERL_WORKER__QUEUE__PREFIX", DEFAULT_PREFIX)
    return url, f"{prefix}node:{node}"


def check_worker(environ: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> None:
    url, key = heartbeat_key(environ)
    client = _redis_client(url, timeout_s)
    try:
        alive = bool(client.exists(key))
    except Exception as exc:
        raise Unhealthy(f"worker check: redis {url.split('@')[-1]}: {exc}") from None
    finally:
        client.close()
    if not alive:
        raise Unhealthy(f"no heartbeat at {key}: the worker is not running or not registered")


def check_process(name: str, proc: Path = Path("/proc")) -> None:
    me = os.getpid()
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if name.encode() in cmdline and b"healthcheck.py" not in cmdline:
            return
    raise Unhealthy(f"no process running {name!r}")


def run(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> None:
    """Run the check ``argv`` names; raises :class:`Unhealthy` or ``ValueError`` (usage)."""
    match list(argv):
        case ["http", url]:
            check_http(url)
        case ["redis", url]:
            check_redis(url)
        case ["worker"]:
            check_worker(environ)
        case ["process", name]:
            check_process(name)
        case _:
            raise ValueError(USAGE)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    except Unhealthy as exc:
        print(f"unhealthy: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
