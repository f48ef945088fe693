"""spanlib: interval arithmetic for numbers."""

from spanlib.interval import Interval, gaps, merge, total_length

__version__ = "1.1.0"

__all__ = ["Interval", "gaps", "merge", "total_length"]
