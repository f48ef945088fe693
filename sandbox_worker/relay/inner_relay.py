"""Byte relay between a TCP port and a unix socket, run *inside* a sandbox.

The sandbox has no network interface but loopback, so the agent cannot reach anything. The
worker bind-mounts a per-sandbox host directory (``/swerl/ctl``) into the sandbox; a unix socket
in it is the only door out, and this relay connects the two sides:

* ``tcp2unix --listen 127.0.0.1:18080 --connect /swerl/ctl/llm.sock``: the agent's LLM client
  talks to loopback, the bytes go to the host relay, which forwards them to the adapter only.
* ``unix2tcp --listen /swerl/ctl/port-8000.sock --connect 127.0.0.1:8000``: the host reaches a
  server that runs in the sandbox (the OpenHands agent server).

It must run with whatever ``python3`` the sandbox image has, so it is standard library only and
keeps to Python 3.7 syntax; the host relay imports :func:`splice` from here so that the byte
pump exists once. ``--ready-file`` is created (atomically) once the listener accepts
connections, so the caller can wait for readiness without probing the port.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys

CHUNK = 65536


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one direction until EOF, then half-close the other side."""
    try:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


async def splice(
    a_reader: asyncio.StreamReader,
    a_writer: asyncio.StreamWriter,
    b_reader: asyncio.StreamReader,
    b_writer: asyncio.StreamWriter,
) -> None:
    """Relay bytes both ways between two connections until both directions are done."""
    try:
        await asyncio.gather(_pump(a_reader, b_writer), _pump(b_reader, a_writer))
    finally:
        for w in (a_writer, b_writer):
            w.close()


def parse_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host, int(port)


def _write_ready(path: str | None) -> None:
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(str(os.getpid()))
    os.replace(tmp, path)


async def _serve(mode: str, listen: str, connect: str, ready_file: str | None) -> None:
    if mode == "tcp2unix":
        lhost, lport = parse_hostport(listen)

        async def open_target() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await asyncio.open_unix_connection(connect)

    else:
        chost, cport = parse_hostport(connect)

        async def open_target() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
            return await asyncio.open_connection(chost, cport)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            t_reader, t_writer = await open_target()
        except OSError as exc:
            sys.stderr.write(f"inner_relay: cannot connect to {connect}: {exc}\n")
            writer.close()
            return
        await splice(reader, writer, t_reader, t_writer)

    if mode == "tcp2unix":
        server = await asyncio.start_server(handle, lhost, lport)
    else:
        if os.path.exists(listen):
            os.unlink(listen)
        server = await asyncio.start_unix_server(handle, listen)
    stop = asyncio.get_running_loop().create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.cancel)
    _write_ready(ready_file)
    async with server:
        with contextlib.suppress(asyncio.CancelledError):
            await stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "mode",
        choices=("tcp2unix", "unix2tcp"),
        help="tcp2unix: a TCP listener relayed to a unix socket; unix2tcp: the reverse",
    )
    parser.add_argument("--listen", required=True, help="HOST:PORT (tcp2unix) or socket path")
    parser.add_argument("--connect", required=True, help="socket path (tcp2unix) or HOST:PORT")
    parser.add_argument(
        "--ready-file", default=None, help="file created once the listener accepts connections"
    )
    args = parser.parse_args(argv)
    try:
        if args.mode == "tcp2unix":
            parse_hostport(args.listen)
        else:
            parse_hostport(args.connect)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        asyncio.run(_serve(args.mode, args.listen, args.connect, args.ready_file))
    except OSError as exc:
        sys.stderr.write(f"inner_relay: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
