"""Half-open numeric intervals ``[start, end)`` and operations on collections of them."""

from dataclasses import dataclass
from typing import Iterable, List, Optional


@dataclass(frozen=True, order=True)
class Interval:
    """The half-open interval ``[start, end)``; ``start == end`` is the empty interval."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"interval end {self.end} is before its start {self.start}")

    @property
    def length(self) -> float:
        return self.end - self.start

    def is_empty(self) -> bool:
        return self.start == self.end

    def contains(self, value: float) -> bool:
        """True if ``value`` lies in ``[start, end)``."""
        return self.start <= value < self.end

    def overlaps(self, other: "Interval") -> bool:
        """True if the two intervals share at least one point."""
        return self.start <= other.end and other.start <= self.end

    def intersection(self, other: "Interval") -> Optional["Interval"]:
        """The common part of both intervals, or ``None`` if they do not overlap."""
        if not self.overlaps(other):
            return None
        return Interval(max(self.start, other.start), min(self.end, other.end))

    def hull(self, other: "Interval") -> "Interval":
        """The smallest interval containing both."""
        return Interval(min(self.start, other.start), max(self.end, other.end))

    def shift(self, delta: float) -> "Interval":
        return Interval(self.start + delta, self.end + delta)


def merge(intervals: Iterable[Interval]) -> List[Interval]:
    """Merge overlapping or touching intervals into a sorted list of disjoint intervals."""
    merged: List[Interval] = []
    for interval in intervals:
        if interval.is_empty():
            continue
        if merged and interval.start <= merged[-1].end:
            merged[-1] = merged[-1].hull(interval)
        else:
            merged.append(interval)
    return merged


def total_length(intervals: Iterable[Interval]) -> float:
    """Total length covered by ``intervals``, counting overlapping parts once."""
    return sum(interval.length for interval in merge(intervals))


def gaps(intervals: Iterable[Interval], within: Interval) -> List[Interval]:
    """The parts of ``within`` that none of ``intervals`` covers, in order."""
    result: List[Interval] = []
    cursor = within.start
    for interval in merge(intervals):
        if interval.end <= cursor:
            continue
        if interval.start >= within.end:
            break
        if interval.start > cursor:
            result.append(Interval(cursor, interval.start))
        cursor = max(cursor, interval.end)
    if cursor < within.end:
        result.append(Interval(cursor, within.end))
    return result
