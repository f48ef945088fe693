"""The ``swerl`` command (a real process) against a live job API and real Redis: what it prints
and the exit status of each outcome."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from services.api.claims import JobClaims
from services.api.schemas import JobKind
from services.api.store import JobStore
from services.swerl_cli.errors import EXIT_OK, EXIT_REDIS_DOWN, EXIT_UNREACHABLE
from tests.support.api_server import TOKENS, ApiServer, start_api
from tests.support.paths import REPO_ROOT
from tests.support.redis import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = start_api(redis_server.url, Path(tmp_path_factory.mktemp("api")))
    yield server
    server.stop()


def swerl_cmd(api: ApiServer, *argv: str) -> list[str]:
    return [sys.executable, "-m", "services.swerl_cli", "--api", api.url, *argv]


def swerl_env(who: str = "alice") -> dict[str, str]:
    return {"SWERL_API_TOKEN": TOKENS[who][0], "PATH": "/usr/bin:/bin"}


def swerl(api: ApiServer, *argv: str, who: str = "alice") -> subprocess.CompletedProcess[str]:
    cmd, env = swerl_cmd(api, *argv), swerl_env(who)
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=60)


def test_submit_status_logs_cancel(api: ApiServer, redis_url: str) -> None:
    sub = swerl(api, "submit", "rollout", "--instances", "i1,i2", "--samples", "2")
    assert sub.returncode == 0, sub.stderr
    job_id, state = sub.stdout.split()
    assert job_id.startswith("rollout-") and state == "queued"
    listing = swerl(api, "status")
    assert listing.returncode == 0 and job_id in listing.stdout and "alice" in listing.stdout
    shown = swerl(api, "--json", "status", job_id)
    assert json.loads(shown.stdout)["spec"]["n_samples"] == 2
    cancel = swerl(api, "cancel", job_id)
    assert (cancel.returncode, cancel.stdout.split()) == (0, [job_id, "cancelled"])
    logs = swerl(api, "logs", job_id, "-f")  # the job is over: -f returns
    assert logs.returncode == 0
    assert "submitted by alice" in logs.stdout and "cancel requested by alice" in logs.stdout
    again = swerl(api, "cancel", job_id)
    assert again.returncode == 1 and "already cancelled" in again.stderr
    watched = swerl(api, "status", job_id, "--watch")
    assert watched.returncode == 6 and "cancelled" in watched.stdout


def test_job_file_and_field_errors(api: ApiServer, redis_url: str, tmp_path: Path) -> None:
    good = tmp_path / "eval.yaml"
    dataset = REPO_ROOT / "tests" / "data" / "instances.jsonl"  # paths under the API's roots
    good.write_text(f"kind: eval\nspec:\n  checkpoint: {tmp_path}/ckpt/step-10\n"
                    f"  dataset: {dataset}\n")  # fmt: skip
    sub = swerl(api, "submit", "-f", str(good), "--idempotency-key", "e1")
    again = swerl(api, "submit", "-f", str(good), "--idempotency-key", "e1")
    assert sub.returncode == 0 and sub.stdout == again.stdout
    bad = tmp_path / "train.yaml"
    bad.write_text("kind: train\nspec: {model: m, dataset: d, steps: 0, checkpoint_dir: /c}\n")
    refused = swerl(api, "submit", "-f", str(bad))
    assert refused.returncode == 1
    assert "(field: body.steps)" in refused.stderr and "Traceback" not in refused.stderr


def test_auth_and_missing_jobs(api: ApiServer, redis_url: str) -> None:
    viewer = swerl(api, "submit", "eval", "--checkpoint", "c", "--dataset", "d", who="viewer")
    assert viewer.returncode == 4 and "lacks the 'submit' scope" in viewer.stderr
    missing = swerl(api, "status", "rollout-missing")
    assert missing.returncode == 5 and "no job 'rollout-missing'" in missing.stderr


def test_an_api_whose_redis_is_down_is_told_from_an_unreachable_api(
    fresh_redis: RedisServer, tmp_path: Path
) -> None:
    server = start_api(fresh_redis.url, tmp_path)
    try:
        fresh_redis.stop()  # the API still answers: every request that needs Redis is a 503
        down = swerl(server, "status")
        assert down.returncode == EXIT_REDIS_DOWN, down.stderr
        assert down.stderr.startswith(
            f"swerl: error: the API at {server.url} answers but its Redis is down: "
        )
        assert "unreachable" not in down.stderr and f"{server.url}/readyz" in down.stderr
    finally:
        server.stop()
    gone = swerl(server, "status")  # nothing listens there any more
    assert gone.returncode == EXIT_UNREACHABLE
    assert f"the API at {server.url} is unreachable: " in gone.stderr
    assert "--api / $SWERL_API_URL" in gone.stderr and "Redis" not in gone.stderr


def test_results_into_a_reader_that_stops_early_end_quietly(api: ApiServer, redis_url: str) -> None:
    """`swerl results JOB | head -n 1`: the reader leaves after one line; swerl exits 0 with
    nothing on stderr (no BrokenPipeError traceback, no "Exception ignored" at exit)."""
    job_id = swerl(api, "submit", "rollout", "--instances", "i1").stdout.split()[0]
    client = redis.Redis.from_url(redis_url)
    claims, store = JobClaims(client), JobStore(client)
    claims.claim(JobKind.ROLLOUT, "default", "runner-t", ttl_s=30, max_active=4)
    # far more than a pipe's buffer (64 KiB), so swerl is still writing when head leaves
    rows = [{"task_id": f"{job_id}:0:{i}", "reward": 1.0, "note": "x" * 200} for i in range(2000)]
    store.append_results(job_id, "runner-t", rows)
    client.close()
    writer = subprocess.Popen(
        swerl_cmd(api, "results", job_id), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        cwd=REPO_ROOT, env=swerl_env(),
    )  # fmt: skip
    assert writer.stdout is not None and writer.stderr is not None
    reader = subprocess.Popen(["head", "-n", "1"], stdin=writer.stdout, stdout=subprocess.PIPE)
    writer.stdout.close()  # only head holds the pipe's reading end now
    first, _ = reader.communicate(timeout=60)
    err = writer.stderr.read().decode()
    assert writer.wait(timeout=60) == EXIT_OK, err
    assert err == ""
    assert json.loads(first) == rows[0]
