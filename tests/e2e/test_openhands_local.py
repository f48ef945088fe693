"""A real OpenHands SDK conversation driven through the adapter (issue 2), local workspace.

Stack, all real processes except the agent: reference engines (``python -m
services.reference_engine.server``) -> the adapter (``python -m adapter``) with a private Redis
-> OpenHands' ``LocalConversation`` (terminal + file editor) run by
:func:`sandbox_worker.openhands.conversation.run_agent` in this process on a temporary git
repository.

* ``test_scripted_agent_*``: the engine runs in **scripted mode** (test machinery: it replays the
  assistant outputs of :data:`SCRIPT`, in the tiny model's Hermes ``<tool_call>`` format, with the
  real logprobs of the tiny model). The commands must really run, the tool calls must be parsed
  into OpenAI ``tool_calls`` that OpenHands executes, and the trajectory record must hold one
  segment whose generated tokens are exactly the scripted outputs (action mask) and whose
  observations are the tool outputs; a plain forward pass reproduces the recorded logprobs.
* ``test_random_model_*``: the tiny random model samples freely; the conversation must end
  cleanly (max steps or a reply that is not a tool call) with a complete record.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from sandbox_worker.openhands.config import OpenHandsConfig
from sandbox_worker.openhands.conversation import LocalTarget, run_agent
from sandbox_worker.openhands.result import EndReason
from services.processes import start_in_parallel
from services.protocol.tasks import AgentLimits, SamplingConfig
from tests.support.adapter_process import AdapterProcess, launch_adapter
from tests.support.engines import ReferenceServer, launch_reference_server, tiny_model_path
from tests.support.redis import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MARKER = "TASK-OPENHANDS-E2E"
STARTUP_TIMEOUT_S = 300.0  # imports are slow on a busy 2-core machine
TERMINAL_TEXT = "made by the terminal"
TERMINAL_COMMAND = f"printf '{TERMINAL_TEXT}\\n' > from_terminal.txt && cat from_terminal.txt"


def tool_call(name: str, arguments: dict[str, Any], thought: str = "") -> str:
    """One assistant output in the tiny model's Hermes/Qwen tool-call format."""
    call = json.dumps({"name": name, "arguments": arguments})
    return f"{thought}<tool_call>\n{call}\n</tool_call>"


def script_turns(workspace: Path) -> list[str]:
    notes = str(workspace / "notes.txt")
    return [
        tool_call("terminal", {"command": "ls -a"}, thought="Let me look at the repository.\n"),
        tool_call("terminal", {"command": TERMINAL_COMMAND}),
        tool_call(
            "file_editor", {"command": "create", "path": notes, "file_text": "alpha\nbeta\n"}
        ),
        tool_call(
            "file_editor",
            {"command": "str_replace", "path": notes, "old_str": "beta", "new_str": "gamma"},
        ),
        tool_call("finish", {"message": "Created both files."}),
    ]


def git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null"}
    ident = ["-c", "user.name=swerl-test", "-c", "user.email=test@swerl.invalid"]
    subprocess.run(["git", *ident, *args], cwd=cwd, env=env, check=True, capture_output=True)


def make_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "README.md").write_text("A repository for the OpenHands end-to-end test.\n")
    (path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    git(path, "init", "-q", "-b", "main")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "initial")
    return path


@dataclass
class Stack:
    model_dir: Path
    workspace: Path
    scripted: AdapterProcess
    random: AdapterProcess


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Stack]:
    """Two engines (scripted, random) each behind its own adapter, sharing one Redis."""
    model_dir = tiny_model_path(tmp_path_factory.mktemp("model"))
    workspace = make_repo(tmp_path_factory.mktemp("ws") / "repo")
    logs = tmp_path_factory.mktemp("logs")
    script = logs / "script.jsonl"
    script.write_text(json.dumps({"match": MARKER, "turns": script_turns(workspace)}) + "\n")
    engines = start_in_parallel(
        [
            lambda: launch_reference_server(
                model_dir, script, log_dir=logs, timeout_s=STARTUP_TIMEOUT_S
            ),
            lambda: launch_reference_server(model_dir, log_dir=logs, timeout_s=STARTUP_TIMEOUT_S),
        ],
        ReferenceServer.stop,
    )
    adapters: list[AdapterProcess] = []
    try:
        adapters = start_in_parallel(
            [
                lambda: launch_adapter([engines[0].url], model_dir, redis_server.url, logs),
                lambda: launch_adapter([engines[1].url], model_dir, redis_server.url, logs),
            ],
            AdapterProcess.stop,
        )
        yield Stack(model_dir, workspace, adapters[0], adapters[1])
    finally:
        for a in adapters:
            a.stop()
        for e in engines:
            e.stop()


def forward_logprobs(model_dir: Path, tokens: list[int]) -> torch.Tensor:
    """log p(tokens[i] | tokens[:i]) for i >= 1 from one plain forward pass (no cache)."""
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens]), use_cache=False).logits[0].float()
    logps = torch.log_softmax(logits, dim=-1)
    return logps[:-1].gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]


