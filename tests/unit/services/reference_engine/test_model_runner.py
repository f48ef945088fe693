"""Reference-engine internals: cached and batched forwards vs a plain one, sampling, weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from services.reference_engine.model_runner import (
    KVState,
    ModelRunner,
    PrefixCache,
    SamplingState,
    WeightLoadError,
    _state_from_layers,
)

pytestmark = pytest.mark.slow  # loads the tiny model and runs forward passes


@pytest.fixture(scope="module")
def runner(tiny_model_dir: Path) -> ModelRunner:
    return ModelRunner(tiny_model_dir)


def full_logprobs(runner: ModelRunner, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = runner.model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def test_prefill_with_prefix_and_batched_decode_match_a_plain_forward(runner: ModelRunner) -> None:
    gen = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, runner.vocab_size, (n,), generator=gen).tolist() for n in (5, 40, 17)
    ]
    continuations = [
        torch.randint(0, runner.vocab_size, (6,), generator=gen).tolist() for _ in prompts
    ]
    states = []
    for prompt in prompts:
        # Prefill in two parts to exercise prefix reuse.
        kv_head, _ = runner.prefill(prompt[:3], None, 2)
        kv, logits = runner.prefill(prompt, kv_head, len(prompt) - 1)
        states.append((kv, [logits[-1]]))
    for step in range(6):
        results = runner.decode(
            [(kv, cont[step]) for (kv, _), cont in zip(states, continuations, strict=True)]
        )
        states = [
            (kv, [*seen, logits]) for (kv, logits), (_, seen) in zip(results, states, strict=True)
        ]
    for prompt, cont, (_, rows) in zip(prompts, continuations, states, strict=True):
        reference = full_logprobs(runner, prompt + cont)
        for offset, row in enumerate(rows):
            position = len(prompt) - 1 + offset
            got = torch.log_softmax(row, dim=-1)
            assert torch.allclose(got, reference[position], atol=1e-5, rtol=0), (
                len(prompt),
                offset,
            )


def test_single_decode_matches_batched_decode_and_branches_do_not_clobber(
    runner: ModelRunner,
) -> None:
    kv_a, _ = runner.prefill([1, 2, 3, 4], None, 3)
    kv_b, _ = runner.prefill([9, 8], None, 1)
    ((after_7, alone),) = runner.decode([(kv_a, 7)])
    snapshot = [k.clone() for k, _ in after_7.layers()]
    # Decoding kv_a again is a second branch: it must not write into after_7's columns.
    batched = runner.decode([(kv_a, 7), (kv_b, 6)])
    ((_, other),) = runner.decode([(kv_a, 11)])
    assert torch.allclose(alone, batched[0][1], atol=1e-5, rtol=0)
    assert all(torch.equal(k, s) for (k, _), s in zip(after_7.layers(), snapshot, strict=True))
    assert not torch.allclose(alone, other)
    assert batched[0][0].length == 5 and batched[1][0].length == 3


def state(
    temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, min_p: float = 0.0, seed: int = 0
) -> SamplingState:
    return SamplingState(
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        greedy=temperature < 1e-6 or top_k == 1,
        generator=torch.Generator().manual_seed(seed),
    )


def test_sampling_filters() -> None:
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9, -1.0])
    assert ModelRunner.sample(logits, state(temperature=0.0)) == 1
    assert ModelRunner.sample(logits, state(top_k=1)) == 1
    # top_p smaller than the best token's probability keeps only the best token.
    assert {ModelRunner.sample(logits, state(top_p=0.05, seed=s)) for s in range(20)} == {1}
    # top_k = 2 keeps the two largest.
    assert {ModelRunner.sample(logits, state(top_k=2, seed=s)) for s in range(40)} == {1, 3}
    # min_p keeps tokens with p >= min_p * p_max.
    assert {ModelRunner.sample(logits, state(min_p=0.5, seed=s)) for s in range(40)} == {1, 3}
    draws = [ModelRunner.sample(logits, state(seed=7)) for _ in range(3)]
    assert len(set(draws)) == 1, "a seeded generator must reproduce its draw"


def test_reported_logprobs_follow_sglang() -> None:
    logits = torch.tensor([0.5, 2.0, -1.0])
    raw = torch.log_softmax(logits, dim=-1)
    scaled = torch.log_softmax(logits / 0.5, dim=-1)
    assert torch.allclose(
        ModelRunner.reported_logprobs(logits, state(temperature=0.5), False), scaled
    )
    assert torch.allclose(ModelRunner.reported_logprobs(logits, state(temperature=0.5), True), raw)
    assert torch.allclose(ModelRunner.reported_logprobs(logits, state(temperature=0.0), False), raw)
    # Filters do not change the reported distribution.
    assert torch.allclose(ModelRunner.reported_logprobs(logits, state(top_k=2), False), raw)


def test_read_weights_rejects_bad_checkpoints(runner: ModelRunner, scratch: Path) -> None:
    from safetensors.torch import save_file

    with pytest.raises(WeightLoadError, match="not a directory"):
        runner.read_weights(str(scratch / "missing"))
    (scratch / "empty").mkdir()
    with pytest.raises(WeightLoadError, match=r"no \*\.safetensors"):
        runner.read_weights(str(scratch / "empty"))
    good = {k: v.clone() for k, v in runner.model.state_dict().items() if k != "lm_head.weight"}
    bad_shape = dict(good)
    bad_shape["model.norm.weight"] = torch.ones(3)
    save_file(bad_shape, str(scratch / "shape.safetensors"))
    with pytest.raises(WeightLoadError, match="shape"):
        runner.read_weights(str(scratch / "shape.safetensors"))
    extra = dict(good)
    extra["model.surprise"] = torch.ones(2)
    save_file(extra, str(scratch / "extra.safetensors"))
    with pytest.raises(WeightLoadError, match="unknown"):
        runner.read_weights(str(scratch / "extra.safetensors"))
    partial = dict(good)
    partial.pop("model.norm.weight")
    save_file(partial, str(scratch / "partial.safetensors"))
    with pytest.raises(WeightLoadError, match="missing"):
        runner.read_weights(str(scratch / "partial.safetensors"))
    save_file(good, str(scratch / "good.safetensors"))
    assert set(runner.read_weights(str(scratch / "good.safetensors"))) == set(good)


def fake_kv(length: int) -> KVState:
    k = torch.arange(length, dtype=torch.float32).view(1, 1, length, 1)
    return _state_from_layers([(k, k.clone())])


def test_prefix_cache_longest_hit_limit_and_budget() -> None:
    cache = PrefixCache(max_tokens=12)
    cache.insert([1, 2, 3, 4], fake_kv(4))
    cache.insert([1, 2, 9], fake_kv(3))
    hit, kv = cache.lookup([1, 2, 3, 4, 5], limit=4)
    assert hit == 4 and kv is not None and kv.length == 4
    assert torch.equal(kv.layer(0)[0].flatten(), torch.arange(4, dtype=torch.float32))
    hit, _ = cache.lookup([1, 2, 3, 4, 5], limit=2)
    assert hit == 2
    assert cache.lookup([7, 7], limit=1) == (0, None)
    # An entry extending an older one replaces it.
    cache.insert([1, 2, 3, 4, 5, 6], fake_kv(6))
    assert len(cache) == 2
    # Exceeding the token budget evicts the least recently used entry.
    cache.insert([8, 8, 8, 8, 8], fake_kv(5))
    assert len(cache) == 2
    assert cache.lookup([1, 2, 9, 0], limit=3)[0] == 2, "[1, 2, 9] should have been evicted"
    assert cache.lookup([8, 8, 8, 8, 8, 0], limit=5)[0] == 5
    cache.clear()
    assert len(cache) == 0 and cache.lookup([1, 2, 3], limit=2) == (0, None)


def test_repeated_batches_reuse_their_tensors_and_stay_exact(runner: ModelRunner) -> None:
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, runner.vocab_size, (n,), generator=gen).tolist() for n in (12, 30)]
    tokens = torch.randint(0, runner.vocab_size, (4,), generator=gen).tolist()
    kvs = [runner.prefill(p, None, len(p) - 1)[0] for p in prompts]
    rows: list[list[torch.Tensor]] = [[], []]
    for step, token in enumerate(tokens):
        results = runner.decode([(kv, token) for kv in kvs])
        if step > 0:
            assert results[0][0].buffers is kvs[0].buffers, "an unchanged batch decodes in place"
        kvs = [kv for kv, _ in results]
        for i, (_, logits) in enumerate(results):
            rows[i].append(torch.log_softmax(logits, dim=-1))
    for prompt, got in zip(prompts, rows, strict=True):
        reference = full_logprobs(runner, prompt + tokens)
        for offset, row in enumerate(got):
            # Row `offset` is the prediction after feeding tokens[offset].
            assert torch.allclose(row, reference[len(prompt) + offset], atol=1e-5, rtol=0)


def test_choose_batch_mixes_forced_greedy_filtered_and_plain_rows() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.9, -1.0]] * 4)
    states = [state(seed=0), state(temperature=0.0), state(top_k=2, seed=1), state(seed=2)]
    reported = ModelRunner.reported_logprobs_batch(logits, states, False)
    tokens = ModelRunner.choose_batch(logits, reported, states, False, [4, None, None, None])
    assert tokens[0] == 4 and tokens[1] == 1 and tokens[2] in {1, 3}
    # The batched plain path samples from softmax(logits / temperature).
    plain = [state(temperature=2.0, seed=s) for s in range(3000)]
    many = logits[:1].expand(3000, -1)
    draws = ModelRunner.choose_batch(
        many, ModelRunner.reported_logprobs_batch(many, plain, False), plain, False, [None] * 3000
    )
    frequencies = torch.bincount(torch.tensor(draws), minlength=5).float() / 3000
    expected = torch.softmax(logits[0] / 2.0, dim=-1)
    assert torch.allclose(frequencies, expected, atol=0.03), (frequencies, expected)


def test_moe_model_is_served_exactly_and_takes_checkpoint_named_weights(
    tiny_moe_dir: Path, scratch: Path
) -> None:
    """The tiny Qwen3-MoE model: cached prefill + batched decode equal a plain forward within
    1e-5, and weight updates use the checkpoint's per-expert names (as SGLang's do)."""
    moe = ModelRunner(tiny_moe_dir)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, moe.vocab_size, (n,), generator=gen).tolist() for n in (7, 19)]
    states = [moe.prefill(p, None, len(p) - 1) for p in prompts]
    nxt = [int(torch.argmax(logits[-1])) for _, logits in states]
    decoded = moe.decode([(kv, t) for (kv, _), t in zip(states, nxt, strict=True)])
    for prompt, token, (_, logits) in zip(prompts, nxt, decoded, strict=True):
        reference = full_logprobs(moe, [*prompt, token])[-1]
        assert torch.allclose(torch.log_softmax(logits, -1), reference, atol=1e-5, rtol=0)

    name = "model.layers.0.mlp.experts.1.down_proj.weight"
    assert name in moe.weight_shapes()
    tensors = moe.read_weights(str(tiny_moe_dir))
    tensors[name] = torch.full_like(tensors[name], 0.25)
    moe.apply_weights(tensors)
    assert torch.all(moe.model.model.layers[0].mlp.experts.down_proj[1] == 0.25)
    from safetensors.torch import save_file

    fused = {**tensors, "model.layers.0.mlp.experts.down_proj": torch.zeros(4, 64, 64)}
    save_file(fused, str(scratch / "fused.safetensors"))
    with pytest.raises(WeightLoadError, match="unknown"):  # in-memory names are not accepted
        moe.read_weights(str(scratch / "fused.safetensors"))
