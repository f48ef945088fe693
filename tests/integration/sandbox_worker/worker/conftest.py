"""Execution-plane fixtures: worker and manager processes that never outlive a test."""

from tests.support.execution import manager, probe, procs, queue  # noqa: F401 (fixtures)
from tests.support.queue_sides import q  # noqa: F401 (fixture)
