"""The job API over real HTTP (a ``python -m services.api`` process) and real Redis: auth and
scopes, errors that name the field, idempotency, pagination, results (JSON and NDJSON), logs,
progress events, cancel, health, readiness and metrics. One server for the module (no job
runner: results are written through the claims protocol, as a runner would)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from services.api.claims import JobClaims
from services.api.schemas import JobKind, JobState
from services.api.store import JobStore
from services.protocol.progress import ProgressPhase, TrajectoryProgress
from services.store.progress import ProgressStore
from tests.support.api_server import ApiServer, bearer, start_api
from tests.support.execution import open_record
from tests.support.paths import REPO_ROOT
from tests.support.redis import RedisServer

pytestmark = pytest.mark.slow

ROLLOUT = {"instance_ids": ["inst-1", "inst-2"], "n_samples": 2}
# Paths under the roots the module's server is given (api.paths).
DATA, OUT = "/srv/swerl-test/data", "/srv/swerl-test/out"
ROOTS = {"SWERL_API__PATHS__INPUTS": f"[{DATA}]", "SWERL_API__PATHS__OUTPUTS": f"[{OUT}]"}
TRAIN = {"model": f"{DATA}/tiny", "dataset": f"{DATA}/ids.txt", "steps": 10,
         "checkpoint_dir": f"{OUT}/ck"}  # fmt: skip
EVAL = {"checkpoint": f"{OUT}/ck", "dataset": f"{DATA}/d.jsonl"}
# A dataset the API can read (an input root too): eval instance ids are checked against it.
MINI = REPO_ROOT / "tests" / "data"
ROOTS_WITH_MINI = {**ROOTS, "SWERL_API__PATHS__INPUTS": f"[{DATA}, {MINI}]"}


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = start_api(redis_server.url, Path(tmp_path_factory.mktemp("api")), env=ROOTS_WITH_MINI)
    yield server
    server.stop()


@pytest.fixture
def http(api: ApiServer, redis_url: str) -> Iterator[httpx.Client]:
    """alice's client on an empty Redis."""
    with api.client("alice") as client:
        yield client


def test_submit_records_the_submitter(http: httpx.Client) -> None:
    got = http.post("/v1/jobs/rollout", json=ROLLOUT)
    assert got.status_code == 201
    job = got.json()
    assert (job["kind"], job["state"], job["submitted_by"]) == ("rollout", "queued", "alice")
    assert http.get(f"/v1/jobs/{job['id']}").json()["spec"]["instance_ids"] == ["inst-1", "inst-2"]


@pytest.mark.parametrize(
    ("who", "method", "path", "status"),
    [
        (None, "GET", "/v1/jobs", 401),
        ("viewer", "GET", "/v1/jobs", 200),
        ("viewer", "POST", "/v1/jobs/rollout", 403),
        ("alice", "POST", "/v1/jobs/rollout", 201),
    ],
)
def test_scopes(api: ApiServer, redis_url: str, who: str | None, method: str, path: str,
                status: int) -> None:  # fmt: skip
    with api.client(who) as client:
        got = client.request(method, path, json=ROLLOUT if method == "POST" else None)
    assert got.status_code == status
    if status >= 400:
        assert got.json()["error"]["field"] == "header.Authorization"


def test_auth_comes_before_validation(api: ApiServer, redis_url: str) -> None:
    """A caller without the right token learns nothing about the inputs."""
    with api.client(None) as anonymous:
        assert anonymous.post("/v1/jobs/train", json={"steps": "x"}).status_code == 401
        assert anonymous.get("/v1/jobs", params={"limit": 0}).status_code == 401
    with api.client("viewer") as viewer:
        assert viewer.post("/v1/jobs/train", json={"steps": "x"}).status_code == 403


