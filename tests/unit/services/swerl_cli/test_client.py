"""The job API's answers as the CLI maps them: an API that cannot be reached and an API whose
Redis is down are two different errors (exit 3 and exit 7), each naming its fix."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
import redis

from services.api.app import _redis_error
from services.swerl_cli.client import ApiClient
from services.swerl_cli.errors import (
    EXIT_NOT_FOUND,
    EXIT_REDIS_DOWN,
    EXIT_REJECTED,
    EXIT_UNREACHABLE,
    CliError,
)

URL = "http://api.test:8300"
Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler) -> ApiClient:
    api = ApiClient(URL, "token")
    api.http.close()
    api.http = httpx.Client(base_url=URL, transport=httpx.MockTransport(handler))
    return api


def redis_down_answer() -> httpx.Response:
    """What the real API answers to any request while its Redis is down."""
    answer = asyncio.run(_redis_error(None, redis.ConnectionError("refused")))  # type: ignore[arg-type]
    return httpx.Response(answer.status_code, content=bytes(answer.body))


def raising(exc: httpx.HTTPError) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc

    return handler


def error_of(api: ApiClient, call: Callable[[ApiClient], object]) -> CliError:
    with pytest.raises(CliError) as err:
        call(api)
    return err.value


def test_an_api_whose_redis_is_down_is_not_called_unreachable() -> None:
    answer = redis_down_answer()
    api_message = answer.json()["error"]["message"]
    for call in (lambda a: a.job("rollout-1"), lambda a: a.jobs(None, None, 5),
                 lambda a: list(a.results("rollout-1", follow=False))):  # fmt: skip
        err = error_of(client(lambda _: answer), call)
        assert err.code == EXIT_REDIS_DOWN
        assert err.message.startswith(f"the API at {URL} answers but its Redis is down: ")
        assert api_message in err.message and f"{URL}/readyz" in err.message
        assert "unreachable" not in err.message


def test_no_api_at_the_url_is_unreachable_and_names_the_flag() -> None:
    refused = httpx.ConnectError("[Errno 111] Connection refused")
    for call in (lambda a: a.job("rollout-1"), lambda a: list(a.results("rollout-1", False))):
        err = error_of(client(raising(refused)), call)
        assert err.code == EXIT_UNREACHABLE
        assert err.message == (
            f"the API at {URL} is unreachable: [Errno 111] Connection refused "
            "(is it running? --api / $SWERL_API_URL)"
        )


def test_a_connect_timeout_is_unreachable_a_read_timeout_is_a_slow_api() -> None:
    err = error_of(client(raising(httpx.ConnectTimeout("timed out"))), lambda a: a.job("j"))
    assert err.code == EXIT_UNREACHABLE and "is unreachable: timed out" in err.message
    err = error_of(client(raising(httpx.ReadTimeout("timed out"))), lambda a: a.job("j"))
    assert err.code == EXIT_UNREACHABLE and "did not answer in time" in err.message
    assert f"{URL}/readyz" in err.message and "is unreachable" not in err.message


def test_other_server_errors_and_foreign_bodies_stay_exit_3() -> None:
    proxy = httpx.Response(503, text="<html>Service Unavailable</html>")
    err = error_of(client(lambda _: proxy), lambda a: a.job("j"))
    assert err.code == EXIT_UNREACHABLE and "failed (503): <html>" in err.message
    bug = httpx.Response(500, json={"error": {"message": "boom", "type": "internal"}})
    err = error_of(client(lambda _: bug), lambda a: a.job("j"))
    assert (err.code, "failed (500): boom" in err.message) == (EXIT_UNREACHABLE, True)


def test_client_errors_keep_their_field_and_status() -> None:
    missing = httpx.Response(404, json={"error": {"message": "no job 'j'", "type": "not_found"}})
    assert error_of(client(lambda _: missing), lambda a: a.job("j")).code == EXIT_NOT_FOUND
    detail = {"message": "must be >= 1", "type": "invalid_request", "field": "body.steps"}
    bad = httpx.Response(422, json={"error": detail})
    err = error_of(client(lambda _: bad), lambda a: a.submit("train", {}, None))
    assert (err.code, err.message) == (EXIT_REJECTED, "must be >= 1 (field: body.steps)")
