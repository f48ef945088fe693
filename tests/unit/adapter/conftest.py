"""Fixtures of the adapter unit tests: the tiny model (both chat-template variants)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.engines import tiny_model_path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("tiny"), coder=False)


@pytest.fixture(scope="session")
def tiny_coder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("tiny-coder"), coder=True)
