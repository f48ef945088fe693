"""Benchmarks are scripts, not a package: load one of ``bench/`` as a module by its name."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from tests.support.paths import REPO_ROOT


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
