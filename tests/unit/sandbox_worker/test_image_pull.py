"""The pull subcommand's naming per dataset and its summary (the engine side is in
tests/integration/sandbox_worker/images/test_images.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox_worker.image_pull import PullResult, image_name, report
from services.protocol.instance import SWEInstance

PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"


def _inst(instance_id: str, **extra: object) -> SWEInstance:
    row = {"instance_id": instance_id, "repo": "o/r", "patch": PATCH, "problem_statement": ""}
    row |= {"FAIL_TO_PASS": ["t::a"], "PASS_TO_PASS": [], **extra}  # extra may replace repo
    return SWEInstance.model_validate(row)


def test_names_follow_each_dataset() -> None:
    django = _inst("django__django-11099")
    assert image_name(django, "swebench") == (
        "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
    )
    assert image_name(_inst("Project-MONAI__MONAI-1121"), "swegym") == (
        "xingyaoww/sweb.eval.x86_64.project-monai_s_monai-1121:latest"
    )
    smith = _inst("oauthlib__oauthlib.1fd52536.lm_rewrite__q9ve64pd")
    assert image_name(smith, "swesmith") == (
        "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536:latest"
    )
    row_named = _inst("a__b.12345678.x", image_name="me/custom:v1")
    assert image_name(row_named, "swesmith") == "me/custom:v1"
    assert image_name(django, "swebench", "127.0.0.1:5000").startswith("127.0.0.1:5000/swebench/")
    with pytest.raises(ValueError, match="invalid registry"):
        image_name(django, "swebench", "https://mirror")
    with pytest.raises(ValueError, match="unknown dataset"):
        image_name(django, "swe-other")


def test_a_swesmith_row_keeps_its_image_in_a_mixture() -> None:
    """A SWE-smith row (repo in SWE-smith's mirror organisation) has only SWE-smith's image:
    a SWE-Gym worker or pull names it so, and a SWE-Gym row keeps SWE-Gym's."""
    smith = _inst(
        "oauthlib__oauthlib.1fd52536.lm_rewrite__q9", repo="swesmith/oauthlib__oauthlib.1fd52536"
    )
    want = "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536:latest"
    assert smith.is_swesmith
    assert image_name(smith, "swegym") == image_name(smith, "swebench") == want
    gym = _inst("Project-MONAI__MONAI-1121")
    assert image_name(gym, "swegym").startswith("xingyaoww/")


def test_report_counts_and_lists_missing(tmp_path: Path) -> None:
    results = [
        PullResult("a:1", ("a-1",), "present"),
        PullResult("b:1", ("b-1", "b-2"), "missing", "connection refused"),
        PullResult("c:1", ("c-1",), "pulled"),
    ]
    out = tmp_path / "missing.txt"
    assert report(results, out) == 1
    assert out.read_text() == "b-1\nb-2\n"
    assert report(results[:1], None) == 0


# -- retries ---------------------------------------------------------------------------------
# The engine answers every failed pull with a 500 whose explanation is the registry's error;
# these are the explanations it gave for a loopback registry answering 503, 404 (manifest
# unknown) and 401, and for no registry listening (see the engine test in
# tests/integration/sandbox_worker/images/test_images.py).
TRANSIENT = (
    "received unexpected HTTP status: 503 Service Unavailable",
    'Get "http://127.0.0.1:9/v2/": dial tcp 127.0.0.1:9: connect: connection refused',
)
PERMANENT = ("manifest unknown", "unauthorized")


def _engine_error(explanation: str, status: int = 500) -> Exception:
    import docker.errors
    import requests

    response = requests.Response()
    response.status_code = status
    return docker.errors.APIError("500 Server Error", response=response, explanation=explanation)


class RegistryFailureClient:
    """TEST STUB of the Docker client at the API boundary (``images.get`` / ``images.pull``):
    the engine holds no image, and each image's pulls fail with the given engine errors, in
    order, then succeed. The real registry is unreachable from tests; the engine test covers
    a loopback registry."""

    def __init__(self, failures: dict[str, list[Exception]]) -> None:
        self.failures = failures
        self.pulls: dict[str, int] = {}
        self.images = self

    def get(self, image: str) -> None:
        import docker.errors

        raise docker.errors.ImageNotFound(image)

    def pull(self, repository: str, tag: str) -> None:
        image = f"{repository}:{tag}"
        self.pulls[image] = self.pulls.get(image, 0) + 1
        pending = self.failures.get(image, [])
        if pending:
            raise pending.pop(0)


@pytest.mark.parametrize("explanation", TRANSIENT)
def test_a_transient_failure_is_retried_with_backoff(explanation: str) -> None:
    from sandbox_worker.image_pull import RetryPolicy, pull_all

    client = RegistryFailureClient({"a:1": [_engine_error(explanation)] * 2})
    waits: list[float] = []
    lines: list[str] = []
    policy = RetryPolicy(retries=3, backoff_s=0.5)
    results = pull_all(client, {"a:1": ["a-1"]}, parallel=1, progress=lines.append,
                       retry=policy, sleep=waits.append)  # fmt: skip
    assert [(r.state, r.attempts) for r in results] == [("pulled", 3)]
    assert client.pulls == {"a:1": 3}
    assert waits == [0.5, 1.0]  # doubled
    assert sum("retrying in" in line for line in lines) == 2


def test_retries_are_bounded() -> None:
    from sandbox_worker.image_pull import RetryPolicy, pull_all

    client = RegistryFailureClient({"a:1": [_engine_error(TRANSIENT[0])] * 10})
    waits: list[float] = []
    policy = RetryPolicy(retries=4, backoff_s=1.0, max_backoff_s=3.0)
    results = pull_all(client, {"a:1": ["a-1"]}, parallel=1, progress=lambda _: None,
                       retry=policy, sleep=waits.append)  # fmt: skip
    assert [(r.state, r.attempts) for r in results] == [("missing", 5)]
    assert "503" in results[0].error
    assert waits == [1.0, 2.0, 3.0, 3.0]  # capped at max_backoff_s
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)


@pytest.mark.parametrize(
    "error",
    [*(_engine_error(e) for e in PERMANENT), _engine_error("no such image", status=404)],
)
def test_a_permanent_failure_is_not_retried(error: Exception) -> None:
    from sandbox_worker.image_pull import RetryPolicy, pull_all

    client = RegistryFailureClient({"a:1": [error] * 3})
    waits: list[float] = []
    results = pull_all(client, {"a:1": ["a-1"]}, parallel=1, progress=lambda _: None,
                       retry=RetryPolicy(retries=3), sleep=waits.append)  # fmt: skip
    assert [(r.state, r.attempts) for r in results] == [("missing", 1)]
    assert client.pulls == {"a:1": 1} and waits == []
