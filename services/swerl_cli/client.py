"""The job API as the CLI sees it: one method per call, API errors turned into :class:`CliError`
with the exit status they mean.

Two outages read differently: an API that cannot be reached (nothing listens at ``--api``, a
wrong host, a connection that times out) is exit 3 and says where to point ``--api``; an API
that answers ``503`` with an ``unavailable`` error (its Redis is down: services/api/app.py) is
exit 7 and says the API is up but its Redis is not."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from services.swerl_cli.errors import (
    EXIT_AUTH,
    EXIT_NOT_FOUND,
    EXIT_REDIS_DOWN,
    EXIT_REJECTED,
    EXIT_UNREACHABLE,
    CliError,
)

#: The API's error ``type`` for a request it could not serve because Redis is down.
REDIS_DOWN_TYPE = "unavailable"


class ApiErrorDetail(BaseModel):
    """The ``error`` of the API's error body ``{"error": {"message", "type", "field"}}``."""

    message: str
    type: str = ""
    field: str | None = None


class ApiErrorBody(BaseModel):
    error: ApiErrorDetail


def _detail(response: httpx.Response) -> ApiErrorDetail:
    """The API's error, or (a body that is not the API's: a proxy's page) its text."""
    try:
        return ApiErrorBody.model_validate_json(response.content).error
    except ValidationError:
        return ApiErrorDetail(message=response.text[:500] or response.reason_phrase)


def _error(response: httpx.Response, url: str) -> CliError:
    detail = _detail(response)
    message = detail.message + (f" (field: {detail.field})" if detail.field else "")
    status = response.status_code
    if status in (401, 403):
        return CliError(EXIT_AUTH, message)
    if status == 404:
        return CliError(EXIT_NOT_FOUND, message)
    if status == 503 and detail.type == REDIS_DOWN_TYPE:
        return CliError(
            EXIT_REDIS_DOWN,
            f"the API at {url} answers but its Redis is down: {message} (start Redis, or fix "
            f"the API's Redis URL; {url}/readyz says why it cannot reach it)",
        )
    if status >= 500:
        return CliError(EXIT_UNREACHABLE, f"the API at {url} failed ({status}): {message}")
    return CliError(EXIT_REJECTED, message)


def _unreachable(exc: httpx.HTTPError, url: str) -> CliError:
    """A request that got no HTTP answer: no API there, or one that did not answer in time."""
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, httpx.ConnectTimeout):
        return CliError(
            EXIT_UNREACHABLE,
            f"the API at {url} took the request but did not answer in time ({reason}): it is "
            f"overloaded or waiting on its Redis ({url}/readyz says whether Redis answers)",
        )
    return CliError(
        EXIT_UNREACHABLE,
        f"the API at {url} is unreachable: {reason} (is it running? --api / $SWERL_API_URL)",
    )


class ApiClient:
    def __init__(self, url: str, token: str | None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.url) from exc
        if response.status_code >= 400:
            raise _error(response, self.url)
        return response

    def submit(self, kind: str, spec: dict[str, Any], key: str | None) -> dict[str, Any]:
        headers = {"Idempotency-Key": key} if key else {}
        return self._call("POST", f"/v1/jobs/{kind}", json=spec, headers=headers).json()

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}").json()

    def jobs(self, kind: str | None, state: str | None, limit: int) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": min(limit, 500)}
        if kind:
            params["kind"] = kind
        if state:
            params["state"] = state
        out: list[dict[str, Any]] = []
        while len(out) < limit:
            page = self._call("GET", "/v1/jobs", params=params).json()
            out += page["jobs"]
            if not page["next_cursor"]:
                break
            params["cursor"] = page["next_cursor"]
        return out[:limit]

    def logs(self, job_id: str, offset: int) -> tuple[list[dict[str, Any]], int]:
        page = self._call("GET", f"/v1/jobs/{job_id}/logs", params={"offset": offset}).json()
        return page["lines"], page["next_offset"]

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{job_id}/cancel").json()

    def results(self, job_id: str, follow: bool) -> Generator[str, None, None]:
        params = {"format": "ndjson", "follow": str(follow).lower()}
        try:
            with self.http.stream(
                "GET", f"/v1/jobs/{job_id}/results", params=params, timeout=None
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error(response, self.url)
                yield from (line for line in response.iter_lines() if line)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.url) from exc
