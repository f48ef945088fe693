"""OpenAI-style errors: every 4xx/5xx of the adapter is ``{"error": {message, type, code, param}}``.

litellm (and so OpenHands) turns these into its typed exceptions by status code and shows the
message, so the message has to say what was wrong and what to do.
"""

from __future__ import annotations

from typing import Any

_TYPES = {
    400: ("invalid_request_error", "invalid_request"),
    401: ("authentication_error", "invalid_token"),
    403: ("permission_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    409: ("invalid_request_error", "conflict"),
    413: ("invalid_request_error", "too_large"),
    422: ("invalid_request_error", "unprocessable"),
    500: ("server_error", "internal_error"),
    502: ("server_error", "engine_error"),
    503: ("server_error", "engine_unavailable"),
    504: ("server_error", "timeout"),
}


class APIError(Exception):
    """An error answered to the client with ``status`` and an OpenAI-style JSON body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        type_: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        fallback = ("invalid_request_error", "error") if status < 500 else ("server_error", "error")
        default_type, default_code = _TYPES.get(status, fallback)
        self.status = status
        self.message = message
        self.code = code or default_code
        self.type = type_ or default_type
        self.param = param
        self.headers = headers  # e.g. ``Allow`` on a 405

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "code": self.code,
                "param": self.param,
            }
        }
