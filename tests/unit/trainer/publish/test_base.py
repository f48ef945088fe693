"""The publish result's timings read from the adapter's refresh summary, for both modes."""

from __future__ import annotations

from trainer.publish.base import adapter_timings


def test_step_mode_drains_and_pauses_no_request() -> None:
    timings = adapter_timings(
        {"mode": "step", "gate_closed_s": 2.5, "drain_s": 2.0, "load_s": 0.4, "pause_s": 0.0}
    )
    assert timings == {
        "gate_closed": 2.5,
        "drain": 2.0,
        "engine_load": 0.4,
        "requests_paused": 0.0,
    }


def test_token_mode_pauses_requests_for_the_whole_closed_gate() -> None:
    timings = adapter_timings(
        {"mode": "token", "gate_closed_s": 0.09, "drain_s": 0.0, "load_s": 0.05}
    )
    assert timings["requests_paused"] == 0.09 and timings["drain"] == 0.0


def test_an_old_summary_without_the_fields_reads_as_zero() -> None:
    assert adapter_timings({}) == {
        "gate_closed": 0.0,
        "drain": 0.0,
        "engine_load": 0.0,
        "requests_paused": 0.0,
    }


def test_probes_are_the_first_and_last_one_dimensional_tensors(tmp_path) -> None:
    import torch
    from safetensors.torch import save_file

    from trainer.publish.base import PROBE_VALUES, weight_probes
    from trainer.publish.versions import directory_probes

    named = {
        "model.layers.0.input_layernorm.weight": torch.arange(12, dtype=torch.float32),
        "model.layers.0.mlp.up_proj.weight": torch.ones(3, 4),  # a matrix: never a probe
        "model.layers.1.input_layernorm.weight": torch.full((5,), 7.0),
        "model.norm.weight": torch.linspace(-1, 1, 20).to(torch.bfloat16),
        "model.steps": torch.arange(3),  # not floating
    }
    probes = weight_probes(named.items())
    assert [p["name"] for p in probes] == [
        "model.layers.0.input_layernorm.weight", "model.norm.weight"
    ]  # fmt: skip
    assert probes[0]["values"] == [float(v) for v in range(PROBE_VALUES)]
    assert probes[1]["values"] == named["model.norm.weight"][:PROBE_VALUES].float().tolist()
    half = {k: v for k, v in named.items() if k != "model.steps"}
    save_file(dict(list(half.items())[:2]), tmp_path / "model-1.safetensors")
    save_file(dict(list(half.items())[2:]), tmp_path / "model-2.safetensors")
    assert directory_probes(tmp_path) == probes  # the same from the exported files


def test_probe_token_ids_are_spread_distinct_and_skip_special_tokens() -> None:
    from trainer.publish.base import LOGPROB_PROBE_TOKENS, probe_token_ids

    ids = probe_token_ids(1000, excluded=[618, 236])
    assert ids == probe_token_ids(1000, excluded=[236, 618])  # the same every time
    assert len(ids) == LOGPROB_PROBE_TOKENS == len(set(ids))
    assert all(0 <= i < 1000 for i in ids) and not {618, 236} & set(ids)
    assert min(ids) < 100 and max(ids) > 900  # over the whole vocabulary
    assert sorted(probe_token_ids(5, excluded=[0, 1])) == [2, 3, 4]  # a tiny vocabulary


def test_the_logprob_probe_is_deterministic_and_a_plain_forward_of_the_model() -> None:
    """What the adapter compares each engine's input-token logprobs with: the actor's
    teacher-forced logprobs of tokens 1..L-1, as the Hugging Face model computes them."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.support.engines import tiny_model_for_session
    from trainer.backends.torch_backend import TorchBackend
    from trainer.config import TrainerConfig
    from trainer.publish.base import LOGPROB_PROBE_TOKENS, logprob_probe

    with tiny_model_for_session() as path:
        backend = TorchBackend(TrainerConfig(model=str(path)))
        probe = logprob_probe(backend)
        assert probe is not None and probe == logprob_probe(backend)
        ids = probe["input_ids"]
        assert len(ids) == LOGPROB_PROBE_TOKENS and len(probe["logprobs"]) == len(ids) - 1
        assert not set(ids) & set(backend.tokenizer.all_special_ids)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1]
        plain = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(ids[1:])[:, None])
        assert torch.allclose(torch.tensor(probe["logprobs"]), plain[:, 0], atol=1e-4)
        # the adapter's request model accepts it
        from adapter.weight_check import LogprobProbe

        LogprobProbe.model_validate(probe)
        # a temperature other than 1: the trainer's logprobs are not the engine's, no probe
        assert (
            logprob_probe(TorchBackend(TrainerConfig(model=str(path), rollout_temperature=0.7)))
            is None
        )
