"""Inclusive ranges of calendar days."""

from dataclasses import dataclass
from datetime import date, timedelta
from typing import Iterator, List

_ONE_DAY = timedelta(days=1)


@dataclass(frozen=True)
class DateRange:
    """All days from ``start`` to ``end``, both included."""

    start: date
    end: date

    def __post_init__(self) -> None:
        if self.end < self.start:
            raise ValueError(f"range end {self.end} is before its start {self.start}")

    def __len__(self) -> int:
        return (self.end - self.start).days + 1

    def __iter__(self) -> Iterator[date]:
        day = self.start
        while day <= self.end:
            yield day
            day += _ONE_DAY

    def __contains__(self, day: object) -> bool:
        return isinstance(day, date) and self.start <= day <= self.end

    def weekdays(self) -> int:
        """Number of Mondays to Fridays in the range."""
        return sum(1 for day in self if day.weekday() < 5)

    def split_by_month(self) -> List["DateRange"]:
        """Split the range at month boundaries, e.g. Jan 20 - Mar 3 gives three parts."""
        parts: List[DateRange] = []
        current = self.start
        while current <= self.end:
            next_month = date(current.year, current.month + 1, 1)
            last = min(self.end, next_month - _ONE_DAY)
            parts.append(DateRange(current, last))
            current = next_month
        return parts


def parse_range(text: str) -> DateRange:
    """Parse ``"2024-01-05..2024-02-10"`` (ISO dates joined by ``..``)."""
    start_text, sep, end_text = text.partition("..")
    if not sep:
        raise ValueError(f"expected 'START..END', got {text!r}")
    return DateRange(date.fromisoformat(start_text.strip()), date.fromisoformat(end_text.strip()))
