"""Training-loop fixtures: worker and manager processes that never outlive a test, and the
adapter integration tests' in-process adapter (the publishing loop test serves through it)."""

from tests.integration.adapter.conftest import adapter, model_dir  # noqa: F401 (fixtures)
from tests.support.execution import manager, probe, procs, queue  # noqa: F401 (fixtures)
