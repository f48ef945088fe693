"""The job API as the CLI sees it: one method per call, API errors turned into :class:`CliError`
with the exit status they mean."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx

from services.swerl_cli.errors import (
    EXIT_AUTH,
    EXIT_NOT_FOUND,
    EXIT_REJECTED,
    EXIT_UNREACHABLE,
    CliError,
)


def _error(response: httpx.Response) -> CliError:
    try:
        detail = response.json()["error"]
        message = detail["message"]
        if detail.get("field"):
            message += f" (field: {detail['field']})"
    except (ValueError, KeyError, TypeError):
        message = response.text[:500] or response.reason_phrase
    status = response.status_code
    if status in (401, 403):
        return CliError(EXIT_AUTH, message)
    if status == 404:
        return CliError(EXIT_NOT_FOUND, message)
    if status >= 500:
        return CliError(EXIT_UNREACHABLE, f"the API failed ({status}): {message}")
    return CliError(EXIT_REJECTED, message)


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
            raise CliError(EXIT_UNREACHABLE, f"cannot reach the API at {self.url}: {exc}") from exc
        if response.status_code >= 400:
            raise _error(response)
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

    def results(self, job_id: str, follow: bool) -> Iterator[str]:
        params = {"format": "ndjson", "follow": str(follow).lower()}
        try:
            with self.http.stream(
                "GET", f"/v1/jobs/{job_id}/results", params=params, timeout=None
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise _error(response)
                yield from (line for line in response.iter_lines() if line)
        except httpx.HTTPError as exc:
            raise CliError(EXIT_UNREACHABLE, f"cannot reach the API at {self.url}: {exc}") from exc
