"""What a caller may ask of the services, over real HTTP (a ``python -m services.api`` process)
and real Redis: path fields confined to the configured roots (the attacks: ``/etc/cron.d``,
``../../root/.ssh``, ``/etc/shadow``, a symlink out of a root, a sibling prefix, relative,
empty and NUL paths), tasks per job, and jobs in flight per token (429), counted exactly when
many submissions race. A refused request leaves nothing in Redis."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from services.api.claims import JobClaims
from services.api.schemas import JobKind, JobState
from tests.support.api_server import TOKENS, ApiServer, bearer, start_api
from tests.support.redis import RedisServer

pytestmark = pytest.mark.slow

IN_FLIGHT = 5  # api.quotas.max_jobs_in_flight of the module's server
BOB_IN_FLIGHT = 8  # bob's token sets its own
ROLLOUT = {"instance_ids": ["inst-1"], "n_samples": 1}


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = Path(tmp_path_factory.mktemp("roots"))
    data, out, secret = base / "data", base / "out", base / "secret"
    for folder in (data, out, secret, Path(f"{data}2")):
        folder.mkdir()
    (secret / "id_rsa").write_text("not for jobs")
    (data / "escape").symlink_to(secret)  # inside the input root, pointing out of it
    (out / "cron").symlink_to("/etc/cron.d")
    return {"data": data, "out": out, "secret": secret}


def tokens_env() -> str:
    items = []
    for name, (secret, scopes) in TOKENS.items():
        own = f", max_jobs_in_flight: {BOB_IN_FLIGHT}" if name == "bob" else ""
        items.append(f"{{name: {name}, token: {secret}, scopes: [{', '.join(scopes)}]{own}}}")
    return "[" + ", ".join(items) + "]"


@pytest.fixture(scope="module")
def api(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, roots: dict[str, Path]
) -> Iterator[ApiServer]:
    env = {
        "SWERL_API__TOKENS": tokens_env(),
        "SWERL_API__PATHS__INPUTS": f"[{roots['data']}]",
        "SWERL_API__PATHS__OUTPUTS": f"[{roots['out']}]",
        "SWERL_API__QUOTAS__MAX_JOBS_IN_FLIGHT": str(IN_FLIGHT),
    }
    server = start_api(redis_server.url, Path(tmp_path_factory.mktemp("api")), env=env)
    yield server
    server.stop()


@pytest.fixture
def http(api: ApiServer, redis_url: str) -> Iterator[httpx.Client]:
    """alice's client on an empty Redis."""
    with api.client("alice") as client:
        yield client


