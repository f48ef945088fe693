"""The ``swerl`` command (a real process) against a live job API and real Redis: what it prints
and the exit status of each outcome."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.api_server import TOKENS, ApiServer, start_api
from tests.support.paths import REPO_ROOT
from tests.support.redis import RedisServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def api(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    server = start_api(redis_server.url, Path(tmp_path_factory.mktemp("api")))
    yield server
    server.stop()


def swerl(api: ApiServer, *argv: str, who: str = "alice") -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "services.swerl_cli", "--api", api.url, *argv]
    env = {"SWERL_API_TOKEN": TOKENS[who][0], "PATH": "/usr/bin:/bin"}
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
