"""Training-loop fixtures: worker and manager processes that never outlive a test."""

from tests.support.execution import manager, probe, procs, queue  # noqa: F401 (fixtures)
