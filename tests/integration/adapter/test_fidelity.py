"""Logprob fidelity: a plain forward pass over the recorded tokens reproduces the recorded
behaviour logprobs, and the action mask covers exactly the generated tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from services.store import load_trajectory
from tests.integration.adapter.conftest import BASH_TOOL, AdapterFactory, EnginePool

pytestmark = pytest.mark.engines("a", "scripted")


def forward_logprobs(model_path: str, tokens: list[int]) -> torch.Tensor:
    """log p(token[i] | tokens[:i]) for every i >= 1, from one full forward pass."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    logps = torch.log_softmax(logits, dim=-1)
    ids = torch.tensor(tokens[1:])
    return logps[:-1].gather(1, ids[:, None])[:, 0]


@pytest.mark.parametrize("which", ["sampled", "scripted"])
def test_recorded_logprobs_match_a_forward_pass(
    which: str,
    adapter: AdapterFactory,
    engines: EnginePool,
    model_dir: Path,
    redis_url: str,
) -> None:
    engine = engines.a if which == "sampled" else engines.scripted
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tid = f"fidelity-{which}"
    with adapter([engine.url]) as a:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You fix bugs."},
            {"role": "user", "content": "TASK-JSON: the tests fail."},
        ]
        contents = []
        for step in range(3):
            response = a.chat(
                tid,
                {
                    "messages": messages,
                    "tools": [BASH_TOOL],
                    "max_tokens": 48,
                    "temperature": 1.0,
                    "top_p": 1.0,
                },
            )
            assert response.status_code == 200, response.text
            message = response.json()["choices"][0]["message"]
            contents.append(message)
            messages.append(message)
            call_id = (message.get("tool_calls") or [{"id": f"call_{step}"}])[0]["id"]
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "name": "bash", "content": f"out {step}"}
            )
        model_path = httpx.get(f"{engine.url}/model_info").json()["model_path"]
    record = load_trajectory(redis.Redis.from_url(redis_url), tid)
    assert len(record.segments) == 1
    segment = record.segments[0]
    tokens = segment.token_ids()
    flat = segment.flatten()
    n_prompt = len(segment.prompt_ids)
    assert len(flat["tokens"]) == len(tokens) - n_prompt

    reference = forward_logprobs(model_path, tokens)
    generated = [i for i, m in enumerate(flat["action_mask"]) if m == 1]
    assert len(generated) == sum(len(t.output_ids) for t in segment.turns) > 0
    recorded = torch.tensor([flat["logprobs"][i] for i in generated])
    recomputed = reference[[n_prompt + i - 1 for i in generated]]
    assert torch.max(torch.abs(recorded - recomputed)).item() < 1e-5

    # Mask 1 spans decode to exactly what the client was answered; mask 0 spans are exactly the
    # tool observations in the chat format (written out here by hand).
    for step, turn in enumerate(segment.turns):
        if contents[step].get("tool_calls"):
            assert "<tool_call>" in tok.decode(list(turn.output_ids))
        else:
            assert (
                tok.decode(list(turn.output_ids), skip_special_tokens=True)
                == (contents[step]["content"])
            )
        if step:
            closing = "" if segment.turns[step - 1].finish_reason == "stop" else "<|im_end|>"
            text = (
                f"{closing}\n<|im_start|>user\n<tool_response>\nout {step - 1}\n"
                "</tool_response><|im_end|>\n<|im_start|>assistant\n"
            )
            assert list(turn.observation_ids) == tok(text, add_special_tokens=False)["input_ids"]
