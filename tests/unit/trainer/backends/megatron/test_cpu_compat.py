"""The CPU RNG tracker that stands in for megatron's CUDA one: named streams that continue
across forks, the outer generator untouched, duplicate names and seeds refused; the schedules'
CUDA zeros, ``Tensor.cuda`` while building, one device per process; a megatron-style linear
backward under its forward's CPU autocast."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from trainer.backends.megatron.cpu_compat import CpuRngStatesTracker


def test_a_fork_draws_from_its_named_stream_and_restores_the_outer_one() -> None:
    tracker = CpuRngStatesTracker()
    tracker.add("model-parallel-rng", 1234)
    torch.manual_seed(0)
    outer = torch.rand(3)
    torch.manual_seed(0)
    with tracker.fork():
        first = torch.rand(3)
    assert torch.equal(torch.rand(3), outer)  # the outer stream did not move
    with tracker.fork():
        second = torch.rand(3)
    expected = torch.rand(6, generator=torch.Generator().manual_seed(1234))
    assert torch.equal(torch.cat([first, second]), expected)  # one stream across both forks
    saved = tracker.get_states()
    with tracker.fork():
        third = torch.rand(2)
    tracker.set_states(saved)
    with tracker.fork():
        assert torch.equal(torch.rand(2), third)  # states round trip


def test_duplicate_names_and_seeds_are_refused() -> None:
    tracker = CpuRngStatesTracker()
    tracker.add("a", 1)
    with pytest.raises(ValueError, match="seed 1 already exists"):
        tracker.add("b", 1)
    with pytest.raises(ValueError, match="rng state a already exists"):
        tracker.add("a", 2)
    with pytest.raises(ValueError, match="rng state unknown is not added"), tracker.fork("unknown"):
        pass
    tracker.reset()
    assert not tracker.is_initialized()


def test_the_schedules_torch_allocates_cuda_zeros_on_the_cpu_and_nothing_else_changes() -> None:
    from trainer.backends.megatron.cpu_compat import _CpuTorch

    fake = _CpuTorch(torch)
    counter = fake.zeros([], dtype=torch.int, device="cuda")
    assert counter.device.type == "cpu" and counter.dtype == torch.int and int(counter) == 0
    assert fake.zeros(2, device=torch.device("cuda", 0)).device.type == "cpu"
    assert fake.ones is torch.ones and fake.distributed is torch.distributed  # the real module


def test_building_makes_tensor_cuda_the_identity_only_inside(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainer.backends.megatron import cpu_compat

    real = torch.Tensor.cuda
    t = torch.ones(2)
    monkeypatch.setattr(cpu_compat, "_INSTALLED", [])
    with cpu_compat.building():  # the layer is not installed: megatron's own path
        assert torch.Tensor.cuda is real
    monkeypatch.setattr(cpu_compat, "_INSTALLED", ["torch.cuda.current_device"])
    with cpu_compat.building():
        assert t.cuda() is t
    assert torch.Tensor.cuda is real
    if not torch.cuda.is_available():
        with pytest.raises((RuntimeError, AssertionError)):
            t.cuda()  # no CUDA on this machine: the real method raises again


def test_one_process_runs_megatron_on_one_device(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.backends.megatron import cpu_compat

    monkeypatch.setattr(cpu_compat, "_INSTALLED", ["torch.cuda.current_device"])
    monkeypatch.setattr(cpu_compat, "_CUDA_CLAIMED", [])
    with pytest.raises(cpu_compat.CompatError, match="already runs a megatron backend on the CPU"):
        cpu_compat.claim_cuda()
    monkeypatch.setattr(cpu_compat, "_INSTALLED", [])
    cpu_compat.claim_cuda()
    with pytest.raises(cpu_compat.CompatError, match="already runs a megatron backend on cuda"):
        cpu_compat.install()
    assert not cpu_compat._INSTALLED  # nothing was patched


def _frozen_linear() -> type[torch.autograd.Function]:
    """A linear autograd function as megatron writes them (``LinearWithFrozenWeight``): the
    fp32 weight saved, ``custom_fwd`` / ``custom_bwd`` for CUDA only."""
    from functools import partial

    custom_fwd = partial(torch.amp.custom_fwd, device_type="cuda")
    custom_bwd = partial(torch.amp.custom_bwd, device_type="cuda")

    class FrozenLinear(torch.autograd.Function):
        @staticmethod
        @custom_fwd
        def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
            ctx.save_for_backward(weight)
            return torch.matmul(x, weight.t())

        @staticmethod
        @custom_bwd
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
            (weight,) = ctx.saved_tensors
            return grad.matmul(weight), None

    return FrozenLinear


def test_a_linear_backward_runs_under_its_forwards_cpu_autocast() -> None:
    from trainer.backends.megatron.cpu_compat import cpu_autocast_backward

    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 8, generator=generator)
    weight = torch.randn(16, 8, generator=generator)
    grad = torch.randn(4, 16, generator=generator)

    def input_grad(function: type[torch.autograd.Function], autocast: bool) -> torch.Tensor:
        leaf = x.clone().requires_grad_(True)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=autocast):
            out = function.apply(leaf, weight)
        out.backward(grad.to(out.dtype))  # outside autocast, as the backend's backward runs
        assert leaf.grad is not None
        return leaf.grad

    plain = _frozen_linear()
    fp32 = input_grad(plain, autocast=False)
    with pytest.raises(RuntimeError, match="same dtype"):
        input_grad(plain, autocast=True)  # megatron's CUDA-only custom_bwd on the CPU
    patched = _frozen_linear()
    cpu_autocast_backward(patched)
    cpu_autocast_backward(patched)  # twice: wrapped once
    assert torch.equal(input_grad(patched, autocast=False), fp32)  # fp32: nothing changes
    bf16 = input_grad(patched, autocast=True)
    want = (grad.bfloat16() @ weight.bfloat16()).float()  # CUDA's custom_bwd: bf16 matmul
    assert torch.equal(bf16, want) and not torch.equal(bf16, fp32)