@pytest.fixture
def rclient(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def train(roots: dict[str, Path], **over: Any) -> dict[str, Any]:
    data, out = roots["data"], roots["out"]
    return {"model": f"{data}/model", "dataset": f"{data}/ids.txt", "steps": 2,
            "checkpoint_dir": f"{out}/ck", **over}  # fmt: skip


def nothing_stored(rclient: redis.Redis) -> bool:
    return rclient.keys("swerl:api:job:*") == [] and rclient.keys("swerl:api:inflight:*") == []


ATTACKS = [
    ("train", {"checkpoint_dir": "/etc/cron.d"}, "body.checkpoint_dir"),
    ("train", {"checkpoint_dir": "{out}/cron"}, "body.checkpoint_dir"),  # symlink out
    ("train", {"checkpoint_dir": "../../root/.ssh"}, "body.checkpoint_dir"),
    ("train", {"checkpoint_dir": "{out}/../../../../root/.ssh"}, "body.checkpoint_dir"),
    ("train", {"checkpoint_dir": "{data}/ck"}, "body.checkpoint_dir"),  # input root: no writes
    ("train", {"dataset": "/etc/shadow"}, "body.dataset"),
    ("train", {"dataset": "{data}/escape/id_rsa"}, "body.dataset"),  # symlink out
    ("train", {"dataset": "{data}/ids.jsonl:1,/etc/shadow.jsonl:1"}, "body.dataset"),
    ("train", {"model": "{data}2/model"}, "body.model"),  # /x/data2 is not under /x/data
    ("train", {"model": "tiny"}, "body.model"),  # relative: the trainer's cwd decides
    ("eval", {"predictions": "/etc/shadow", "dataset": "{data}/d.jsonl"}, "body.predictions"),
    ("eval", {"checkpoint": "/root", "dataset": "{data}/d.jsonl"}, "body.checkpoint"),
    ("eval", {"predictions": "gold", "dataset": "/etc/passwd"}, "body.dataset"),
]


@pytest.mark.parametrize(("kind", "fields", "field"), ATTACKS)
def test_paths_out_of_the_roots_are_422_naming_field_and_roots(
    http: httpx.Client,
    rclient: redis.Redis,
    roots: dict[str, Path],
    kind: str,
    fields: dict[str, str],
    field: str,
) -> None:
    filled = {k: v.format(data=roots["data"], out=roots["out"]) for k, v in fields.items()}
    body = train(roots, **filled) if kind == "train" else filled
    got = http.post(f"/v1/jobs/{kind}", json=body)
    assert got.status_code == 422, got.text
    err = got.json()["error"]
    assert (err["type"], err["field"]) == ("path_not_allowed", field)
    assert str(roots["out"]) in err["message"] or "relative" in err["message"]
    assert nothing_stored(rclient)


@pytest.mark.parametrize("value", ["", "/x\u0000/../etc/shadow", "\u0000"])
def test_empty_and_nul_paths_are_422(
    http: httpx.Client, rclient: redis.Redis, roots: dict[str, Path], value: str
) -> None:
    got = http.post("/v1/jobs/train", json=train(roots, dataset=value))
    assert got.status_code == 422 and got.json()["error"]["field"] == "body.dataset"
    assert nothing_stored(rclient)


def test_paths_inside_the_roots_are_queued_as_given(
    http: httpx.Client, roots: dict[str, Path]
) -> None:
    """``%2e%2e`` in a JSON body is a directory name, not ``..`` (nothing URL-decodes it)."""
    body = train(roots, dataset=f"{roots['data']}/%2e%2e/%2e%2e/ids.txt")
    got = http.post("/v1/jobs/train", json=body)
    assert got.status_code == 201, got.text
    assert got.json()["spec"]["dataset"] == body["dataset"]
    evals = {"checkpoint": f"{roots['out']}/ck/step-2", "dataset": f"{roots['data']}/d.jsonl"}
    assert http.post("/v1/jobs/eval", json=evals).status_code == 201


@pytest.mark.parametrize("job_id", ["%2e%2e%2f%2e%2e%2fetc%2fpasswd", "..%2f..%2fetc", "%00"])
def test_encoded_traversal_in_url_paths_is_not_found_or_invalid(
    http: httpx.Client, job_id: str
) -> None:
    for path in (f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/logs"):
        got = http.get(path)
        assert got.status_code in (404, 422), (path, got.status_code)


@pytest.mark.parametrize(
    ("kind", "body", "field"),
    [
        ("rollout", {"instance_ids": [f"i-{n}" for n in range(10_000)], "n_samples": 1024},
         "body.instance_ids"),
        ("eval", {"predictions": "gold", "dataset": "{data}/d.jsonl", "max_instances": 100_000},
         "body.max_instances"),
        ("train", {"batch": {"prompts_per_step": 1000, "samples_per_prompt": 64}}, "body.batch"),
    ],
)  # fmt: skip
def test_a_job_over_the_tasks_per_job_quota_is_422(
    http: httpx.Client,
    rclient: redis.Redis,
    roots: dict[str, Path],
    kind: str,
    body: dict[str, Any],
    field: str,
) -> None:
    """10 M rollout tasks in one job (the default limit is 10,000 per job)."""
    if kind == "train":
        body = train(roots, **body)
    elif kind == "eval":
        body = {**body, "dataset": body["dataset"].format(data=roots["data"])}
    got = http.post(f"/v1/jobs/{kind}", json=body)
    assert got.status_code == 422, got.text
    err = got.json()["error"]
    assert (err["type"], err["field"]) == ("quota_exceeded", field)
    assert "max_tasks_per_job" in err["message"]
    assert nothing_stored(rclient)


def test_jobs_in_flight_are_429_until_one_ends(http: httpx.Client, rclient: redis.Redis) -> None:
    ids = []
    for _ in range(IN_FLIGHT):
        got = http.post("/v1/jobs/rollout", json=ROLLOUT)
        assert got.status_code == 201
        ids.append(got.json()["id"])
    burst = [http.post("/v1/jobs/rollout", json=ROLLOUT).status_code for _ in range(200)]
    assert set(burst) == {429}
    refused = http.post("/v1/jobs/rollout", json=ROLLOUT).json()["error"]
    assert refused["type"] == "quota_exceeded" and "max_jobs_in_flight" in refused["message"]
    assert len(http.get("/v1/jobs", params={"limit": 500}).json()["jobs"]) == IN_FLIGHT
    key = {"Idempotency-Key": "k"}
    assert http.post("/v1/jobs/rollout", json=ROLLOUT, headers=key).status_code == 429
    # A cancel frees a place (and the refused key was not used up) ...
    assert http.post(f"/v1/jobs/{ids[0]}/cancel").status_code == 200
    assert http.post("/v1/jobs/rollout", json=ROLLOUT, headers=key).status_code == 201
    # ... a retry of a job already made is answered at the quota too ...
    assert http.post("/v1/jobs/rollout", json=ROLLOUT, headers=key).status_code == 200
    assert http.post("/v1/jobs/rollout", json=ROLLOUT).status_code == 429
    # ... and a job its runner finishes frees one (the claims protocol).
    claims = JobClaims(rclient)
    claim = claims.claim(JobKind.ROLLOUT, "default", "runner-1", ttl_s=30)
    assert claim is not None
    assert claims.finish(claim.job_id, "runner-1", JobState.SUCCEEDED, "done")
    assert http.post("/v1/jobs/rollout", json=ROLLOUT).status_code == 201
    assert rclient.scard("swerl:api:inflight:alice") == IN_FLIGHT


def submit_together(api: ApiServer, who: str, n: int) -> list[int]:
    """``n`` submissions by ``who`` released at once, each on its own connection."""
    start = threading.Barrier(n)
    codes: list[int] = []
    lock = threading.Lock()

    def one() -> None:
        with httpx.Client(base_url=api.url, headers=bearer(who), timeout=60) as client:
            client.get("/healthz")  # connected before the race starts
            start.wait()
            code = client.post("/v1/jobs/rollout", json=ROLLOUT).status_code
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return codes


def test_racing_submissions_never_pass_the_quota(api: ApiServer, rclient: redis.Redis) -> None:
    """40 of alice's and 40 of bob's submissions at once: exactly each token's limit pass."""
    alice = submit_together(api, "alice", 40)
    bob = submit_together(api, "bob", 40)
    assert sorted(alice) == [201] * IN_FLIGHT + [429] * (40 - IN_FLIGHT)
    assert sorted(bob) == [201] * BOB_IN_FLIGHT + [429] * (40 - BOB_IN_FLIGHT)
    jobs = [key for key in rclient.keys("swerl:api:job:*") if key.count(b":") == 3]
    owners = [rclient.hget(key, "submitted_by") for key in jobs]
    assert sorted(owners) == [b"alice"] * IN_FLIGHT + [b"bob"] * BOB_IN_FLIGHT