def test_only_the_submitter_or_an_admin_cancels(api: ApiServer, http: httpx.Client) -> None:
    job_id = http.post("/v1/jobs/rollout", json=ROLLOUT).json()["id"]
    with api.client("bob") as bob:
        refused = bob.post(f"/v1/jobs/{job_id}/cancel")
    assert refused.status_code == 403 and "alice" in refused.json()["error"]["message"]
    with api.client("root") as root:
        assert root.post(f"/v1/jobs/{job_id}/cancel").json()["state"] == "cancelled"
    again = http.post(f"/v1/jobs/{job_id}/cancel")
    assert again.status_code == 409 and again.json()["error"]["type"] == "finished"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/jobs/train", {**TRAIN, "steps": 0}, "body.steps"),
        ("/v1/jobs/train", {**TRAIN, "stepz": 3}, "body.stepz"),
        ("/v1/jobs/rollout", {"instance_ids": "x"}, "body.instance_ids"),
        ("/v1/jobs/eval", {"checkpoint": f"{OUT}/ck"}, "body.dataset"),
        ("/v1/jobs/train", {**TRAIN, "algorithm": "li2sa0"}, "body.algorithm"),
    ],
)
def test_bad_bodies_name_the_field(http: httpx.Client, path: str, body: dict, field: str) -> None:
    got = http.post(path, json=body)
    assert got.status_code == 422
    assert got.json()["error"]["field"] == field


def test_submission_checks_instances_and_warns_of_a_group_no_trainer_serves(
    http: httpx.Client, redis_url: str
) -> None:
    dataset = MINI / "instances.jsonl"
    known = json.loads(dataset.read_text().splitlines()[0])["instance_id"]
    body = {"predictions": "gold", "dataset": str(dataset)}
    bad = http.post("/v1/jobs/eval", json={**body, "instance_ids": [known, "nope__nope-1"]})
    assert bad.status_code == 422
    error = bad.json()["error"]
    assert error["field"] == "body.instance_ids" and "'nope__nope-1'" in error["message"]
    assert known not in error["message"]
    assert http.post("/v1/jobs/eval", json={**body, "instance_ids": [known]}).status_code == 201
    unserved = http.post("/v1/jobs/train", json={**TRAIN, "trainer_group": "gpu-a"})
    assert unserved.status_code == 201  # accepted: a trainer may start later
    assert any("'gpu-a'" in w for w in unserved.json()["warnings"])
    client = redis.Redis.from_url(redis_url)
    JobStore(client).announce(JobKind.TRAIN, "gpu-a", "trainer:gpu-a:host:1")
    client.close()
    served = http.post("/v1/jobs/train", json={**TRAIN, "trainer_group": "gpu-a", "steps": 2})
    assert served.status_code == 201 and served.json()["warnings"] == []


def test_a_rollout_job_shows_how_its_trajectories_ended(http: httpx.Client, redis_url: str) -> None:
    job_id = http.post("/v1/jobs/rollout", json=ROLLOUT).json()["id"]
    client = redis.Redis.from_url(redis_url)
    claims = JobClaims(client)
    assert claims.claim(JobKind.ROLLOUT, "default", "r1", 30, 10) is not None
    metrics = {"n_completed": 2.0, "n_aborted": 1.0, "resolved_rate": 0.5, "mean_reward": 0.5}
    claims.heartbeat(job_id, "r1", 30, None, metrics)
    client.close()
    counts = http.get(f"/v1/jobs/{job_id}").json()["trajectories"]
    assert counts == {"total": 3, "graded": 2, "resolved": 1, "aborted": 1}


def test_bad_queries_paths_and_json(http: httpx.Client) -> None:
    assert http.get("/v1/jobs?limit=0").json()["error"]["field"] == "query.limit"
    assert http.get("/v1/jobs?kind=nope").json()["error"]["field"] == "query.kind"
    assert http.get("/v1/jobs/no%20such").status_code == 422
    missing = http.get("/v1/jobs/rollout-1")
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "path.job_id"
    json_type = {"content-type": "application/json"}
    broken = http.post("/v1/jobs/rollout", content=b"{", headers=json_type)
    assert broken.status_code == 422 and broken.json()["error"]["field"].startswith("body")


