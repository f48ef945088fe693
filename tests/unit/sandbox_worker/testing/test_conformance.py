"""Every test double of the sandbox worker has the interface of what it stands for.

A double that drifted from the real interface (a lost parameter, a renamed one, a new required
one) would keep its tests green while testing calls the real code never makes.
"""

from __future__ import annotations

import pytest

from sandbox_worker.adapter_client import AdapterClient, TrajectoryRecords
from sandbox_worker.backends.base import Sandbox, SandboxBackend
from sandbox_worker.runner import NodeCleaner, TrajectoryRunner
from sandbox_worker.sandbox_runner import SandboxTrajectoryRunner
from sandbox_worker.testing.local_sandbox import LocalDirBackend, LocalDirSandbox
from sandbox_worker.testing.simulated import SimulatedRunner
from tests.support.conformance import interface_methods, interface_mismatches
from tests.support.fake_worker import MarkerBackend, MarkerRunner
from tests.unit.sandbox_worker.conftest import FakeAdapter


@pytest.mark.parametrize(
    ("double", "interface"),
    [
        (FakeAdapter, TrajectoryRecords),  # stands for AdapterClient in the runner's tests
        (AdapterClient, TrajectoryRecords),  # ... which is what the protocol describes
        (MarkerRunner, TrajectoryRunner),  # stands for SandboxTrajectoryRunner in the worker
        (SimulatedRunner, TrajectoryRunner),
        (SandboxTrajectoryRunner, TrajectoryRunner),
        (MarkerBackend, NodeCleaner),  # stands for the sandbox backends' cleanup at takeover
        (LocalDirBackend, SandboxBackend),
        (LocalDirSandbox, Sandbox),
    ],
    ids=lambda c: c.__name__,
)
def test_double_has_the_interface_it_stands_for(double: type, interface: type) -> None:
    assert interface_methods(interface)  # the comparison is not vacuous
    assert interface_mismatches(double, interface) == []


def test_a_drifted_double_is_caught() -> None:
    class Drifted:
        def open(self, meta: object) -> str | None:  # wrong annotation
            return None

        def close(self, trajectory_id: str) -> object:  # lost the outcome parameter
            return None

    problems = interface_mismatches(Drifted, TrajectoryRecords)
    assert [p.split("(")[0] for p in problems] == [
        "Drifted.close",
        "Drifted has no method close_connection",
        "Drifted has no method healthy",
        "Drifted.open",
    ]
