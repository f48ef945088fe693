"""The manager's client and dispatch loop over the queue's sides on one real Redis."""

from tests.support.queue_sides import q  # noqa: F401 (fixture)
