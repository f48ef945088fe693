"""``python -m adapter`` as a process: start-up, a recorded call, and configuration errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration.adapter.conftest import EnginePool
from tests.support.adapter_process import launch_adapter
from tests.support.engines import REPO_ROOT

pytestmark = pytest.mark.engines("a")


def test_cli_serves_and_records(
    engines: EnginePool, model_dir: Path, redis_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "swerl.yaml"
    config.write_text("adapter:\n  served_model_name: from-yaml\n  default_max_tokens: 3\n")
    extra = ["--config", str(config), "--admin-token", "t0k"]
    adapter = launch_adapter([engines.a.url], model_dir, redis_url, tmp_path, extra_args=extra)
    with adapter.managed:
        url = adapter.url
        r = httpx.post(
            f"{url}/t/cli-1/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}]},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "from-yaml"
        assert r.json()["usage"]["completion_tokens"] <= 3  # default_max_tokens from the YAML
        record = httpx.get(f"{url}/trajectories/cli-1").json()
        assert record["counters"]["turns"] == 1
        models = httpx.get(f"{url}/v1/models").json()
        assert models["data"][0]["id"] == "from-yaml"
        versions = httpx.get(f"{url}/admin/versions", headers={"authorization": "Bearer t0k"})
        assert versions.status_code == 200


def test_cli_rejects_bad_configuration(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "adapter", "--engines", "localhost:1", "--model", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert result.returncode == 2
    assert "adapter.engines" in result.stderr
    assert "must start with http://" in result.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "adapter", "--engines", "http://127.0.0.1:1",
         "--model", str(tmp_path)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    assert missing.returncode == 2
    assert "cannot load the model's tokenizer" in missing.stderr
