"""The scripts of deploy/ (no package: they run as ``python deploy/NAME.py``) as modules."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.support.paths import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"


def load(name: str) -> ModuleType:
    """Import ``deploy/<name>.py`` once (as ``swerl_deploy_<name>``) and return it."""
    module_name = f"swerl_deploy_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, DEPLOY / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module
