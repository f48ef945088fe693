"""Schemathesis fuzzes every operation of a live job API (real process, real Redis): no 5xx.

Bodies, queries, paths and headers are generated from ``/openapi.json`` (valid ones, and invalid
ones that break a constraint). Bounded for a 2-core machine: a fixed number of examples per
operation, derandomised (the same cases every run). Requests carry the admin token (a security
scheme, not a generated header), so generated cases reach past auth into validation and Redis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from tests.support.api_server import bearer, start_api
from tests.support.redis import RedisServer

pytestmark = pytest.mark.slow

EXAMPLES_PER_OPERATION = 20
EXPECTED_OPERATIONS = {
    "POST /v1/jobs/train",
    "POST /v1/jobs/rollout",
    "POST /v1/jobs/eval",
    "GET /v1/jobs",
    "GET /v1/jobs/{job_id}",
    "GET /v1/jobs/{job_id}/results",
    "GET /v1/jobs/{job_id}/logs",
    "GET /v1/jobs/{job_id}/progress",
    "GET /v1/jobs/{job_id}/trajectories/{trajectory_id}",
    "POST /v1/jobs/{job_id}/cancel",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
}


def fuzz(url: str, operation: Any, mode: GenerationMode, seen: list[int]) -> None:
    session = requests.Session()
    session.headers.update(bearer("root"))

    @hypothesis.settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        response = case.call(base_url=url, session=session, timeout=60)
        seen.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    run()


def test_schemathesis_finds_no_server_error(redis_url: str, tmp_path: Path) -> None:
    api = start_api(redis_url, tmp_path)
    try:
        schema = schemathesis.openapi.from_url(f"{api.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {op.label for op in operations} == EXPECTED_OPERATIONS
        statuses: list[int] = []
        for operation in operations:
            fuzz(api.url, operation, GenerationMode.POSITIVE, statuses)
            if len(operation.body) or len(operation.path_parameters) or len(operation.query):
                fuzz(api.url, operation, GenerationMode.NEGATIVE, statuses)
        assert statuses and max(statuses) < 500, sorted(set(statuses))
        assert statuses.count(201) > 0  # generated jobs were accepted, not only refused
        assert statuses.count(422) > 0  # and invalid ones were refused as such
    finally:
        log = api.process.log_tail()
        api.stop()
    assert "Traceback" not in log, log


def test_request_bodies_forbid_unknown_fields(redis_server: RedisServer, tmp_path: Path) -> None:
    api = start_api(redis_server.url, tmp_path)
    try:
        spec = requests.get(f"{api.url}/openapi.json", timeout=30).json()
    finally:
        api.stop()
    for kind in ("train", "rollout", "eval"):
        body = spec["paths"][f"/v1/jobs/{kind}"]["post"]["requestBody"]
        ref = body["content"]["application/json"]["schema"]["$ref"]
        component = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert component.get("additionalProperties") is False, kind
