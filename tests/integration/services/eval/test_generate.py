"""Generation mode end to end on the mini set: the training scaffold (Redis, the reference
engine on the tiny model in scripted mode, the adapter, a sandbox worker running the OpenHands
agent server under bwrap, the rollout manager) writes predictions.jsonl, then the grading
scores it. The scripted engine replays gold answers, so the instances resolve."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sandbox_worker.tasks.scripted import build_script, write_script
from services.eval.main import main
from services.protocol.instance import SWEInstance
from services.tiny_model.build import ensure_tiny_model
from tests.support.fake_llm import FakeLLM, Reply, call

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


def gold_tool_calls(instances: list[SWEInstance]) -> Callable[[dict[str, Any]], Reply | None]:
    """An OpenAI-compatible endpoint's policy (test machinery): for the instance whose match
    line is in the conversation, the scripted gold turns as OpenAI tool calls, one per turn."""
    script = build_script(instances)

    def choose(body: dict[str, Any]) -> Reply | None:
        text = json.dumps(body["messages"])
        n_assistant = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        for entry in script:
            if json.dumps(entry["match"])[1:-1] in text:
                turn = entry["turns"][min(n_assistant, len(entry["turns"]) - 1)]
                payload = json.loads(turn.split("<tool_call>")[1].split("</tool_call>")[0])
                return Reply(content=turn.split("<tool_call>")[0],
                             tool_calls=[call(payload["name"], payload["arguments"])])  # fmt: skip
        return Reply(content="no task recognised")

    return choose


@pytest.mark.slow
def test_generate_through_an_openai_compatible_endpoint_then_grade(
    mini_set: Path, instances: dict[str, SWEInstance], tmp_path: Path,
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """``--model-url``: the adapter relays to the endpoint (an OpenAI chat-completions server
    answering with the gold patch's tool calls), the trajectories are text-only, the key stays
    with the adapter, the predictions resolve."""
    chosen = CHOSEN[:1]
    monkeypatch.setenv("ENDPOINT_KEY", "sk-test-endpoint")
    with FakeLLM([Reply(content="unused")], choose=gold_tool_calls(
            [instances[i] for i in chosen])) as llm:  # fmt: skip
        out = tmp_path / "out"
        args = ["--dataset", str(mini_set), "--model-url", f"http://127.0.0.1:{llm.port}/v1",
                "--upstream-model", "gpt-endpoint", "--api-key-env", "ENDPOINT_KEY",
                "--instances", ",".join(chosen), "--backend", "bwrap", "--workers", "1",
                "--max-steps", "6", "--wall-time", "600", "--report-dir", str(out)]  # fmt: skip
        code = main(args)
        captured = capsys.readouterr()
        seen = list(llm.requests)
    assert code == 0, captured.err
    assert "text-only records" in captured.err
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["instance_id"] for p in preds] == chosen and preds[0]["model_patch"]
    assert preds[0]["model_name_or_path"] == "gpt-endpoint"
    record = json.loads((out / "trajectories" / f"{chosen[0]}.json").read_text())
    assert record["segments"] == [] and len(record["text_turns"]) >= 3  # write, apply, finish
    assert all(r.body["model"] == "gpt-endpoint" for r in seen)
    assert {r.authorization for r in seen} == {"Bearer sk-test-endpoint"}
    report = json.loads((out / "gpt-endpoint.predictions.json").read_text())
    assert report["resolved_ids"] == chosen
    assert "Resolved: 1/1 (100.0%)" in captured.out


def test_model_url_options_are_checked_before_anything_starts(
    mini_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    base = ["--dataset", str(mini_set), "--report-dir", str(tmp_path / "out")]
    for extra, problem in (
        (["--model-url", "http://127.0.0.1:1/v1"], "--model-url needs --upstream-model"),
        (["--model-url", "ftp://x", "--upstream-model", "m"], "must start with http://"),
        (["--model-url", "http://127.0.0.1:1/v1", "--upstream-model", "m",
          "--api-key-env", "NO_SUCH_KEY"], "$NO_SUCH_KEY is not set"),
    ):  # fmt: skip
        assert main([*base, *extra]) == 2
        assert problem in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
