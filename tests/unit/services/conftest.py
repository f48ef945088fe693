"""Fixtures for engine unit tests: the tiny model (built once per session) and its tokenizers."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.engines import engine_url, tiny_model_for_session  # noqa: F401 (fixture)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Iterator[Path]:
    with tiny_model_for_session() as path:
        yield path


@pytest.fixture(scope="session")
def tiny_coder_dir() -> Iterator[Path]:
    with tiny_model_for_session(coder=True) as path:
        yield path


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def coder_tokenizer(tiny_coder_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_coder_dir))


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A private temporary directory.

    Not pytest's ``tmp_path``: concurrent pytest sessions on one machine prune each other's
    numbered base temp directories, which breaks long runs.
    """
    with tempfile.TemporaryDirectory(prefix="swerl-test-") as directory:
        yield Path(directory)
