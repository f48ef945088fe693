"""Fixtures of the SGLang conformance tier (docs/sglang-conformance.md).

* ``sglang`` -- SGLang 0.5.23 imported once per session (about 9 s; the tier's only import of it);
* ``model_dir`` / ``model_dir_seed1`` -- the tiny model, and other weights for it (what a
  refresh loads);
* ``engine`` -- ``engine(**options)`` is an async context manager: SGLang's server in this
  process (:class:`tests.conformance.sglang_app.SGLangEngine`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conformance import sglang_app
from tests.conformance.sglang_app import EngineOptions, SGLangEngine, import_sglang
from tests.support.engines import tiny_model_path


@pytest.fixture(scope="session")
def sglang() -> SimpleNamespace:
    return import_sglang()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model_path(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def model_dir_seed1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Other random weights, same tokenizer and architecture: what a refresh loads."""
    return tiny_model_path(tmp_path_factory.mktemp("tiny-seed1"), seed=1)


EngineFactory = Callable[..., SGLangEngine]


@pytest.fixture
def engine(sglang: SimpleNamespace, model_dir: Path) -> EngineFactory:
    """``async with engine(max_running_requests=1, step_delay_s=0.01) as e:``"""

    def make(**options: Any) -> SGLangEngine:
        return SGLangEngine(EngineOptions(model_dir=model_dir, **options))

    return make


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if sglang_app.IMPORT_SECONDS is not None:
        terminalreporter.write_line(
            f"SGLang {sglang_app.SGLANG_VERSION} (conformance tier) imported in "
            f"{sglang_app.IMPORT_SECONDS:.1f} s"
        )
