"""The divergence mask (section 4.1) on random batches and on hand-built groups."""

from __future__ import annotations

import pytest
import torch

from tests.support import algorithm_reference as ref
from tests.support.algorithm_batches import DEVICES, random_batch
from trainer.algorithms import divergence_mask, first_difference

SEEDS = range(20)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", SEEDS)
def test_divergence_mask_matches_reference(seed: int, device: str) -> None:
    b = random_batch(seed, torch.float32, device)
    got = divergence_mask(b.tokens, b.action_mask, b.rewards, b.group_ids)
    want = ref.divergence_mask(
        b.tokens.tolist(), b.action_mask.tolist(), b.rewards.tolist(), b.group_ids.tolist()
    )
    assert got.dtype == torch.bool
    assert got.tolist() == want


def test_divergence_mask_with_tiny_chunks_matches() -> None:
    b = random_batch(5, max_groups=3, max_group_size=8)
    pairs = torch.combinations(torch.arange(b.tokens.shape[0]), 2)
    whole = first_difference(b.tokens, pairs[:, 0], pairs[:, 1])
    chunked = first_difference(b.tokens, pairs[:, 0], pairs[:, 1], chunk_elements=1)
    windows = first_difference(b.tokens, pairs[:, 0], pairs[:, 1], first_window=1)
    assert whole.tolist() == chunked.tolist() == windows.tolist()
    tokens = b.tokens.tolist()
    want = [ref.first_difference(tokens[i], tokens[j]) for i, j in pairs.tolist()]
    assert whole.tolist() == want


def _rows(*rows: tuple[str, str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows as (tokens, mask) strings: letters are tokens, '.' is padding; 'a' action, 'o' obs."""
    width = max(len(t) for t, _ in rows)
    tokens = [[ord(c) if c != "." else -1 for c in t.ljust(width, ".")] for t, _ in rows]
    masks = [[c == "a" for c in m.ljust(width, ".")] for _, m in rows]
    return torch.tensor(tokens), torch.tensor(masks)


def test_shared_prefix_masks_states_before_divergence() -> None:
    tokens, mask = _rows(
        ("ABCDEFG", "aaoaaaa"),  # R=1
        ("ABCXYZ", "aaoaaa"),  # R=0, diverges from row 0 at 3
        ("ABQRS", "aaaaa"),  # R=0, diverges from row 0 at 2
    )
    rewards = torch.tensor([1.0, 0.0, 0.0])
    got = divergence_mask(tokens, mask, rewards, torch.tensor([0, 0, 0]))
    # row 0: d = max(3, 2) = 3 -> action tokens at 3.. ; row 1: d = 3 ; row 2: d = 2
    assert got.int().tolist() == [
        [0, 0, 0, 1, 1, 1, 1],
        [0, 0, 0, 1, 1, 1, 0],
        [0, 0, 1, 1, 1, 0, 0],
    ]


def test_a_response_that_is_a_prefix_of_another() -> None:
    tokens, mask = _rows(("ABCD", "aaoa"), ("ABCDEF", "aaoaaa"))
    got = divergence_mask(tokens, mask, torch.tensor([0.0, 1.0]), torch.tensor([7, 7]))
    # they differ at position 4 (padding vs 'E'): the shorter row keeps no token, the longer
    # keeps its actions from position 4 on
    assert got.int().tolist() == [[0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 1]]


def test_identical_sequences_with_different_outcomes_keep_nothing() -> None:
    tokens, mask = _rows(("ABC", "aoa"), ("ABC", "aoa"))
    got = divergence_mask(tokens, mask, torch.tensor([0.0, 1.0]), torch.tensor([1, 1]))
    assert not got.any()


def test_absent_opposite_outcome_keeps_last_action_only() -> None:
    """Members whose opposite-outcome siblings are absent from the batch (another shard)."""
    tokens, mask = _rows(
        ("ABCDE", "aaoao"),  # group 2, R=1, both members of this shard succeed
        ("ABXY", "aaaa"),  # group 2, R=1
        ("PQRS", "oaoa"),  # group 5, a single member
        ("ZZZZZ", "aaaaa"),  # group 9, R=0 ...
        ("ZZY", "aaa"),  # ... against R=1: d = 2
    )
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([2, 2, 5, 9, 9])
    got = divergence_mask(tokens, mask, rewards, groups)
    assert got.int().tolist() == [
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 1, 1, 1],
        [0, 0, 1, 0, 0],
    ]


def test_same_outcome_members_do_not_set_the_divergence_point() -> None:
    tokens, mask = _rows(("ABCDEF", "aaaaaa"), ("ABCDEX", "aaaaaa"), ("AYYYYY", "aaaaaa"))
    rewards = torch.tensor([1.0, 1.0, 0.0])
    got = divergence_mask(tokens, mask, rewards, torch.tensor([0, 0, 0]))
    # row 0 vs row 1 (same outcome) would give 5; only row 2 counts: d = 1 for everyone
    assert got.int().tolist() == [[0, 1, 1, 1, 1, 1]] * 3
