"""The one place where the megatron backend adapts megatron-core to a machine without CUDA.

megatron-core 0.19.2 (pinned: this file touches its internals) assumes a GPU in a few places
even when every module is built with ``use_cpu_initialization`` and fusions are off. On a
machine where CUDA is unavailable, :func:`install` replaces exactly these CUDA assumptions and
nothing else (each entry names what it replaces and why):

1. ``torch.cuda.current_device`` -> ``torch.device("cpu")``: megatron allocates buffers with
   ``device=torch.cuda.current_device()`` (the M-RoPE inverse frequencies, schedule and
   optimizer scratch tensors); on CPU they belong on the CPU.
2. The model-parallel RNG tracker (``tensor_parallel.random._CUDA_RNG_STATE_TRACKER``) -> a
   tracker of CPU generator states: megatron forks "the CUDA RNG" around attention dropout and
   for tensor-parallel weight initialisation; on CPU the fork saves and restores the CPU
   generator (same seeds per name, so dropout masks stay reproducible). Seeded by megatron's
   own ``model_parallel_cuda_manual_seed`` (its ``torch.cuda.manual_seed`` is lazy: a no-op
   without CUDA).

3. ``torch.cuda.synchronize`` -> a no-op: megatron's pipeline p2p communicator synchronises
   "the GPU" after a batched ``isend``/``irecv`` (the activation shapes and tensors between
   stages); on CPU the gloo requests it already waited for are complete.
4. ``torch`` as seen by ``megatron.core.pipeline_parallel.schedules`` -> :class:`_CpuTorch`, the
   real module except ``torch.zeros(..., device="cuda")``, which allocates on the CPU: the
   1F1B and no-pipelining schedules allocate their token counter with ``device="cuda"``.
5. While a ``GPTModel`` is built (:func:`building`, used by the backend's builder, not
   process-wide): ``Tensor.cuda()`` -> the tensor itself: under pipeline parallel with tied
   embeddings the last stage moves its copy of the word embeddings to "the GPU" before the
   all-reduce that makes it equal to the first stage's.

6. ``tensor_parallel.random._get_cuda_rng_state`` / ``_set_cuda_rng_state`` -> None / a
   no-op: activation recompute (``recompute_granularity="full"``) saves "all RNG states"
   before a layer's forward and restores them for its recomputation: the CPU generator's and
   the tracker's (2), which are this machine's, and the CUDA generator's, which does not
   exist here.
7. The backward of megatron's linear autograd functions
   (``tensor_parallel.layers.LinearWithGradAccumulationAndAsyncCommunication`` and
   ``LinearWithFrozenWeight``) runs under the forward's CPU autocast state
   (:func:`cpu_autocast_backward`): they are ``custom_fwd`` / ``custom_bwd`` for CUDA only, so
   on a GPU the backward re-enters the forward's autocast, on the CPU it would not and a
   bfloat16 output gradient would meet the saved fp32 weight (a dtype error). With autocast
   off in the forward nothing changes (fp32, the users' CPU path); under ``precision: bf16``
   (the GPU path, which the tests run on the CPU's bfloat16 autocast) the CPU backward
   computes what CUDA's does.

Not needed yet (the backend drives the backward itself, with torch's AdamW): Megatron DDP's
and the DistributedOptimizer's CUDA streams, events and ``device="cuda"`` scratch tensors and
its ``param.type()`` check, which the feasibility spike of issue 10 also had to replace. They
join this list when those parts are used.

The layer is installed for a megatron backend on the CPU only (a backend on ``cuda`` runs
megatron's own GPU path), and installing twice is a no-op. The patches are process-wide: on a
machine without CUDA they only replace functions that would raise anyway, so the torch backend
in the same process is unaffected. On a machine with a GPU they would turn megatron's CUDA
calls into CPU ones, so one process runs megatron on one device: :func:`install` on the CPU
after :func:`claim_cuda`, or the other way round, raises :class:`CompatError`.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import torch

_INSTALLED: list[str] = []
_CUDA_CLAIMED: list[bool] = []


class CompatError(RuntimeError):
    """Megatron on the CPU and on CUDA in one process (see the module docstring)."""


class CpuRngStatesTracker:
    """Megatron's ``CudaRNGStatesTracker`` interface over CPU generator states."""

    def __init__(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()

    def is_initialized(self) -> bool:
        return bool(self.states_)

    def reset(self) -> None:
        self.states_ = {}
        self.seeds_ = set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return {name: state.clone() for name, state in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self.states_ = {name: state.clone() for name, state in states.items()}

    def add(self, name: str, seed: int) -> None:
        if seed in self.seeds_:
            raise ValueError(f"seed {seed} already exists")
        if name in self.states_:
            raise ValueError(f"rng state {name} already exists")
        self.seeds_.add(seed)
        outer = torch.random.get_rng_state()
        torch.random.manual_seed(seed)
        self.states_[name] = torch.random.get_rng_state()
        torch.random.set_rng_state(outer)

    @contextlib.contextmanager
    def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
        """Run the block on the named CPU generator state (the outer state is restored)."""
        if name not in self.states_:
            raise ValueError(f"rng state {name} is not added")
        outer = torch.random.get_rng_state()
        torch.random.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.random.get_rng_state()
            torch.random.set_rng_state(outer)


class _CpuTorch:
    """``torch`` for one megatron module: every attribute the real module's, except ``zeros``
    with ``device="cuda"`` (or a CUDA device), which allocates on the CPU instead."""

    def __init__(self, real: types.ModuleType) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def zeros(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return self._real.zeros(*args, **kwargs)


def _no_cuda_rng_state(*args: Any, **kwargs: Any) -> None:
    """(6) There is no CUDA generator to read: activation recompute keeps the CPU generator's
    state and the tracker's (1-2) beside this one, which is None."""
    return None


def _set_no_cuda_rng_state(*args: Any, **kwargs: Any) -> None:
    """(6) Nothing to put back (see :func:`_no_cuda_rng_state`)."""


def cpu_autocast_backward(function: type[torch.autograd.Function]) -> None:
    """(7) Make ``function``'s backward run under the CPU autocast state its forward ran
    under, what ``torch.amp.custom_fwd`` / ``custom_bwd`` do for one device type (megatron's
    are CUDA's). The state goes on the context under names of its own (``custom_fwd`` keeps
    CUDA's in ``_fwd_used_autocast`` / ``_dtype``). Once per function: a second call is a
    no-op."""
    if getattr(function, "_swerl_cpu_autocast", False):
        return
    forward, backward = function.forward, function.backward

    def recorded_forward(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        ctx.swerl_cpu_autocast = torch.is_autocast_enabled("cpu")
        ctx.swerl_cpu_autocast_dtype = torch.get_autocast_dtype("cpu")
        return forward(ctx, *args, **kwargs)

    def autocast_backward(ctx: Any, *grads: Any) -> Any:
        enabled, dtype = ctx.swerl_cpu_autocast, ctx.swerl_cpu_autocast_dtype
        with torch.autocast(device_type="cpu", dtype=dtype, enabled=enabled):
            return backward(ctx, *grads)

    function.forward = staticmethod(recorded_forward)  # type: ignore[assignment,method-assign]
    function.backward = staticmethod(autocast_backward)  # type: ignore[assignment,method-assign]
    function._swerl_cpu_autocast = True  # type: ignore[attr-defined]


def claim_cuda() -> None:
    """Mark this process as running megatron on CUDA (nothing is patched); raises
    :class:`CompatError` when the CPU layer is already installed."""
    if _INSTALLED:
        raise CompatError(
            "this process already runs a megatron backend on the CPU (its compatibility layer "
            "turns megatron's CUDA calls into CPU ones): run megatron on cuda in another process"
        )
    _CUDA_CLAIMED.append(True)


def install() -> list[str]:
    """Apply the process-wide replacements above (1-4, 6, 7) for megatron on the CPU; return
    what is replaced. Raises :class:`CompatError` after :func:`claim_cuda`."""
    if _INSTALLED:
        return list(_INSTALLED)
    if _CUDA_CLAIMED:
        raise CompatError(
            "this process already runs a megatron backend on cuda: run megatron on the CPU in "
            "another process"
        )
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.tensor_parallel import layers
    from megatron.core.tensor_parallel import random as megatron_random

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment,return-value]
    megatron_random._CUDA_RNG_STATE_TRACKER = CpuRngStatesTracker()  # type: ignore[assignment]
    megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    megatron_random._get_cuda_rng_state = _no_cuda_rng_state  # type: ignore[assignment]
    megatron_random._set_cuda_rng_state = _set_no_cuda_rng_state  # type: ignore[assignment]
    torch.cuda.synchronize = lambda device=None: None  # type: ignore[assignment]
    schedules.torch = _CpuTorch(torch)  # type: ignore[assignment]
    for linear in (
        layers.LinearWithGradAccumulationAndAsyncCommunication,
        layers.LinearWithFrozenWeight,
    ):
        cpu_autocast_backward(linear)
    _INSTALLED.extend(
        [
            "torch.cuda.current_device",
            "megatron.core.tensor_parallel.random._CUDA_RNG_STATE_TRACKER",
            "torch.cuda.synchronize",
            "megatron.core.pipeline_parallel.schedules.torch.zeros(device='cuda')",
            "megatron.core.tensor_parallel.random._get_cuda_rng_state / _set_cuda_rng_state",
            "megatron.core.tensor_parallel.layers linear functions: backward under the "
            "forward's CPU autocast",
        ]
    )
    return list(_INSTALLED)


@contextlib.contextmanager
def building() -> Iterator[None]:
    """Build megatron modules with ``Tensor.cuda()`` returning the tensor itself (5 above),
    while the CPU layer is installed; the real method is restored afterwards."""
    if not _INSTALLED:
        yield
        return
    real = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = real  # type: ignore[method-assign]
