"""Host side of the sandbox relay: unix sockets in per-sandbox dirs <-> TCP on the host.

One :class:`RelayHub` per worker process runs an asyncio loop in a daemon thread and serves
every sandbox's relays:

* :meth:`RelayHub.llm_relay` listens on ``<ctl dir>/llm.sock`` (visible inside the sandbox
  as ``/swerl/ctl/llm.sock``) and serves each connection with an HTTP/1.1 filter bound to the
  sandbox's trajectory (:mod:`sandbox_worker.relay.http_filter`): only that trajectory's
  ``/t/<id>/v1`` chat completions and models reach the adapter, with the trajectory's token
  added on the host; the sandbox chooses neither host, port, path nor credential.
* :meth:`RelayHub.tcp_to_unix` gives a host loopback port for a unix socket that leads into a
  sandbox (see ``Sandbox.expose``), for clients that only speak TCP URLs.

``python -m sandbox_worker.relay.host_relay --unix PATH --target HOST:PORT --trajectory ID``
runs one LLM relay in the foreground (debugging, ops; the token comes from
``$SWERL_RELAY_TOKEN``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox_worker.relay.http_filter import FilteredRelay, RelayBinding
from sandbox_worker.relay.inner_relay import parse_hostport, splice

MAX_UNIX_PATH = 107  # sun_path is 108 bytes with the terminating NUL


class RelayError(RuntimeError):
    """A relay could not be started (bad path, port in use, hub closed)."""


@dataclass
class RelayHandle:
    """A running listener; ``close()`` stops accepting and removes its unix socket."""

    hub: RelayHub
    server: asyncio.AbstractServer
    unix_path: Path | None
    port: int | None = None
    filter: FilteredRelay | None = None  # the LLM relay's HTTP filter (its counters)

    def close(self) -> None:
        self.hub._close_server(self)


class RelayHub:
    """Asyncio relays in one background thread, shared by all sandboxes of a worker."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="swerl-relay-hub", daemon=True)
        self._closed = False
        self._lock = threading.Lock()
        self._handles: set[int] = set()
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def _call[T](self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        with self._lock:
            if self._closed:
                coro.close()
                raise RelayError("relay hub is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @staticmethod
    def _check_unix_path(path: Path) -> None:
        if len(os.fsencode(path)) > MAX_UNIX_PATH:
            raise RelayError(f"unix socket path too long ({len(str(path))} > 107): {path}")
        if not path.parent.is_dir():
            raise RelayError(f"directory for unix socket does not exist: {path.parent}")

    def llm_relay(
        self, unix_path: Path, target_host: str, target_port: int, binding: RelayBinding
    ) -> RelayHandle:
        """Listen on ``unix_path``; forward only ``binding``'s trajectory calls to the adapter
        at ``target_host:target_port`` (see :mod:`sandbox_worker.relay.http_filter`)."""
        self._check_unix_path(unix_path)
        relay = FilteredRelay(binding, target_host, target_port)

        async def start() -> asyncio.AbstractServer:
            if unix_path.exists() or unix_path.is_symlink():
                unix_path.unlink()
            return await asyncio.start_unix_server(relay.handle, str(unix_path))

        try:
            server = self._call(start())
        except OSError as exc:
            raise RelayError(f"cannot listen on {unix_path}: {exc}") from exc
        return self._register(RelayHandle(self, server, unix_path, filter=relay))

    def tcp_to_unix(
        self, unix_path: Path, listen_host: str = "127.0.0.1", listen_port: int = 0
    ) -> RelayHandle:
        """Listen on a host TCP port (``handle.port``); connect every client to ``unix_path``."""
        self._check_unix_path(unix_path)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                t_reader, t_writer = await asyncio.open_unix_connection(str(unix_path))
            except OSError:
                writer.close()
                return
            await splice(reader, writer, t_reader, t_writer)

        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_server(handle, listen_host, listen_port)

        try:
            server = self._call(start())
        except OSError as exc:
            raise RelayError(f"cannot listen on {listen_host}:{listen_port}: {exc}") from exc
        port = server.sockets[0].getsockname()[1]
        return self._register(RelayHandle(self, server, None, port))

    def _register(self, handle: RelayHandle) -> RelayHandle:
        with self._lock:
            self._handles.add(id(handle))
        return handle

    def _close_server(self, handle: RelayHandle) -> None:
        with self._lock:
            if id(handle) not in self._handles:
                return
            self._handles.discard(id(handle))
            closed = self._closed

        async def stop() -> None:
            handle.server.close()

        if not closed:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        if handle.unix_path is not None:
            handle.unix_path.unlink(missing_ok=True)

    def close(self) -> None:
        """Stop every relay and the loop thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


_default_hub: RelayHub | None = None
_default_lock = threading.Lock()


def default_hub() -> RelayHub:
    """The process-wide hub (created on first use; backends share it)."""
    global _default_hub
    with _default_lock:
        if _default_hub is None or _default_hub._closed:
            _default_hub = RelayHub()
        return _default_hub


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one trajectory LLM relay: unix socket -> adapter")
    parser.add_argument("--unix", required=True, type=Path, help="socket path to listen on")
    parser.add_argument("--target", required=True, help="HOST:PORT of the adapter")
    parser.add_argument("--trajectory", required=True, help="the only trajectory relayed")
    args = parser.parse_args(argv)
    try:
        host, port = parse_hostport(args.target)
        binding = RelayBinding(args.trajectory, os.environ.get("SWERL_RELAY_TOKEN") or None)
    except ValueError as exc:
        parser.error(str(exc))
    hub = RelayHub()
    handle = hub.llm_relay(args.unix, host, port, binding)
    print(f"relaying {args.unix} -> {host}:{port} for /t/{args.trajectory}/v1", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        handle.close()
        hub.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
