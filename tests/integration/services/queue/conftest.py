"""The queue's sides over one real Redis client, driven step by step (no processes)."""

from tests.support.queue_sides import q  # noqa: F401 (fixture)
