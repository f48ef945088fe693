"""A scripted OpenAI chat-completions server: the adapter's stand-in for runner tests.

It answers ``POST .../chat/completions`` with a reply chosen by the number of assistant
messages already in the request (so a retried request gets the same reply), records every
request, and can answer with an HTTP error instead. Standard library only, one thread.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    """An assistant message, or an HTTP error when ``status`` is not 200."""

    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    error_message: str = ""
    error_code: str = "invalid_request"
    delay_s: float = 0.0


def call(name: str, arguments: dict[str, Any], call_id: str = "") -> dict[str, Any]:
    """An OpenAI tool call."""
    return {
        "id": call_id or f"call_{name}_{abs(hash(json.dumps(arguments))) % 10**8}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


@dataclass
class Request:
    path: str
    body: dict[str, Any]
    authorization: str | None = None


class FakeLLM:
    """``with FakeLLM(replies) as llm:`` serves on ``llm.port``; ``llm.requests`` has the calls."""

    def __init__(
        self,
        replies: list[Reply],
        summary: str = "SUMMARY: nothing happened.",
        choose: Callable[[dict[str, Any]], Reply | None] | None = None,
    ) -> None:
        if not replies:
            raise ValueError("FakeLLM needs at least one reply")
        self.replies = replies
        self.choose = choose  # a reply for a request body, overriding the positional choice
        # A request without tools is not an agent step (e.g. the condenser's summary call).
        self.summary = summary
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def url(self, trajectory_id: str = "traj-1") -> str:
        return f"http://127.0.0.1:{self.port}/t/{trajectory_id}/v1"

    def __enter__(self) -> FakeLLM:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def reply_for(self, body: dict[str, Any]) -> Reply:
        if not body.get("tools"):
            return Reply(content=self.summary)
        if self.choose is not None and (chosen := self.choose(body)) is not None:
            return chosen
        n_assistant = sum(1 for m in body.get("messages", []) if m.get("role") == "assistant")
        return self.replies[min(n_assistant, len(self.replies) - 1)]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                body = json.loads(raw)
                with fake._lock:
                    fake.requests.append(
                        Request(self.path, body, self.headers.get("Authorization"))
                    )
                if not self.path.endswith("/chat/completions"):
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                reply = fake.reply_for(body)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.status != 200:
                    error = {
                        "message": reply.error_message,
                        "type": "invalid_request_error" if reply.status < 500 else "server_error",
                        "code": reply.error_code,
                        "param": None,
                    }
                    self._send(reply.status, {"error": error})
                    return
                message: dict[str, Any] = {"role": "assistant", "content": reply.content}
                if reply.tool_calls:
                    message["tool_calls"] = reply.tool_calls
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{len(fake.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", ""),
                        "choices": [
                            {
                                "index": 0,
                                "message": message,
                                "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

        return Handler
