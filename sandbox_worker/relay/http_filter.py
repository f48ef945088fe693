"""The host side of a sandbox's LLM relay: an HTTP/1.1 filter bound to one trajectory.

Every connection a sandbox opens to its ``llm.sock`` is parsed as HTTP/1.1 with h11 (the
sandbox's bytes are never forwarded as they are). A request is forwarded to the adapter only if

* it is ``POST /t/<id>/v1/chat/completions`` or ``GET /t/<id>/v1/models`` where ``<id>`` is the
  trajectory the sandbox was created for, given in origin form and **compared exactly**: no
  query, no fragment, no percent-encoding, no dot segments, no absolute-form target (so
  ``/t/<id>/../<other>``, ``%2e%2e``, ``%2F``, ``http://adapter/trajectories/...`` are all refused);
* no header name occurs twice, ``Content-Length`` and ``Transfer-Encoding`` are not both given
  (the classic request-smuggling setup), there is no ``Upgrade`` and no ``Expect`` other than
  ``100-continue``.

Anything else is answered ``403`` by the relay itself (an OpenAI-style error body, then the
connection is closed) and never reaches the adapter; a request that does not parse gets ``400``.
What is forwarded is rebuilt, not copied: the canonical target, the relay's own ``Host``, the
trajectory's bearer token in ``Authorization`` (whatever the sandbox sent there is dropped; the
sandbox never sees the token), ``Content-Type`` / ``Accept`` / ``User-Agent``, and the body with
its framing (``Content-Length`` or chunked). Responses stream back event by event, so SSE
arrives as the adapter sends it.

Connections to the sandbox are keep-alive: several requests, one after the other, on one
connection; pipelined requests are served in order (h11 holds a request back until the previous
response is complete). Each forwarded request uses a fresh connection to the adapter, so a
connection the adapter closed while idle can never swallow a request.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field

import h11

MAX_HEADER_BYTES = 64 * 1024  # request line + headers of one request
MAX_CONNECTIONS = 32  # concurrent connections of one sandbox
_READ = 65536

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,199}$")
_TOKEN_RE = re.compile(r"^[\x21-\x7e]{1,512}$")
_FORWARDED_HEADERS = frozenset({b"content-type", b"accept", b"user-agent"})


class RelayDenied(Exception):
    """A request the relay refuses (status 403 or 400) without contacting the adapter."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class RelayBinding:
    """The trajectory a sandbox's relay serves, and the bearer token the relay adds.

    ``token`` is ``None`` against an adapter without training mode (no credential is sent).
    """

    trajectory_id: str
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        tid = self.trajectory_id
        if not isinstance(tid, str) or not _ID_RE.match(tid) or ".." in tid:
            raise ValueError(f"invalid trajectory id for a relay: {tid!r}")
        if self.token is not None and not _TOKEN_RE.match(self.token):
            raise ValueError("a relay token must be 1-512 visible ASCII characters")

    def allowed_targets(self) -> dict[bytes, bytes]:
        """Canonical target -> the one method allowed on it."""
        base = f"/t/{self.trajectory_id}/v1".encode()
        return {base + b"/chat/completions": b"POST", base + b"/models": b"GET"}


def check_request(binding: RelayBinding, request: h11.Request) -> bytes:
    """The canonical target to forward ``request`` to, or :class:`RelayDenied`."""
    target = bytes(request.target)
    allowed = binding.allowed_targets()
    if target not in allowed:
        raise RelayDenied(
            403,
            f"the sandbox relay forwards only POST /t/{binding.trajectory_id}/v1/chat/completions "
            f"and GET /t/{binding.trajectory_id}/v1/models",
        )
    if bytes(request.method) != allowed[target]:
        raise RelayDenied(403, f"method {request.method.decode(errors='replace')} not allowed")
    names = [bytes(name) for name, _ in request.headers]
    if len(set(names)) != len(names):
        raise RelayDenied(403, "duplicate request headers are not relayed")
    if b"content-length" in names and b"transfer-encoding" in names:
        raise RelayDenied(403, "both Content-Length and Transfer-Encoding: refused")
    if b"upgrade" in names:
        raise RelayDenied(403, "protocol upgrades are not relayed")
    for name, value in request.headers:
        if name == b"expect" and bytes(value).lower() != b"100-continue":
            raise RelayDenied(403, "only Expect: 100-continue is relayed")
    return target


def forwarded_headers(
    request: h11.Request, host: bytes, binding: RelayBinding
) -> list[tuple[bytes, bytes]]:
    """The headers sent to the adapter: rebuilt from a short allow-list (see module doc)."""
    out: list[tuple[bytes, bytes]] = [(b"host", host)]
    for name, value in request.headers:
        if name in _FORWARDED_HEADERS:
            out.append((bytes(name), bytes(value)))
        elif name == b"content-length":
            out.append((b"content-length", bytes(value)))
        elif name == b"transfer-encoding":
            out.append((b"transfer-encoding", b"chunked"))  # h11 accepts nothing else
    if request.method == b"POST" and not any(
        n in (b"content-length", b"transfer-encoding") for n, _ in out
    ):
        out.append((b"content-length", b"0"))
    if binding.token is not None:
        out.append((b"authorization", b"Bearer " + binding.token.encode()))
    return out


