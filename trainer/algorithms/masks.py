"""The action mask, validated once, with the derived tensors every function needs.

Many functions need the same facts about a batch's action mask: the bool mask itself, its 0/1
weights in the working float dtype, the number of action tokens per row (``M_i``) and the
position of each row's last action token (``u_M``). :class:`ActionMask` computes each of them at
most once. Every public function accepts either a raw ``[N, T]`` mask tensor (validated and
wrapped on the spot) or an :class:`ActionMask` (already validated), so a trainer that builds one
per batch pays for the checks and conversions once.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from trainer.algorithms.validation import action_mask_bool


class ActionMask:
    """A validated ``[N, T]`` action mask (1 on model-generated tokens, >= 1 per row).

    Attributes:
        mask: the bool ``[N, T]`` tensor.
    """

    __slots__ = ("_first", "_last", "_row_counts", "_spans", "_weights", "mask")

    def __init__(self, action_mask: Tensor, *, check: bool = True) -> None:
        self.mask = action_mask_bool(action_mask) if check else action_mask.bool()
        self._weights: dict[torch.dtype, Tensor] = {}
        self._row_counts: dict[torch.dtype, Tensor] = {}
        self._last: Tensor | None = None
        self._first: Tensor | None = None
        self._spans: tuple[Tensor, Tensor] | None = None

    @classmethod
    def of(cls, action_mask: Tensor | ActionMask, *, check: bool = True) -> ActionMask:
        """Wrap (and, with ``check``, validate) a mask tensor; pass an ActionMask through."""
        if isinstance(action_mask, ActionMask):
            return action_mask
        return cls(action_mask, check=check)

    @property
    def shape(self) -> torch.Size:
        return self.mask.shape

    @property
    def device(self) -> torch.device:
        return self.mask.device

    def weights(self, dtype: torch.dtype) -> Tensor:
        """``[N, T]`` 0/1 weights in ``dtype`` (cached per dtype)."""
        if dtype not in self._weights:
            self._weights[dtype] = self.mask.view(torch.uint8).to(dtype)
        return self._weights[dtype]

    def row_counts(self, dtype: torch.dtype) -> Tensor:
        """``[N]`` number of action tokens per row, ``M_i``, in ``dtype`` (cached).

        Counted once in float32 (exact for rows up to 16M tokens), then converted.
        """
        if dtype not in self._row_counts:
            if torch.float32 not in self._row_counts:
                self._row_counts[torch.float32] = self.weights(torch.float32).sum(dim=1)
            self._row_counts[dtype] = self._row_counts[torch.float32].to(dtype)
        return self._row_counts[dtype]

    def total(self, dtype: torch.dtype) -> Tensor:
        """0-dim number of action tokens of the batch (summed in float64), in ``dtype``."""
        return self.row_counts(torch.float64).sum().to(dtype)

    @property
    def last(self) -> Tensor:
        """``[N]`` long: position ``u_M`` of each row's last action token (cached)."""
        if self._last is None:
            self._last = _last_from_weights(self.weights(torch.float32))
        return self._last

    @property
    def first(self) -> Tensor:
        """``[N]`` long: position ``u_1`` of each row's first action token (cached)."""
        if self._first is None:
            self._first = _first_from_weights(self.weights(torch.float32))
        return self._first

    def spans(self) -> tuple[Tensor, Tensor]:
        """``(starts, ends)``, each ``[E, 2]`` long (row, position): the first and the last
        token of every span of consecutive action tokens, row-major (cached).

        One scan for change points: with a False column padded on both sides of each row,
        the flattened mask changes value exactly at a span's first token and right after its
        last, alternately (a span never crosses a row).
        """
        if self._spans is None:
            width = self.shape[1] + 2
            flat = torch.nn.functional.pad(self.mask, (1, 1)).reshape(-1)
            change = flat_nonzero(flat[1:] != flat[:-1])  # between flat[c] and flat[c + 1]
            first, last = change[0::2] + 1, change[1::2]  # padded flat positions
            self._spans = tuple(  # type: ignore[assignment]
                torch.stack((p // width, p % width - 1), dim=1) for p in (first, last)
            )
        assert self._spans is not None
        return self._spans


def flat_nonzero(flags: Tensor) -> Tensor:
    """``[K]`` long: the indices of the True entries of a 1-D bool tensor, ascending.

    ``flags.nonzero()`` on an accelerator; on the CPU NumPy's ``flatnonzero`` (about 5x faster
    than torch's CPU ``nonzero`` at 2M entries, ``bench/bench_algorithms.py``).
    """
    if flags.device.type != "cpu":
        return flags.nonzero().squeeze(1)
    return torch.from_numpy(np.flatnonzero(flags.numpy()))


def last_action_index(action_mask: Tensor, *, check: bool = True) -> Tensor:
    """``[N]`` long: the position ``u_M`` of each row's last action token (-1 for an empty row).

    ``max_t (m_t * (t + 1)) - 1`` in float32 (exact up to 16M positions): a multiply and a max,
    much cheaper on the CPU than an int64 ``where`` or a byte ``argmax``.
    """
    mask = action_mask_bool(action_mask) if check else action_mask.bool()
    return _last_from_weights(mask.view(torch.uint8).to(torch.float32))


def _last_from_weights(weights: Tensor) -> Tensor:
    """Last position with weight 1, from ``[N, T]`` float32 0/1 weights (-1 if none)."""
    width = weights.shape[1]
    if width == 0:
        return torch.full((weights.shape[0],), -1, dtype=torch.long, device=weights.device)
    positions = torch.arange(1, width + 1, device=weights.device, dtype=torch.float32)
    return (weights * positions).amax(dim=1).long() - 1


def _first_from_weights(weights: Tensor) -> Tensor:
    """First position with weight 1, from ``[N, T]`` float32 0/1 weights (``T`` if none).

    ``T - max_t (m_t * (T - t))``: the mirror image of :func:`_last_from_weights`.
    """
    width = weights.shape[1]
    if width == 0:
        return torch.zeros(weights.shape[0], dtype=torch.long, device=weights.device)
    countdown = torch.arange(width, 0, -1, device=weights.device, dtype=torch.float32)
    return width - (weights * countdown).amax(dim=1).long()
