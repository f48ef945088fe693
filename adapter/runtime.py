"""In-memory state of one open trajectory, owned by :class:`TrajectoryRuntime`.

The adapter keeps, per open trajectory: the recorder's state of the current segment, how many
segments the record has, the entries and counters not yet written to Redis, when it was last used
and the digest of its bearer token. Only the methods below change that state, and each checks the
invariants a change must keep:

* a turn is applied under the trajectory's lock (one request at a time);
* a turn continues the current segment (same index) or opens the next one (index = number of
  segments so far); the recorder's new state is for that segment;
* written entries leave the pending queue exactly once, in order: entries and counters applied
  while a write was in flight stay pending for the next one.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from adapter.recorder import Committed, SegmentState, TurnPlan


class RuntimeInvariantError(RuntimeError):
    """A change that would break the trajectory's in-memory state (a bug, never an input)."""


@dataclass(frozen=True)
class PendingWrite:
    """A snapshot of what is not yet written: handed to the store, then confirmed."""

    entries: tuple[bytes, ...]
    counters: dict[str, int]

    def __bool__(self) -> bool:
        return bool(self.entries or self.counters)


class TrajectoryRuntime:
    """In-memory state of one open trajectory (see the module docstring for its invariants)."""

    def __init__(
        self, trajectory_id: str, n_segments: int = 0, token_digest: str | None = None
    ) -> None:
        if n_segments < 0:
            raise RuntimeInvariantError(f"n_segments must be >= 0, got {n_segments}")
        self.trajectory_id = trajectory_id
        self.token_digest = token_digest  # of the trajectory's bearer token (adapter.auth)
        self.lock = asyncio.Lock()
        self._state: SegmentState | None = None
        self._n_segments = n_segments
        self._pending_entries: list[bytes] = []
        self._pending_counters: dict[str, int] = {}
        self._last_used = time.monotonic()

    @property
    def state(self) -> SegmentState | None:
        """The recorder's state of the current segment (None before the first turn in memory)."""
        return self._state

    @property
    def n_segments(self) -> int:
        """Segments of the record so far (the index the next new segment gets)."""
        return self._n_segments

    def touch(self) -> None:
        """Mark the trajectory as used now (it is not evicted while in use)."""
        self._last_used = time.monotonic()

    def idle_since(self, cutoff: float) -> bool:
        """Unused since ``cutoff`` (a ``time.monotonic()`` value) and no request holds it."""
        return self._last_used < cutoff and not self.lock.locked()

    def apply(self, plan: TurnPlan, committed: Committed) -> None:
        """Adopt a committed turn: the recorder's new state, the segment count, and the entries
        and counters to write."""
        if not self.lock.locked():
            raise RuntimeInvariantError(f"{self.trajectory_id}: turn applied without its lock")
        expected = self._n_segments if plan.new_segment else self._current_index()
        if plan.segment_index != expected or committed.state.index != plan.segment_index:
            raise RuntimeInvariantError(
                f"{self.trajectory_id}: turn for segment {plan.segment_index} (state "
                f"{committed.state.index}), expected segment {expected}"
            )
        self._state = committed.state
        if plan.new_segment:
            self._n_segments += 1
        self._pending_entries.extend(committed.entries)
        for name, delta in committed.counters.items():
            self._pending_counters[name] = self._pending_counters.get(name, 0) + delta

    def add_entries(self, entries: list[bytes], counters: dict[str, int]) -> None:
        """Queue entries that are not token turns (relay mode's text turns) and their counters."""
        if not self.lock.locked():
            raise RuntimeInvariantError(f"{self.trajectory_id}: entries added without its lock")
        self._pending_entries.extend(entries)
        for name, delta in counters.items():
            self._pending_counters[name] = self._pending_counters.get(name, 0) + delta

    def _current_index(self) -> int:
        if self._state is None:
            raise RuntimeInvariantError(
                f"{self.trajectory_id}: a turn continues a segment, but none is in memory"
            )
        return self._state.index

    def pending(self) -> PendingWrite:
        """What is not yet written to the store (a snapshot; confirm it with :meth:`written`)."""
        return PendingWrite(tuple(self._pending_entries), dict(self._pending_counters))

    def written(self, write: PendingWrite) -> None:
        """The store holds ``write`` now: drop it from the pending entries and counters."""
        n = len(write.entries)
        head = self._pending_entries[:n]
        if len(head) != n or any(a is not b for a, b in zip(head, write.entries, strict=True)):
            raise RuntimeInvariantError(
                f"{self.trajectory_id}: confirmed entries are not the oldest pending ones"
            )
        del self._pending_entries[:n]
        for name, delta in write.counters.items():
            left = self._pending_counters.get(name, 0) - delta
            if left < 0:
                raise RuntimeInvariantError(
                    f"{self.trajectory_id}: counter {name} confirmed beyond what was pending"
                )
            if left:
                self._pending_counters[name] = left
            else:
                self._pending_counters.pop(name, None)
