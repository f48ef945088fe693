"""Token-mode refresh: continuing the generate calls that a refresh interrupted.

A ``token``-mode refresh (:mod:`adapter.weights`) pauses every engine with SGLang's
``/pause_generation {"mode": "abort"}``: each running request returns at once with the tokens
and logprobs it produced so far and ``finish_reason.type == "abort"``. The engine client
(:class:`adapter.engines.sglang.SGLangClient`) sees such an answer, waits here until the new
weights are loaded and the engine continues, and sends the request again from its prefix --
the original input ids followed by the partial output, prefilled again under the new weights --
with ``max_new_tokens`` reduced by what was produced and every other sampling setting unchanged.
The pieces are stitched into one answer (:func:`stitch`); the caller never sees the interruption.

Races, each with a defined outcome:

* a request that finished naturally before the pause reached it is not aborted: its whole
  output is the old version's, returned as is;
* a request that reached the engine after the pause is held there (or waits at the closed gate)
  and runs entirely on the new weights;
* a request interrupted on an engine that then failed to load leaves with
  :class:`~adapter.engines.sglang.EngineUnavailableError` (no token of it reached the client),
  and the router retries it from the start on an engine in rotation.

* a stop *string* that straddles the switch point (its first characters generated before the
  pause, the rest after) is not seen by the engine, which matches stop strings in the
  continuation's own output only: the client asks continuations for per-token texts and cuts the
  answer after the token that completes it (:func:`straddling_stop`), finishing with ``stop``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from services.protocol.sglang import SamplingParams

# What a token-mode pause's abort says (SGLang and the reference engine); informative only: an
# abort is recognised as the refresh's by the pause window it fell in, not by its message.
PAUSE_ABORT_HINT = "pause_generation"


@dataclass
class RefreshBarrier:
    """The pause window of token-mode refreshes, shared by the coordinator and the clients.

    ``epoch`` counts pauses; a call remembers the epoch it was sent in, so an abort that comes
    back while a pause is on, or after one began, is recognised as the refresh's.
    """

    epoch: int = 0
    paused: bool = False
    failed: frozenset[str] = frozenset()  # engines that did not load in the last refresh
    continued: int = 0  # interrupted calls continued from their prefix (all refreshes)
    _resumed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        self._resumed.set()

    def begin(self) -> None:
        """A refresh starts pausing the engines."""
        self.epoch += 1
        self.paused = True
        self.failed = frozenset()
        self._resumed.clear()

    def end(self, failed: frozenset[str]) -> None:
        """The engines continue; ``failed``: URLs of engines that did not load."""
        self.failed = failed
        self.paused = False
        self._resumed.set()

    def interrupted(self, sent_in_epoch: int) -> bool:
        """True if an abort of a call sent in ``sent_in_epoch`` is a refresh's pause."""
        return self.paused or self.epoch != sent_in_epoch

    async def wait_resumed(self) -> None:
        await self._resumed.wait()


def continued_sampling(sampling: SamplingParams, produced: int) -> SamplingParams:
    """The sampling settings of a continuation: the budget less the ``produced`` tokens."""
    if not 0 <= produced <= sampling.max_new_tokens:
        raise ValueError(
            f"{produced} tokens produced with max_new_tokens={sampling.max_new_tokens}"
        )
    return sampling.model_copy(update={"max_new_tokens": sampling.max_new_tokens - produced})


@dataclass(frozen=True)
class Piece:
    """What one engine call of an interrupted request produced."""

    output_ids: Sequence[int]
    weight_version: str | None


def version_runs(pieces: Sequence[Piece]) -> tuple[tuple[int, str | None], ...]:
    """Runs ``(start index, version)`` over the stitched output: one per version change.

    Pieces without tokens add nothing; adjacent pieces of the same version merge. No tokens at
    all: one run at 0 with the last piece's version (the one that finished the call).
    """
    runs: list[tuple[int, str | None]] = []
    start = 0
    for piece in pieces:
        if piece.output_ids and (not runs or runs[-1][1] != piece.weight_version):
            runs.append((start, piece.weight_version))
        start += len(piece.output_ids)
    if not runs:
        runs.append((0, pieces[-1].weight_version if pieces else None))
    return tuple(runs)


def numeric_runs(
    runs: Sequence[tuple[int, str | None]], version_of: Callable[[str | None], int]
) -> list[tuple[int, int]]:
    """The engine's version runs as swerl's integer versions; runs that map to the same version
    (e.g. a non-numeric engine version read as the current one) merge. One run: none (the turn's
    ``weight_version`` says it all)."""
    merged: list[tuple[int, int]] = []
    for start, raw in runs:
        version = version_of(raw)
        if not merged or merged[-1][1] != version:
            merged.append((start, version))
    return merged if len(merged) > 1 else []


def stitch_lists[T](parts: Sequence[Sequence[T] | None]) -> list[T] | None:
    """Concatenate per-piece lists; None if any piece has none (not requested)."""
    if any(p is None for p in parts):
        return None
    out: list[T] = []
    for part in parts:
        out.extend(part or [])
    return out


def straddling_stop(
    before: str, token_texts: Sequence[str], stops: Sequence[str]
) -> tuple[int, str] | None:
    """A stop string that begins in ``before`` (the output text up to the switch point) and
    ends in the continuation, whose tokens decode to ``token_texts``: ``(tokens of the
    continuation to keep, the stop string)`` for the first one completed, else None. A stop
    string wholly inside the continuation is the engine's to find."""
    longest = max((len(stop) for stop in stops), default=0)
    if longest < 2 or not before:
        return None
    tail = before[-(longest - 1) :]
    text = tail
    for kept, piece in enumerate(token_texts, start=1):
        text += piece
        found = [(text.find(stop), stop) for stop in stops]
        hits = [(pos, stop) for pos, stop in found if 0 <= pos < len(tail)]
        if hits:
            return kept, min(hits)[1]
        if len(text) - len(tail) >= longest - 1:
            return None  # a straddling stop would have ended by now
    return None
