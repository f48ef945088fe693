"""Fixtures for engine unit tests: the tiny model (built once per session) and its tokenizers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.engines import (  # noqa: F401 (fixtures)
    engine_url,
    tiny_coder_dir_fixture,
    tiny_model_dir_fixture,
    tiny_moe_dir_fixture,
)
from tests.support.scratch import scratch  # noqa: F401 (fixture)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def coder_tokenizer(tiny_coder_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_coder_dir))