def test_idempotency_over_http(http: httpx.Client) -> None:
    key = {"Idempotency-Key": "run-42"}
    first = http.post("/v1/jobs/train", json=TRAIN, headers=key)
    again = http.post("/v1/jobs/train", json=TRAIN, headers=key)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    other = http.post("/v1/jobs/train", json={**TRAIN, "steps": 11}, headers=key)
    assert other.status_code == 409 and other.json()["error"]["field"] == "header.Idempotency-Key"


def test_list_pages_and_filters(http: httpx.Client) -> None:
    ids = [http.post("/v1/jobs/rollout", json=ROLLOUT).json()["id"] for _ in range(5)]
    train = http.post("/v1/jobs/train", json=TRAIN).json()["id"]
    seen, cursor = [], None
    while True:
        params = {"kind": "rollout", "limit": 2, **({"cursor": cursor} if cursor else {})}
        page = http.get("/v1/jobs", params=params).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    queued_train = http.get("/v1/jobs", params={"kind": "train", "state": "queued"}).json()
    assert [j["id"] for j in queued_train["jobs"]] == [train]


def test_results_json_pages_and_ndjson(http: httpx.Client, redis_url: str) -> None:
    job_id = http.post("/v1/jobs/rollout", json=ROLLOUT).json()["id"]
    client = redis.Redis.from_url(redis_url)
    claims, store = JobClaims(client), JobStore(client)
    claims.claim(JobKind.ROLLOUT, "default", "runner-t", ttl_s=30, max_active=4)
    rows = [{"task_id": f"{job_id}:0:{i}", "reward": float(i % 2)} for i in range(5)]
    store.append_results(job_id, "runner-t", rows)
    page = http.get(f"/v1/jobs/{job_id}/results", params={"limit": 2, "offset": 2}).json()
    assert page == {"results": rows[2:4], "total": 5, "next_offset": 4}
    got = http.get(f"/v1/jobs/{job_id}/results", params={"format": "ndjson", "offset": 1})
    assert got.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line) for line in got.text.splitlines()] == rows[1:]
    claims.finish(job_id, "runner-t", JobState.SUCCEEDED, "done")
    followed = http.get(f"/v1/jobs/{job_id}/results", params={"format": "ndjson", "follow": True})
    assert len(followed.text.splitlines()) == 5
    sse = http.get(f"/v1/jobs/{job_id}/results", params={"format": "sse", "offset": 3, "follow": 1})
    assert sse.headers["content-type"].startswith("text/event-stream")
    events = [e.splitlines() for e in sse.text.strip().split("\n\n")]
    assert events[:2] == [
        ["id: 3", f"data: {json.dumps(rows[3], separators=(',', ':'))}"],
        ["id: 4", f"data: {json.dumps(rows[4], separators=(',', ':'))}"],
    ]
    assert events[2] == ["event: end", 'data: {"state": "succeeded"}']
    client.close()


def test_trajectory_records_of_a_job(http: httpx.Client, redis_url: str) -> None:
    job_id = http.post("/v1/jobs/rollout", json=ROLLOUT).json()["id"]
    other = http.post("/v1/jobs/rollout", json=ROLLOUT).json()["id"]
    open_record(redis_url, f"{job_id}:0:1.a1")
    got = http.get(f"/v1/jobs/{job_id}/trajectories/{job_id}:0:1.a1")
    assert got.status_code == 200
    assert got.json()["meta"]["trajectory_id"] == f"{job_id}:0:1.a1"
    foreign = http.get(f"/v1/jobs/{other}/trajectories/{job_id}:0:1.a1")
    assert foreign.status_code == 404 and "is not one of job" in foreign.json()["error"]["message"]
    missing = http.get(f"/v1/jobs/{job_id}/trajectories/{job_id}:1:0.a1")
    assert missing.status_code == 404 and missing.json()["error"]["field"] == "path.trajectory_id"


