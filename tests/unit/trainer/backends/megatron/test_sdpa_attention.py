"""The SDPA core attention against megatron-core's own ``DotProductAttention`` (fp32, random
inputs): packed lanes of several row lengths with the dense block-diagonal causal mask, plain
causal sequences, the ``thd`` layout, grouped-query heads; outputs and the gradients of query,
key and value within the megatron parity tolerance (1e-5). The rows it is given are the mask's
rows; what it cannot compute is refused; the backend builds it by default on the CPU and
computes what the local attention computes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from trainer.backends.megatron import sdpa_attention
from trainer.backends.megatron.cp_layout import packed_attention_mask
from trainer.backends.megatron.model import init_parallel
from trainer.backends.megatron.sdpa_attention import (
    SdpaAttention,
    lane_segments,
    resolve_attention,
)

TOL = 1e-5  # the megatron backend's parity tolerance (tests/.../test_backend.py)
HEADS, GROUPS, HEAD_DIM = 4, 2, 16


@pytest.fixture(scope="module", autouse=True)
def _parallel_state() -> Iterator[None]:
    init_parallel()  # one rank, megatron's parallel_state and RNG tracker on the CPU
    yield


def config(**overrides: object) -> TransformerConfig:
    settings: dict[str, object] = dict(
        num_layers=1,
        hidden_size=HEADS * HEAD_DIM,
        num_attention_heads=HEADS,
        num_query_groups=GROUPS,
        kv_channels=HEAD_DIM,
        attention_dropout=0.0,
        hidden_dropout=0.0,
        masked_softmax_fusion=False,
        use_cpu_initialization=True,
    )
    return TransformerConfig(**{**settings, **overrides})


def pair(**overrides: object) -> tuple[DotProductAttention, SdpaAttention]:
    cfg = config(**overrides)
    args = (cfg, 1, AttnMaskType.causal, "self")
    return DotProductAttention(*args), SdpaAttention(*args)


def positions_of(rows: list[list[int]]) -> torch.Tensor:
    """``[lanes, w]`` position ids of lanes packed with rows of the given lengths."""
    return torch.stack([torch.cat([torch.arange(n) for n in lane]) for lane in rows])


def qkv(width: int, lanes: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(width, lanes, HEADS, HEAD_DIM)] + 2 * [(width, lanes, GROUPS, HEAD_DIM)]
    return [torch.randn(*s, generator=gen).requires_grad_(True) for s in shapes]


def run(module: torch.nn.Module, inputs: list[torch.Tensor], grad_seed: int = 1, **kwargs):
    """The output and the gradients of the inputs for a random output gradient."""
    leaves = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = module(*leaves, **kwargs)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed))
    out.backward(grad)
    return out.detach(), [x.grad for x in leaves]


def close(want: torch.Tensor, got: torch.Tensor) -> bool:
    """Within :data:`TOL`, relative above 1 (as the backend's parity tests compare)."""
    return want.shape == got.shape and bool(
        ((want - got).abs() <= TOL * want.abs().clamp(min=1.0)).all()
    )


def assert_same(want: tuple, got: tuple) -> None:
    (out_w, grads_w), (out_g, grads_g) = want, got
    assert close(out_w, out_g)
    for gw, gg, name in zip(grads_w, grads_g, "qkv", strict=True):
        assert gw is not None and gg is not None, name
        assert close(gw, gg), name
    assert float(out_w.abs().max()) > 0.1  # not trivially equal


# lane 0: five rows of different lengths; lane 1: one row and a long one; lane 2: one row
LANES = [[5, 1, 12, 3, 7], [2, 26], [28]]


def test_packed_rows_equal_the_local_attention_with_the_dense_mask() -> None:
    local, sdpa = pair()
    positions = positions_of(LANES)
    inputs = qkv(positions.shape[1], positions.shape[0])
    mask = packed_attention_mask(positions)
    want = run(local, inputs, attention_mask=mask)
    got = run(sdpa, inputs, attention_mask=None, packed_seq_params=lane_segments(positions))
    assert_same(want, got)


def test_plain_causal_sequences_equal_the_local_attention() -> None:
    local, sdpa = pair()
    inputs = qkv(19, 2, seed=3)
    causal = ~torch.ones(19, 19).tril().bool()  # megatron's default mask is made on CUDA
    want = run(local, inputs, attention_mask=causal)
    assert_same(want, run(sdpa, inputs, attention_mask=None))


def test_multi_head_attention_and_a_given_softmax_scale() -> None:
    cfg = config(num_query_groups=HEADS)
    local = DotProductAttention(cfg, 1, AttnMaskType.causal, "self", softmax_scale=0.5)
    sdpa = SdpaAttention(cfg, 1, AttnMaskType.causal, "self", softmax_scale=0.5)
    positions = positions_of(LANES)
    gen = torch.Generator().manual_seed(4)
    shape = (positions.shape[1], positions.shape[0], HEADS, HEAD_DIM)
    inputs = [torch.randn(*shape, generator=gen) for _ in range(3)]
    want = run(local, inputs, attention_mask=packed_attention_mask(positions))
    assert_same(
        want, run(sdpa, inputs, attention_mask=None, packed_seq_params=lane_segments(positions))
    )


def test_the_thd_layout_equals_the_lanes_laid_end_to_end() -> None:
    local, sdpa = pair()
    rows = [r for lane in LANES for r in lane]  # every lane's rows in one sequence
    positions = positions_of([rows])
    inputs = qkv(positions.shape[1], 1, seed=5)
    want_out, want_grads = run(local, inputs, attention_mask=packed_attention_mask(positions))
    cu = torch.tensor([0, *torch.tensor(rows).cumsum(0).tolist()], dtype=torch.int32)
    thd = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu)
    got_out, got_grads = run(sdpa, [x[:, 0] for x in inputs], attention_mask=None,
                             packed_seq_params=thd)  # fmt: skip
    assert_same((want_out[:, 0], [g[:, 0] for g in want_grads]), (got_out, got_grads))


