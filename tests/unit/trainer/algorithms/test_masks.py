"""ActionMask: validated once, reusable everywhere, same results as a raw mask."""

from __future__ import annotations

import pytest
import torch

from tests.support.algorithm_batches import random_batch
from trainer.algorithms import (
    ActionMask,
    adaptive_lambda,
    clipped_value_loss,
    dis_policy_loss,
    divergence_mask,
    grpo_advantages,
    last_action_index,
    policy_lag,
    ppo_clip_policy_loss,
    skip_observation_gae,
    terminal_values,
    whiten,
)
from trainer.algorithms.masks import flat_nonzero


def test_action_mask_facts() -> None:
    raw = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 1], [1, 1, 1, 1]])
    am = ActionMask(raw)
    assert am.mask.dtype == torch.bool and am.shape == (3, 4)
    assert am.row_counts(torch.float64).tolist() == [2.0, 1.0, 4.0]
    assert float(am.total(torch.float32)) == 7.0
    assert am.last.tolist() == [2, 3, 3] == last_action_index(raw).tolist()
    assert am.weights(torch.float32) is am.weights(torch.float32)  # cached
    assert ActionMask.of(am) is am


def test_action_mask_validates() -> None:
    with pytest.raises(ValueError, match="no action token"):
        ActionMask(torch.tensor([[1, 0], [0, 0]]))
    with pytest.raises(ValueError, match="0 and 1"):
        ActionMask(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match="2-D"):
        ActionMask(torch.tensor([1, 0]))


@pytest.mark.parametrize("seed", range(5))
def test_functions_agree_on_raw_and_wrapped_masks(seed: int) -> None:
    b = random_batch(seed)
    am = ActionMask(b.action_mask)
    adv = grpo_advantages(b.rewards, b.group_ids)
    for fn in (dis_policy_loss, ppo_clip_policy_loss):
        raw_loss, raw_metrics = fn(b.logp, b.behavior_logp, adv, b.action_mask)
        am_loss, am_metrics = fn(b.logp, b.behavior_logp, adv, am)
        torch.testing.assert_close(raw_loss, am_loss)
        assert raw_metrics.keys() == am_metrics.keys()
    for raw_out, am_out in zip(
        skip_observation_gae(b.rewards, b.values, b.action_mask, 0.9, 0.8),
        skip_observation_gae(b.rewards, b.values, am, 0.9, 0.8),
        strict=True,
    ):
        torch.testing.assert_close(raw_out, am_out)
    torch.testing.assert_close(whiten(b.values, b.action_mask), whiten(b.values, am))
    torch.testing.assert_close(adaptive_lambda(b.action_mask), adaptive_lambda(am))
    torch.testing.assert_close(
        terminal_values(b.values, b.action_mask), terminal_values(b.values, am)
    )
    assert torch.equal(
        divergence_mask(b.tokens, b.action_mask, b.rewards, b.group_ids),
        divergence_mask(b.tokens, am, b.rewards, b.group_ids),
    )
    torch.testing.assert_close(
        clipped_value_loss(b.values, b.old_values, b.values * 0, b.action_mask),
        clipped_value_loss(b.values, b.old_values, b.values * 0, am),
    )
    assert torch.equal(
        policy_lag(b.trainer_version, b.token_versions, b.action_mask),
        policy_lag(b.trainer_version, b.token_versions, am),
    )


def _loop_spans(mask: list[list[bool]]) -> tuple[list[list[int]], list[list[int]]]:
    starts, ends = [], []
    for i, row in enumerate(mask):
        for t, on in enumerate(row):
            if on and (t == 0 or not row[t - 1]):
                starts.append([i, t])
            if on and (t == len(row) - 1 or not row[t + 1]):
                ends.append([i, t])
    return starts, ends


@pytest.mark.parametrize("seed", range(12))
def test_spans_match_a_loop(seed: int) -> None:
    """First and last token of every span of consecutive action tokens, row-major: spans at a
    row's first and last position, single-token spans, whole-row spans."""
    gen = torch.Generator().manual_seed(seed)
    n, t = 1 + seed % 5, 1 + seed * 3
    mask = torch.rand(n, t, generator=gen) < (0.2 + 0.06 * seed)
    mask[torch.arange(n), torch.randint(0, t, (n,), generator=gen)] = True  # >= 1 per row
    if seed == 11:
        mask[0] = True  # one span over the whole row
    starts, ends = ActionMask(mask).spans()
    want_starts, want_ends = _loop_spans(mask.tolist())
    assert starts.tolist() == want_starts and ends.tolist() == want_ends
    assert starts.dtype == ends.dtype == torch.long


def test_spans_by_hand_and_flat_nonzero() -> None:
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    starts, ends = ActionMask(mask).spans()
    assert starts.tolist() == [[0, 0], [0, 3], [1, 1], [2, 0], [2, 2]]
    assert ends.tolist() == [[0, 1], [0, 3], [1, 1], [2, 0], [2, 3]]
    flags = torch.tensor([False, True, True, False, True])
    assert flat_nonzero(flags).tolist() == [1, 2, 4]
    assert flat_nonzero(torch.zeros(3, dtype=torch.bool)).tolist() == []
