"""``python -m services.demo --model``: which policy directory the engines serve."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from sandbox_worker.config import NODE_PATTERN
from services.demo import main, resolve_model
from services.demo_report import TrajectoryRow


def _model(directory: Path) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text("{}")
    return directory


def test_an_hf_model_directory_is_served_as_it_is(tmp_path: Path) -> None:
    model = _model(tmp_path / "m")
    assert resolve_model(model) == model


def test_a_weights_directory_serves_its_newest_published_version(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    for name in ("v9", "v10", "v2"):
        _model(weights / name)
    (weights / "v11").mkdir()  # an export still being written: no config.json
    (weights / "vx").mkdir()
    assert resolve_model(weights) == weights / "v10"  # numeric order, not lexical


@pytest.mark.parametrize("make", ["missing", "empty"])
def test_a_directory_without_a_model_is_refused(tmp_path: Path, make: str) -> None:
    path = tmp_path / "nothing"
    if make == "empty":
        path.mkdir()
    with pytest.raises(ValueError, match="nothing"):
        resolve_model(path)


def test_the_cli_refuses_a_bad_model_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--model", str(tmp_path / "absent"), "--run-dir", str(tmp_path / "run")])
    assert code == 2
    assert "--model" in capsys.readouterr().err


class _Stack:
    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def stop_all(self) -> None:
        pass


class _Manager:
    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url

    def start(self) -> None:
        pass

    def submit(self, request: object) -> str:
        return "b1"

    def close(self) -> None:
        pass


def _row(instance_id: str, status: str, reward: float | None) -> TrajectoryRow:
    return TrajectoryRow(f"t-{instance_id}", instance_id, 0, "g", [], status, reward, 0, 0)


@pytest.fixture
def fake_services(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """``main`` with every service replaced: what it starts is recorded, what the batch
    returns is ``state["rows"]``."""
    import services.demo as demo

    state: dict[str, Any] = {"nodes": [], "rows": []}
    monkeypatch.setattr(demo, "LocalStack", _Stack)
    monkeypatch.setattr(demo, "RolloutManager", _Manager)
    monkeypatch.setattr(demo, "start_services", lambda *a: ("redis://r", "http://a", {}))
    monkeypatch.setattr(demo, "start_worker", lambda *a: state["nodes"].append(a[5]))
    monkeypatch.setattr(demo, "wait_for_batch", lambda *a: [])
    monkeypatch.setattr(demo, "report", lambda *a: ([], state["rows"]))
    monkeypatch.setattr(demo, "objective_metrics", lambda *a: None)
    return state


def _run(tmp_path: Path, name: str) -> int:
    model = tmp_path / "model"
    if not model.exists():
        _model(model)
    return main(["--model", str(model), "--run-dir", str(tmp_path / name), "--samples", "1"])


def test_every_trajectory_aborted_is_a_failed_demo(
    tmp_path: Path, fake_services: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake_services["rows"] = [_row("a__b-1", "aborted", None), _row("a__b-2", "aborted", None)]
    assert _run(tmp_path, "all-aborted") == 1
    assert "every trajectory aborted" in capsys.readouterr().err
    fake_services["rows"] = [_row("a__b-1", "aborted", None), _row("a__b-2", "completed", 0.0)]
    assert _run(tmp_path, "one-graded") == 0


def test_each_demo_runs_its_worker_under_a_node_name_of_its_own(
    tmp_path: Path, fake_services: dict[str, Any]
) -> None:
    """The worker removes the sandboxes of its node name at start: two demos sharing one would
    destroy each other's sandboxes."""
    fake_services["rows"] = [_row("a__b-1", "completed", 1.0)]
    assert _run(tmp_path, "first") == 0 and _run(tmp_path, "second") == 0
    first, second = fake_services["nodes"]
    assert first != second
    assert all(re.fullmatch(NODE_PATTERN, node) for node in (first, second))


def test_a_registered_task_set_runs_by_name_in_its_own_images(
    tmp_path: Path, fake_services: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``--instances NAME`` of a set ``images add`` registered: the request names its
    ``NAME/<id>`` keys, and the demo's worker resolves them to the images ``add`` built."""
    import json

    import services.demo as demo
    from sandbox_worker import images
    from sandbox_worker.config import TrajectoryRunnerConfig
    from sandbox_worker.factory import _image_naming, worker_task_instances
    from tests.support.mixtures import mini_rows

    monkeypatch.setenv("SWERL_CACHE", str(tmp_path / "cache"))
    sets = tmp_path / "cache" / "tasksets"
    sets.mkdir(parents=True)
    rows = mini_rows()[:2]
    (sets / "mine.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    seen: dict[str, Any] = {}

    class Recording(_Manager):
        def submit(self, request: Any) -> str:
            seen["request"] = request
            return "b1"

    monkeypatch.setattr(demo, "RolloutManager", Recording)
    monkeypatch.setattr(demo, "start_worker", lambda *a: seen.update(tasks=a[7]))
    fake_services["rows"] = [_row("a__b-1", "completed", 1.0)]
    model = _model(tmp_path / "model")
    argv = ["--model", str(model), "--run-dir", str(tmp_path / "run"), "--instances", "mine"]
    assert main(argv) == 0
    keys = [f"mine/{r['instance_id']}" for r in rows]
    assert seen["request"].instance_ids == keys
    env = seen["tasks"].worker_env()
    rc = TrajectoryRunnerConfig(task_sets_dir=env["SWERL_WORKER__ROLLOUT__TASK_SETS_DIR"])
    naming = _image_naming(rc, worker_task_instances(rc))
    assert [naming(k) for k in keys] == [images.local_image("mine", r["instance_id"]) for r in rows]
    capsys.readouterr()
    assert main([*argv[:-1], "theirs"]) == 2
    err = capsys.readouterr().err
    assert "'theirs'" in err and "mine" in err and "Traceback" not in err
