"""Fixtures of the backend tests: the tiny model and a reference engine serving it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers.utils import logging as hf_logging

from tests.support.engines import engine_url, tiny_model_for_session  # noqa: F401 (fixture)

hf_logging.disable_progress_bar()


@pytest.fixture(scope="session")
def tiny_model_dir() -> Iterator[Path]:
    with tiny_model_for_session() as path:
        yield path