def test_lane_segments_are_the_rows_of_the_packed_mask() -> None:
    positions = positions_of(LANES)
    lanes, width = positions.shape
    params = lane_segments(positions)
    cu = params.cu_seqlens_q
    assert params.qkv_format == "sbhd" and cu.dtype == torch.int32
    assert params.max_seqlen_q == max(max(lane) for lane in LANES)
    row = torch.repeat_interleave(torch.arange(len(cu) - 1), (cu[1:] - cu[:-1]).long())
    row = row.reshape(lanes, width)
    causal = torch.ones(width, width).tril().bool()
    visible = (row[:, :, None] == row[:, None, :]) & causal
    assert torch.equal(~visible[:, None], packed_attention_mask(positions))
    tail = torch.cat([positions, positions[:, -1:] + torch.arange(1, 4)], dim=1)  # pad_lanes
    padded = lane_segments(tail).cu_seqlens_q
    widened = [n for lane in LANES for n in [*lane[:-1], lane[-1] + 3]]  # the tail joins a row
    assert (padded[1:] - padded[:-1]).tolist() == widened


def test_what_the_sdpa_attention_cannot_compute_is_refused() -> None:
    with pytest.raises(ValueError, match=r"attention dropout 0\.1.*attention='local'"):
        SdpaAttention(config(attention_dropout=0.1), 1, AttnMaskType.causal, "self")
    with pytest.raises(ValueError, match="window"):
        SdpaAttention(config(window_size=(4, 0)), 1, AttnMaskType.causal, "self")
    with pytest.raises(ValueError, match="attn_mask_type"):
        SdpaAttention(config(), 1, AttnMaskType.padding, "self")
    _, sdpa = pair()
    positions = positions_of(LANES)
    q, k, v = qkv(positions.shape[1], positions.shape[0])
    with pytest.raises(ValueError, match="not a dense mask"):
        sdpa(q, k, v, packed_attention_mask(positions))
    short = lane_segments(positions[:, :-1])
    with pytest.raises(ValueError, match="the sequence holds 84 tokens"):
        sdpa(q, k, v, None, packed_seq_params=short)


def test_auto_is_sdpa_without_transformer_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sdpa_attention, "transformer_engine_available", lambda: False)
    assert resolve_attention("auto") == "sdpa"
    monkeypatch.setattr(sdpa_attention, "transformer_engine_available", lambda: True)
    assert resolve_attention("auto") == "local" and resolve_attention("sdpa") == "sdpa"
    with pytest.raises(ValueError, match="not one of"):
        resolve_attention("flash")  # type: ignore[arg-type]


@pytest.mark.slow
def test_the_backend_builds_it_and_scores_what_the_local_attention_scores(
    tiny_model_dir: Path,
) -> None:
    from tests.unit.trainer.backends.megatron.test_backend import parity_batch
    from trainer.backends import create_backend
    from trainer.backends.megatron.backend import MegatronBackend
    from trainer.config import TrainerConfig
    from trainer.data import pack_inputs

    class LocalAttention(MegatronBackend):
        attention = "local"

    config = TrainerConfig(model=str(tiny_model_dir), backend="megatron")
    fused, local = create_backend(config), LocalAttention(config)
    attention = fused.actor.decoder.layers[0].self_attention.core_attention
    assert type(attention) is (SdpaAttention if not sdpa_attention.transformer_engine_available()
                               else DotProductAttention)  # fmt: skip
    assert type(local.actor.decoder.layers[0].self_attention.core_attention) is DotProductAttention
    batch = parity_batch(fused)
    inputs = pack_inputs(batch, [(0, 1, 2), (3, 4), (5,)])
    with torch.no_grad():
        want, got = local.scorer(inputs), fused.scorer(inputs)
    assert float((want - got)[batch.action_mask].abs().max()) < TOL
