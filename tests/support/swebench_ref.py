"""swebench 5.0.2's own functions, loaded for comparison tests only.

swebench is installed ``--no-deps`` (a dev dependency): its package ``__init__`` files import
docker, datasets, modal ..., so the packages are registered bare and only the stdlib-only
modules compared with swerl's re-implementations are loaded. ``swebench.harness.utils`` imports
``datasets`` for its dataset loaders (not used here): when the real package is absent, a
stand-in with those three names is registered for that one import and removed right after.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from types import ModuleType

from sandbox_worker.evaluation.constants import SWEBENCH_VERSION


def _register_bare(name: str, path: Path) -> None:
    if name not in sys.modules:
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package


def load() -> dict[str, ModuleType]:
    import swebench

    assert swebench.__version__ == SWEBENCH_VERSION, "compare against the version we follow"
    _register_bare("swebench.harness", Path(swebench.__file__).parent / "harness")
    return {
        "grading": importlib.import_module("swebench.harness.grading"),
        "parsers": importlib.import_module("swebench.harness.log_parsers"),
        "parsers_py": importlib.import_module("swebench.harness.log_parsers.python"),
        "types": importlib.import_module("swebench.types"),
        "utils": importlib.import_module("swebench.utils"),
        "harness_utils": _harness_utils(),
    }


def _harness_utils() -> ModuleType:
    try:
        importlib.import_module("datasets")
        return importlib.import_module("swebench.harness.utils")
    except ImportError:
        pass
    stub = types.ModuleType("datasets")
    stub.Dataset = stub.load_dataset = stub.load_from_disk = None  # type: ignore[attr-defined]
    sys.modules["datasets"] = stub
    try:
        return importlib.import_module("swebench.harness.utils")
    finally:
        del sys.modules["datasets"]
