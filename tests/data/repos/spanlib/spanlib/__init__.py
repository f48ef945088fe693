"""spanlib: interval arithmetic for numbers and calendar dates."""

from spanlib.daterange import DateRange, parse_range
from spanlib.interval import Interval, gaps, merge, total_length

__version__ = "1.2.0"

__all__ = ["DateRange", "Interval", "gaps", "merge", "parse_range", "total_length"]
