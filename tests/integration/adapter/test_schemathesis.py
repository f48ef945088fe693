"""Schemathesis fuzzes every route of a live adapter (real engine, real Redis): no 5xx, ever.

The request bodies are published in ``/openapi.json`` (adapter.app.publish_request_bodies), so
bodies are generated from the schemas (valid ones, and invalid ones that break a constraint),
not only paths. The run is bounded for a 2-core machine: a fixed number of examples per
operation, derandomised (the same cases every run), generation capped by a small context.
"""

from __future__ import annotations

from typing import Any

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode

from tests.integration.adapter.conftest import AdapterFactory, EnginePool, RunningAdapter

pytestmark = pytest.mark.engines("a")

EXAMPLES_PER_OPERATION = 25
EXPECTED_OPERATIONS = {
    "POST /v1/chat/completions",
    "POST /t/{trajectory_id}/v1/chat/completions",
    "GET /v1/models",
    "GET /t/{trajectory_id}/v1/models",
    "POST /trajectories",
    "POST /trajectories/{trajectory_id}/close",
    "GET /trajectories/{trajectory_id}",
    "GET /trajectories/{trajectory_id}/raw",
    "POST /admin/weights",
    "POST /admin/weights/group",
    "POST /admin/weights/distributed",
    "GET /admin/versions",
    "GET /health",
    "GET /readyz",
    "GET /metrics",
}
# Fuzzed without the admin token: a valid generated body would make the engines dial the
# generated `master_address` (any host) to join a broadcast group. Only the refusal is fuzzed.
NO_ADMIN = {"POST /admin/weights/group"}


def fuzz(a: RunningAdapter, operation: Any, mode: GenerationMode, seen: list[int]) -> None:
    session = requests.Session()
    if operation.label not in NO_ADMIN:
        session.headers.update(a.admin())  # reach past the admin check too

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
        response = case.call(base_url=a.url, session=session, timeout=120)
        seen.append(response.status_code)
        case.validate_response(response, checks=[not_a_server_error])

    run()


def test_schemathesis_finds_no_server_error(adapter: AdapterFactory, engines: EnginePool) -> None:
    # A small context bounds what a generated valid request can ask the engine to generate.
    with adapter([engines.a.url], context_length=96, default_max_tokens=8) as a:
        schema = schemathesis.openapi.from_url(f"{a.url}/openapi.json")
        operations = [result.ok() for result in schema.get_all_operations()]
        assert {op.label for op in operations} == EXPECTED_OPERATIONS
        bodies = {op.label for op in operations if len(op.body) > 0}
        assert bodies == {
            "POST /v1/chat/completions",
            "POST /t/{trajectory_id}/v1/chat/completions",
            "POST /trajectories",
            "POST /trajectories/{trajectory_id}/close",
            "POST /admin/weights",
            "POST /admin/weights/group",
            "POST /admin/weights/distributed",
        }
        statuses: list[int] = []
        for operation in operations:
            fuzz(a, operation, GenerationMode.POSITIVE, statuses)
            if len(operation.body) or len(operation.path_parameters):  # something to break
                fuzz(a, operation, GenerationMode.NEGATIVE, statuses)
        assert statuses and max(statuses) < 500
        # Generated bodies reached past validation too (not only 4xx answers).
        assert statuses.count(200) + statuses.count(201) > 0


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/trajectories", "/admin/weights"])
def test_request_bodies_are_published(
    adapter: AdapterFactory, engines: EnginePool, path: str
) -> None:
    with adapter([engines.a.url]) as a:
        spec = a.http.get(f"{a.url}/openapi.json").json()
        body = spec["paths"][path]["post"]["requestBody"]
        ref = body["content"]["application/json"]["schema"]["$ref"]
        component = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]
        assert component["type"] == "object" and component["properties"]
        assert component.get("additionalProperties") is False
