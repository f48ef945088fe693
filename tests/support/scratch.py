"""A private temporary directory fixture for tests that outlive pytest's numbered base temp."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A private temporary directory.

    Not pytest's ``tmp_path``: concurrent pytest sessions on one machine prune each other's
    numbered base temp directories, which breaks long runs.
    """
    with tempfile.TemporaryDirectory(prefix="swerl-test-") as directory:
        yield Path(directory)