_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"upgrade",
        b"trailer",
        b"te",
    }
)


def error_response(status: int, message: str) -> bytes:
    """A complete ``Connection: close`` response in the adapter's error format."""
    kind = {400: "invalid_request_error", 403: "permission_error"}.get(status, "server_error")
    body = json.dumps(
        {"error": {"message": message, "type": kind, "code": "relay_refused", "param": None}}
    ).encode()
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway", 503: "Unavailable"}
    head = (
        f"HTTP/1.1 {status} {reason.get(status, 'Error')}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


class _UpstreamError(Exception):
    """The adapter could not be reached or broke the exchange."""


class FilteredRelay:
    """Serves the connections of one sandbox's ``llm.sock`` (see the module docstring)."""

    def __init__(
        self,
        binding: RelayBinding,
        target_host: str,
        target_port: int,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.binding = binding
        self.target_host = target_host
        self.target_port = target_port
        self.host_header = f"{target_host}:{target_port}".encode()
        self.max_connections = max_connections
        self.active = 0
        self.forwarded = 0  # requests sent to the adapter (tests, monitoring)
        self.refused = 0  # requests answered by the relay itself

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One sandbox connection, until it closes or a request is refused."""
        if self.active >= self.max_connections:
            self.refused += 1
            await _finish(writer, error_response(503, "too many connections to the relay"))
            return
        self.active += 1
        try:
            await self._serve(reader, writer)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.active -= 1
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        while True:
            try:
                event = await _next_event(conn, reader)
                if isinstance(event, h11.ConnectionClosed):
                    return
                assert isinstance(event, h11.Request)
                target = check_request(self.binding, event)
            except h11.RemoteProtocolError as exc:
                self.refused += 1
                await _finish(writer, error_response(400, f"malformed HTTP request: {exc}"))
                return
            except RelayDenied as exc:
                self.refused += 1
                await _finish(writer, error_response(exc.status, exc.message))
                return
            if conn.client_is_waiting_for_100_continue:
                writer.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
            try:
                await self._forward(conn, event, target, reader, writer)
            except h11.RemoteProtocolError as exc:  # the sandbox's body was malformed
                self.refused += 1
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _finish(writer, error_response(400, f"malformed HTTP request: {exc}"))
                return
            except _UpstreamError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await _finish(writer, error_response(502, f"LLM adapter: {exc}"))
                return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # MUST_CLOSE (HTTP/1.0, Connection: close) or an unread body
            conn.start_next_cycle()

    async def _forward(
        self,
        conn: h11.Connection,
        request: h11.Request,
        target: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError as exc:
            raise _UpstreamError(f"cannot connect: {exc}") from exc
        up = h11.Connection(h11.CLIENT)
        try:
            headers = forwarded_headers(request, self.host_header, self.binding)
            await _send(up_writer, up, h11.Request(method=request.method, target=target,
                                                   headers=headers))  # fmt: skip
            self.forwarded += 1
            while True:  # the request body, as it arrives
                event = await _next_event(conn, reader)
                if isinstance(event, h11.Data):
                    await _send(up_writer, up, h11.Data(data=bytes(event.data)))
                elif isinstance(event, h11.EndOfMessage):
                    await _send(up_writer, up, h11.EndOfMessage())
                    break
                else:  # ConnectionClosed mid-body: h11 raised already for a short body
                    raise h11.RemoteProtocolError("connection closed inside the request body")
            await self._relay_response(conn, up, up_reader, writer)
        finally:
            up_writer.close()

    async def _relay_response(
        self,
        conn: h11.Connection,
        up: h11.Connection,
        up_reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        while True:
            try:
                event = await _next_event(up, up_reader)
            except h11.RemoteProtocolError as exc:
                raise _UpstreamError(f"bad HTTP response: {exc}") from exc
            if isinstance(event, h11.InformationalResponse):
                continue
            if isinstance(event, h11.Response):
                headers = [(n, v) for n, v in event.headers if n not in _HOP_BY_HOP]
                writer.write(
                    conn.send(
                        h11.Response(
                            status_code=event.status_code, headers=headers, reason=event.reason
                        )
                    )
                )
            elif isinstance(event, h11.Data):
                writer.write(conn.send(h11.Data(data=bytes(event.data))))
                await writer.drain()  # SSE: pass every event on as it comes
            elif isinstance(event, h11.EndOfMessage):
                writer.write(conn.send(h11.EndOfMessage()))
                await writer.drain()
                return
            else:
                raise _UpstreamError("the adapter closed the connection mid-response")


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> object:
    """The next h11 event, reading more bytes as needed (EOF is passed to h11)."""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await reader.read(_READ))
            continue
        if event is h11.PAUSED:  # cannot happen between our calls; treat as protocol misuse
            raise h11.RemoteProtocolError("unexpected pause")
        return event


async def _send(writer: asyncio.StreamWriter, conn: h11.Connection, event: object) -> None:
    try:
        data = conn.send(event)  # type: ignore[arg-type]
        if data:
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError) as exc:
        raise _UpstreamError(f"connection lost: {exc}") from exc


async def _finish(writer: asyncio.StreamWriter, data: bytes) -> None:
    try:
        writer.write(data)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
