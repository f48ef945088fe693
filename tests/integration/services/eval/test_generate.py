"""Generation mode end to end on the mini set: the training scaffold (Redis, the reference
engine on the tiny model in scripted mode, the adapter, a sandbox worker running the OpenHands
agent server under bwrap, the rollout manager) writes predictions.jsonl, then the grading
scores it. The scripted engine replays gold answers, so the instances resolve."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sandbox_worker.tasks.scripted import write_script
from services.eval.main import main
from services.protocol.instance import SWEInstance
from services.tiny_model.build import ensure_tiny_model

CHOSEN = ["swerl__strkit-1", "swerl__tinyini-2"]


@pytest.mark.slow
def test_generate_then_grade(
    mini_set: Path, instances: dict[str, SWEInstance], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
    model = ensure_tiny_model(cache / "tiny-model")
    script = write_script([instances[i] for i in CHOSEN], tmp_path / "script.jsonl")
    out = tmp_path / "out"
    args = ["--dataset", str(mini_set), "--model", str(model), "--engine-script", str(script),
            "--instances", ",".join(CHOSEN), "--backend", "bwrap", "--workers", "2",
            "--max-steps", "6", "--wall-time", "600", "--max-context", "8192",
            "--model-name", "tiny/scripted", "--report-dir", str(out)]  # fmt: skip
    code = main(args)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert sorted(p["instance_id"] for p in preds) == CHOSEN
    assert all(p["model_name_or_path"] == "tiny/scripted" and p["model_patch"] for p in preds)
    for iid in CHOSEN:
        record = json.loads((out / "trajectories" / f"{iid}.json").read_text())
        assert record["outcome"]["status"] in ("completed", "timeout", "error")
    report = json.loads((out / "tiny__scripted.predictions.json").read_text())
    assert report["resolved_ids"] == CHOSEN
    assert "Resolved: 2/2 (100.0%)" in captured.out

    code = main([*args, "--resume"])  # nothing left to generate or grade
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "generating 0 prediction(s) (2 already in" in captured.err
    assert "0 to grade (2 already graded)" in captured.err