def test_logs_and_cancel_of_a_running_job(http: httpx.Client, redis_url: str) -> None:
    job_id = http.post("/v1/jobs/rollout", json=ROLLOUT).json()["id"]
    client = redis.Redis.from_url(redis_url)
    JobClaims(client).claim(JobKind.ROLLOUT, "default", "runner-t", ttl_s=30, max_active=4)
    assert http.post(f"/v1/jobs/{job_id}/cancel").json()["state"] == "cancelling"
    logs = http.get(f"/v1/jobs/{job_id}/logs").json()
    messages = [line["message"] for line in logs["lines"]]
    assert messages == ["submitted by alice", "cancel requested by alice"]
    assert logs["next_offset"] == 2
    assert http.get(f"/v1/jobs/{job_id}/logs", params={"offset": 2}).json()["lines"] == []
    client.close()


def test_health_readiness_and_metrics(api: ApiServer, http: httpx.Client) -> None:
    assert httpx.get(f"{api.url}/healthz").json()["status"] == "ok"
    assert httpx.get(f"{api.url}/readyz").status_code == 200
    assert http.post("/v1/jobs/eval", json=EVAL).status_code == 201
    text = httpx.get(f"{api.url}/metrics").text
    assert 'swerl_api_jobs{kind="eval",state="queued"} 1.0' in text
    assert 'swerl_api_requests_total{method="POST",route="/v1/jobs/eval",status="201"}' in text


def test_readiness_fails_without_redis(fresh_redis: RedisServer, tmp_path: Path) -> None:
    quick = {"SWERL_API__QUEUE__CONNECT_RETRIES": "1", "SWERL_API__QUEUE__SOCKET_TIMEOUT_S": "2"}
    server = start_api(fresh_redis.url, tmp_path, env=quick)
    try:
        fresh_redis.stop(kill=True)
        got = httpx.get(f"{server.url}/readyz", timeout=60)
        assert got.status_code == 503 and got.json()["status"] == "unavailable"
        listing = httpx.get(f"{server.url}/v1/jobs", headers=bearer("root"), timeout=60)
        assert listing.status_code == 503 and listing.json()["error"]["type"] == "unavailable"
    finally:
        server.stop()


def test_progress_of_a_rollout_job(http: httpx.Client, redis_url: str) -> None:
    job_id = http.post("/v1/jobs/rollout", json=ROLLOUT).json()["id"]
    assert http.get(f"/v1/jobs/{job_id}/progress").json() == {
        "latest": [], "events": [], "next_after": None}  # fmt: skip
    client = redis.Redis.from_url(redis_url)
    store = ProgressStore(client)  # the worker's: the queue's default prefix
    base = {"batch_id": job_id, "job_id": job_id, "instance_id": "inst-1", "node": "n1",
            "started_at": 100.0}  # fmt: skip
    events = [
        TrajectoryProgress(**base, trajectory_id=f"{job_id}:0:0.a1", task_id=f"{job_id}:0:0",
                           phase=ProgressPhase.AGENT, elapsed_s=5.0, ts=105.0, turn=1),
        TrajectoryProgress(**base, trajectory_id=f"{job_id}:0:0.a1", task_id=f"{job_id}:0:0",
                           phase=ProgressPhase.AGENT, elapsed_s=11.0, ts=111.0, turn=3,
                           current_tool="terminal"),
    ]  # fmt: skip
    for e in events:
        store.emit(e)
    client.close()
    page = http.get(f"/v1/jobs/{job_id}/progress").json()
    assert [TrajectoryProgress.model_validate(e) for e in page["latest"]] == events[1:]
    assert page["events"] == [] and page["next_after"] is None
    page = http.get(f"/v1/jobs/{job_id}/progress", params={"after": "0"}).json()
    assert [TrajectoryProgress.model_validate(e) for e in page["events"]] == events
    again = http.get(f"/v1/jobs/{job_id}/progress", params={"after": page["next_after"]})
    assert again.json()["events"] == []
    bad = http.get(f"/v1/jobs/{job_id}/progress", params={"after": "$"})
    assert bad.status_code == 422 and bad.json()["error"]["field"] == "query.after"
    assert http.get("/v1/jobs/rollout-nope/progress").status_code == 404
