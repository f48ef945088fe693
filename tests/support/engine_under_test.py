"""Engines under test: the reference engine by default, or a real SGLang server.

Set ``SWERL_SGLANG_URL`` (and ``SWERL_SGLANG_MODEL_DIR``, the served model directory, readable
here and by the server) to run the client contract tests against a running SGLang server;
``deploy/gpu_check_sglang.sh`` does that on a GPU machine. Without it, a reference engine is
started on the tiny model.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.engines import (  # noqa: F401 (fixture)
    ThreadedReferenceServer,
    reference_server_in_thread,
    tiny_model_dir_fixture,
)
from tests.support.scratch import scratch  # noqa: F401 (fixture)

ENGINE_URL_ENV = "SWERL_SGLANG_URL"
ENGINE_MODEL_ENV = "SWERL_SGLANG_MODEL_DIR"


@dataclass(frozen=True)
class EngineUnderTest:
    url: str
    kind: str  # "reference" | "sglang"
    model_dir: Path

    @property
    def is_reference(self) -> bool:
        return self.kind == "reference"


@pytest.fixture(scope="session")
def reference_server(tiny_model_dir: Path) -> Iterator[ThreadedReferenceServer]:
    """The shared reference engine, served from a thread of the test process.

    In-process, it starts in well under a second (a subprocess pays torch/transformers imports
    again); ``test_reference_server.py::test_cli_subprocess_serves`` covers the real CLI process.
    """
    with reference_server_in_thread(
        tiny_model_dir, extra_args=["--seed", "0", "--context-length", "4096"]
    ) as server:
        yield server


@pytest.fixture(scope="session")
def engine(request: pytest.FixtureRequest) -> EngineUnderTest:
    url = os.environ.get(ENGINE_URL_ENV)
    if url:
        model_dir = os.environ.get(ENGINE_MODEL_ENV)
        if not model_dir:
            raise pytest.UsageError(
                f"{ENGINE_URL_ENV} needs {ENGINE_MODEL_ENV} (the served model dir)"
            )
        return EngineUnderTest(url.rstrip("/"), "sglang", Path(model_dir))
    server: ThreadedReferenceServer = request.getfixturevalue("reference_server")
    return EngineUnderTest(server.url, "reference", request.getfixturevalue("tiny_model_dir"))


@pytest.fixture(scope="session")
def engine_tokenizer(engine: EngineUnderTest) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(engine.model_dir))