def check_fidelity(model_dir: Path, segment: dict[str, Any]) -> None:
    """Rebuild the segment's tokens and mask from the record and check every behaviour logprob."""
    tokens = list(segment["prompt_ids"])
    mask = [0] * len(tokens)
    recorded: list[float] = []
    for turn in segment["turns"]:
        assert len(turn["output_ids"]) == len(turn["output_logprobs"]) > 0
        tokens += turn["observation_ids"] + turn["output_ids"]
        mask += [0] * len(turn["observation_ids"]) + [1] * len(turn["output_ids"])
        recorded += turn["output_logprobs"]
    generated = [i for i, m in enumerate(mask) if m == 1]
    assert len(generated) == len(recorded)
    reference = forward_logprobs(model_dir, tokens)
    recomputed = reference[[i - 1 for i in generated]]
    diff = torch.max(torch.abs(torch.tensor(recorded) - recomputed)).item()
    assert diff < 1e-5, f"recorded logprobs differ from a forward pass by {diff}"


def test_scripted_agent_runs_tools_and_is_recorded_token_exact(stack: Stack) -> None:
    trajectory_id = "oh-e2e-scripted"
    events: list[Any] = []
    result = run_agent(
        LocalTarget(stack.workspace),
        stack.scripted.t(trajectory_id),
        f"{MARKER}: create from_terminal.txt with the terminal and notes.txt with the editor.",
        AgentLimits(max_steps=10, wall_time_s=600),
        SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=256),
        config=OpenHandsConfig(num_retries=0),
        callbacks=[events.append],
    )
    assert result.end_reason is EndReason.FINISHED, result
    assert result.n_steps == 5

    # The commands really ran, in the workspace.
    assert (stack.workspace / "from_terminal.txt").read_text() == f"{TERMINAL_TEXT}\n"
    assert (stack.workspace / "notes.txt").read_text() == "alpha\ngamma\n"

    # The adapter parsed the Hermes calls into tool calls that OpenHands executed as actions.
    actions = [e for e in events if type(e).__name__ == "ActionEvent"]
    assert [a.tool_name for a in actions] == [
        "terminal",
        "terminal",
        "file_editor",
        "file_editor",
        "finish",
    ]
    assert all(a.action is not None for a in actions), "every call must validate and run"
    assert actions[0].action.command == "ls -a"
    assert json.loads(actions[3].tool_call.arguments)["new_str"] == "gamma"
    observations = [e for e in events if type(e).__name__ == "ObservationEvent"]
    assert len(observations) == 5
    assert not [e for e in events if type(e).__name__ == "AgentErrorEvent"]

    # The record: one segment, five turns, generated tokens == the scripted outputs.
    record = stack.scripted.record(trajectory_id)
    assert len(record["segments"]) == 1, record["counters"]
    segment = record["segments"][0]
    turns = segment["turns"]
    assert len(turns) == 5
    tok = AutoTokenizer.from_pretrained(str(stack.model_dir))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    for turn, text in zip(turns, script_turns(stack.workspace), strict=True):
        assert turn["output_ids"] == [*tok.encode(text, add_special_tokens=False), im_end]
        assert turn["finish_reason"] == "stop"

    # The prompt holds the task and the tools; observations hold the tool outputs.
    prompt = tok.decode(segment["prompt_ids"])
    assert MARKER in prompt
    assert '"name": "terminal"' in prompt and '"name": "file_editor"' in prompt
    assert turns[0]["observation_ids"] == []
    obs = [tok.decode(t["observation_ids"]) for t in turns]
    assert "README.md" in obs[1] and "calc.py" in obs[1]  # ls -a
    assert TERMINAL_TEXT in obs[2]  # cat from_terminal.txt
    assert f"File created successfully at: {stack.workspace}/notes.txt" in obs[3]
    assert "gamma" in obs[4]
    for text in obs[1:]:
        assert "<tool_response>" in text and "\x1b[" not in text
        assert "<tool_call>" not in text  # nothing generated leaked into an observation

    check_fidelity(stack.model_dir, segment)


def test_random_model_conversation_ends_cleanly_with_a_full_record(stack: Stack) -> None:
    trajectory_id = "oh-e2e-random"
    max_tokens = 48
    result = run_agent(
        LocalTarget(stack.workspace),
        stack.random.t(trajectory_id),
        "Fix the bug in calc.py.",
        AgentLimits(max_steps=3, wall_time_s=600),
        SamplingConfig(temperature=1.0, top_p=1.0, max_tokens=max_tokens),
        config=OpenHandsConfig(num_retries=0),
    )
    # A random model's reply is not a valid tool call: the SDK ends the run on a plain
    # message; should it ever produce tool calls, the step limit ends it.
    assert result.end_reason in (EndReason.AGENT_MESSAGE, EndReason.MAX_STEPS), result
    assert not result.is_infrastructure
    assert 1 <= result.n_steps <= 3

    record = stack.random.record(trajectory_id)
    turns = [t for s in record["segments"] for t in s["turns"]]
    assert len(turns) == result.n_steps  # every LLM call of the agent is in the record
    for turn in turns:
        assert 0 < len(turn["output_ids"]) <= max_tokens
        assert turn["finish_reason"] in ("stop", "length")
    check_fidelity(stack.model_dir, record["segments"][0])
