"""Seeded random batches in the trainer's ``[N, T]`` layout, built with plain Python.

A batch has groups of 1..8 members, shuffled rows and sparse group ids; each row alternates
action and observation spans (observations may come first), ends at its own length and is
padded with ``-1``. Members copy prefixes of a sibling (shared prefixes), some are a proper
prefix of a sibling or an exact copy, and rewards are 0/1 or arbitrary scalars with ties.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

VOCAB = 7  # small, so unrelated rows also share short prefixes by chance


@dataclass(frozen=True)
class Batch:
    tokens: Tensor
    action_mask: Tensor  # bool
    group_ids: Tensor
    rewards: Tensor
    logp: Tensor
    behavior_logp: Tensor
    values: Tensor
    old_values: Tensor
    token_versions: Tensor
    trainer_version: int

    @property
    def lists(self) -> dict[str, list]:
        """The tensors as Python lists, for the reference implementations."""
        return {
            "tokens": self.tokens.tolist(),
            "mask": self.action_mask.tolist(),
            "groups": self.group_ids.tolist(),
            "rewards": self.rewards.tolist(),
            "logp": self.logp.tolist(),
            "behavior": self.behavior_logp.tolist(),
            "values": self.values.tolist(),
            "old_values": self.old_values.tolist(),
            "versions": self.token_versions.tolist(),
        }


def _sequence(rng: random.Random, length: int) -> tuple[list[int], list[bool]]:
    """Random tokens and an alternating action/observation span mask with >= 1 action."""
    tokens = [rng.randrange(VOCAB) for _ in range(length)]
    mask: list[bool] = []
    is_action = rng.random() < 0.7
    while len(mask) < length:
        span = rng.randint(1, 5)
        mask.extend([is_action] * span)
        is_action = not is_action
    mask = mask[:length]
    if not any(mask):
        mask[rng.randrange(length)] = True
    return tokens, mask


def _member(
    rng: random.Random, siblings: list[tuple[list[int], list[bool]]], max_len: int
) -> tuple[list[int], list[bool]]:
    """A new group member: fresh, a shared prefix + fresh tail, a proper prefix, or a copy."""
    kind = rng.random()
    if not siblings or kind < 0.25:
        return _sequence(rng, rng.randint(1, max_len))
    tokens, mask = siblings[rng.randrange(len(siblings))]
    if kind < 0.35:
        return list(tokens), list(mask)  # identical sequence
    if kind < 0.5 and any(mask[: len(mask) - 1]):
        cut = rng.randint(1, len(tokens) - 1)
        while not any(mask[:cut]):
            cut += 1
        return tokens[:cut], mask[:cut]  # a proper prefix of a sibling
    cut = rng.randint(0, len(tokens))
    tail_tokens, tail_mask = _sequence(rng, rng.randint(1, max_len))
    return tokens[:cut] + tail_tokens, mask[:cut] + tail_mask


def random_batch(
    seed: int,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
    *,
    max_groups: int = 6,
    max_group_size: int = 8,
    max_len: int = 24,
    binary_rewards: bool | None = None,
    singleton: bool = False,
) -> Batch:
    rng = random.Random(seed)
    binary = rng.random() < 0.6 if binary_rewards is None else binary_rewards
    rows: list[tuple[list[int], list[bool], int, float]] = []
    group_ids = rng.sample(range(100), rng.randint(1, max_groups))
    for gid in group_ids:
        size = 1 if singleton else rng.randint(1, max_group_size)
        members: list[tuple[list[int], list[bool]]] = []
        for _ in range(size):
            members.append(_member(rng, members, max_len))
        constant = rng.random() < 0.2
        base = float(rng.randint(0, 1)) if binary else rng.uniform(-2, 2)
        for tokens, mask in members:
            if constant:
                reward = base
            elif binary:
                reward = float(rng.randint(0, 1))
            else:
                reward = rng.choice([base, rng.uniform(-2, 2)])  # ties and distinct values
            rows.append((tokens, mask, gid, reward))
    rng.shuffle(rows)
    width = max(len(r[0]) for r in rows) + rng.randint(0, 3)
    tokens = [r[0] + [-1] * (width - len(r[0])) for r in rows]
    mask = [r[1] + [False] * (width - len(r[1])) for r in rows]
    n = len(rows)
    gen = torch.Generator().manual_seed(seed)
    logp = -2.0 * torch.rand(n, width, generator=gen, dtype=torch.float64)
    behavior = logp + 0.6 * torch.randn(n, width, generator=gen, dtype=torch.float64)
    values = torch.randn(n, width, generator=gen, dtype=torch.float64)
    old_values = values + 0.3 * torch.randn(n, width, generator=gen, dtype=torch.float64)
    trainer_version = rng.randint(0, 6)
    versions = torch.randint(0, trainer_version + 1, (n, width), generator=gen)
    return Batch(
        tokens=torch.tensor(tokens, dtype=torch.long, device=device),
        action_mask=torch.tensor(mask, dtype=torch.bool, device=device),
        group_ids=torch.tensor([r[2] for r in rows], dtype=torch.long, device=device),
        rewards=torch.tensor([r[3] for r in rows], dtype=dtype, device=device),
        logp=logp.to(dtype=dtype, device=device),
        behavior_logp=behavior.to(dtype=dtype, device=device),
        values=values.to(dtype=dtype, device=device),
        old_values=old_values.to(dtype=dtype, device=device),
        token_versions=versions.to(device),
        trainer_version=trainer_version,
    )


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float64]


def on_devices_and_dtypes[TestFn: Callable[..., object]](test: TestFn) -> TestFn:
    """Parametrise a test over ``dtype`` in DTYPES and ``device`` in DEVICES (ids end
    ``-<dtype>-<device>``, as the two stacked ``parametrize`` marks give)."""
    test = pytest.mark.parametrize("dtype", DTYPES)(test)
    return pytest.mark.parametrize("device", DEVICES)(test)


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-9, "atol": 1e-10}
