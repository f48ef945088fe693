"""The CPU RNG tracker that stands in for megatron's CUDA one: named streams that continue
across forks, the outer generator untouched, duplicate names and seeds refused."""

from __future__ import annotations

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


def test_building_makes_tensor_cuda_the_identity_only_inside() -> None:
    from trainer.backends.megatron.cpu_compat import building

    if torch.cuda.is_available():
        pytest.skip("the replacement applies only without CUDA")
    real = torch.Tensor.cuda
    t = torch.ones(2)
    with building():
        assert t.cuda() is t
    assert torch.Tensor.cuda is real
    with pytest.raises((RuntimeError, AssertionError)):
        t.cuda()  # no CUDA on this machine: the real method raises again
