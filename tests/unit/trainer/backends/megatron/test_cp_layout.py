"""The context-parallel chunk layout (trainer.backends.megatron.cp_layout): pure functions,
no megatron-core import, no processes."""

from __future__ import annotations

import pytest
import torch

from trainer.backends.megatron.cp_layout import (
    column_owner,
    gather_sequence,
    local_columns,
    packed_attention_mask,
    pad_lanes,
    padded_width,
    scatter_owned,
    shard_inputs,
    slice_sequence,
)
from trainer.data import PackedInputs


def test_each_rank_holds_an_early_and_a_late_chunk() -> None:
    # width 12, CP=3: six chunks of 2; rank r holds chunks r and 5 - r
    assert local_columns(12, 3, 0).tolist() == [0, 1, 10, 11]
    assert local_columns(12, 3, 1).tolist() == [2, 3, 8, 9]
    assert local_columns(12, 3, 2).tolist() == [4, 5, 6, 7]
    assert local_columns(4, 1, 0).tolist() == [0, 1, 2, 3]  # CP=1: everything
    owner, offset = column_owner(torch.arange(12), 12, 3)
    assert owner.tolist() == [0, 0, 1, 1, 2, 2, 2, 2, 1, 1, 0, 0]
    assert offset.tolist() == [0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3]


@pytest.mark.parametrize("cp", [1, 2, 3])
@pytest.mark.parametrize("dim", [0, 1])
def test_slicing_then_gathering_gives_the_sequence_back(cp: int, dim: int) -> None:
    x = torch.randn(2 * cp * 3, 5) if dim == 0 else torch.randn(5, 2 * cp * 3)
    parts = [slice_sequence(x, cp, r, dim) for r in range(cp)]
    assert all(p.shape[dim] == x.shape[dim] // cp for p in parts)
    assert torch.equal(gather_sequence(parts, dim), x)


def test_layout_errors_are_named() -> None:
    assert [padded_width(w, 2) for w in (1, 4, 5, 33)] == [4, 4, 8, 36]
    with pytest.raises(ValueError, match=r"not a multiple of 2 \* cp = 4"):
        local_columns(6, 2, 0)
    with pytest.raises(ValueError, match=r"CP rank 2 is not in 0\.\.1"):
        local_columns(8, 2, 2)
    with pytest.raises(ValueError, match="two equal chunks"):
        gather_sequence([torch.zeros(3), torch.zeros(3)])


def packed() -> PackedInputs:
    """Two lanes of width 7: rows of 4 and 3 tokens; a row of 5 and a padding tail of 2 that
    continues its positions. Every row predicts its last three tokens (``index``: the flat
    ``lane * 7 + column`` of the predicting hidden state)."""
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2], [0, 1, 2, 3, 4, 5, 6]])
    ids = torch.arange(14).reshape(2, 7) + 100
    index = torch.tensor([[0, 1, 2], [4, 5, 6], [7 + 1, 7 + 2, 7 + 3]])
    return PackedInputs(ids, positions, index)


def test_the_mask_is_block_diagonal_causal_and_the_padding_stays_out_of_view() -> None:
    inputs = packed()
    mask = packed_attention_mask(inputs.position_ids)
    seen = (~mask[0, 0]).long()
    # lane 0: row [0..3] then row [4..6]; a token sees the earlier tokens of its own row
    assert seen[5].tolist() == [0, 0, 0, 0, 1, 1, 0]
    assert seen[3].tolist() == [1, 1, 1, 1, 0, 0, 0]
    ids, positions = pad_lanes(inputs, 2)  # width 7 -> 8
    assert positions[:, 7].tolist() == [3, 7] and ids[:, 7].tolist() == [0, 0]
    wide = packed_attention_mask(positions)
    assert torch.equal(wide[:, :, :7, :7], mask)  # real tokens: the same view
    assert not bool((~wide[:, :, :7, 7]).any())  # nobody real sees the padding column
    rows = torch.tensor([1, 6])
    assert torch.equal(packed_attention_mask(positions, rows), wide[:, :, rows])


@pytest.mark.parametrize("cp", [2, 3])
def test_every_token_is_scored_by_exactly_one_rank_from_the_right_hidden_state(cp: int) -> None:
    inputs = packed()
    width = padded_width(7, cp)
    # a stand-in for the decoder output: each hidden state names its lane and column
    lanes, columns = torch.meshgrid(torch.arange(2), torch.arange(width), indexing="ij")
    hidden = (lanes * 1000 + columns).float()  # [lanes, width]
    want = hidden[:, :7].reshape(-1)[inputs.index]  # [rows, T] from the unpadded lanes
    _, positions = pad_lanes(inputs, cp)
    full_mask = packed_attention_mask(positions)
    got = torch.zeros_like(want)
    seen = torch.zeros(want.shape, dtype=torch.long)
    for rank in range(cp):
        shard = shard_inputs(inputs, cp, rank)
        cols = local_columns(width, cp, rank)
        assert torch.equal(shard.position_ids, positions[:, cols])
        assert torch.equal(shard.attention_mask, full_mask[:, :, cols])
        local = hidden[:, cols].reshape(-1)  # this rank's [lanes * width / cp] hidden states
        got += scatter_owned(local[shard.index], shard.owned)
        seen += shard.owned.long()
    assert seen.eq(1).all()  # each token on one rank
    assert torch.equal(got, want)


def test_scatter_owned_places_values_and_passes_gradients() -> None:
    owned = torch.tensor([[True, False], [False, True]])
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    out = scatter_owned(values, owned)
    assert out.tolist() == [[[1.0, 2.0], [0.0, 0.0]], [[0.0, 0.0], [3.0, 4.0]]]
    out.sum().backward()
    assert values.grad is not None and values.grad.tolist() == [[1.0, 1.0], [1.0, 1.0]]
