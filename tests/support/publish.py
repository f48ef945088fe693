"""Helpers of the publish tests: a trainer whose weights move, and what the engines serve."""

from __future__ import annotations

from pathlib import Path

import httpx
import torch

from trainer.backends.torch_backend import TorchBackend
from trainer.config import TrainerConfig

PROMPT = [5, 17, 42, 99, 7, 3, 64, 12]


def trainer(model_dir: Path) -> TorchBackend:
    return TorchBackend(TrainerConfig(model=str(model_dir)))


def move_weights(backend: TorchBackend, seed: int) -> None:
    """A stand-in for one actor update: every weight moves, the policy version advances."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in backend.actor.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    backend.version += 1


def served(engine_url: str, max_new_tokens: int = 12) -> tuple[list[int], list[float], str]:
    """A fresh sample (temperature 1): its tokens, the engine's logprobs, its weight version."""
    body = {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0},
        "return_logprob": True,
    }
    out = httpx.post(f"{engine_url}/generate", json=body, timeout=120).json()
    pairs = out["meta_info"]["output_token_logprobs"]
    version = httpx.get(f"{engine_url}/model_info", timeout=30).json()["weight_version"]
    return [int(p[1]) for p in pairs], [float(p[0]) for p in pairs], str(version)


def recomputed(backend: TorchBackend, output: list[int]) -> list[float]:
    """The trainer's own logprobs of ``output`` after PROMPT (a plain fp32 forward)."""
    ids = torch.tensor([PROMPT + output])
    with torch.no_grad():
        logits = backend.actor(input_ids=ids).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(PROMPT)
    return [float(logp[start + i - 1, t]) for i, t in enumerate(output)]


def max_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return max(abs(x - y) for x, y in zip(a, b, strict=True))
