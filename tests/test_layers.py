"""The layer rule of ``services/__init__.py``, checked on every module's imports (an AST walk).

Imports inside functions count, and so do ``importlib.import_module("...")`` calls with a literal
name: a lazy import is still a dependency. Each violation names the importing module, the file
and line, the imported name and the rule it breaks.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.paths import REPO_ROOT

PLANES = ("adapter", "sandbox_worker", "trainer")
# Modules that start or combine planes: they may import anything; only composers import them.
# services.eval: the evaluation script (sandbox_worker's grading behind a CLI); `swerl eval` in the
# base runs it as a child process (python -m services.eval), never importing it.
COMPOSERS = (
    "services.demo",
    "services.demo_objective",
    "services.local_stack",
    "services.eval",
    "services.toy_train",
    "services.toy_train_job",
    "services.swe_train",
)
CHECKED = (*PLANES, "services")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    path: Path
    line: int
    name: str  # the imported module (``from a.b import c`` gives ``a.b`` and ``a.b.c``)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """Resolve ``from ..x import y`` inside ``module`` to an absolute module name."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, name] if name else base)


def imports_of(root: Path, path: Path) -> Iterator[Import]:
    module = module_name(root, path)
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                source = _absolute(module, is_package, node.level, node.module)
            names = [source, *(f"{source}.{alias.name}" for alias in node.names)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        for name in names:
            yield Import(module, path, node.lineno, name)


def layer(module: str) -> str:
    """``composer``, a plane's name, ``base`` (the rest of services), or ``other``."""
    if any(module == c or module.startswith(c + ".") for c in COMPOSERS):
        return "composer"
    top = module.split(".")[0]
    if top in PLANES:
        return top
    return "base" if top == "services" else "other"


def broken_rule(imp: Import) -> str | None:
    source, target = layer(imp.module), layer(imp.name)
    if source == "composer" or target in ("other", source):
        return None
    if target == "composer":
        return "nothing but a composer imports a composer"
    if source == "base" and target in PLANES:
        return "the shared base imports no plane"
    if source in PLANES and target in PLANES:
        return "a plane imports no other plane (share it through the base)"
    return None


def violations(root: Path) -> list[str]:
    """One line per offending import statement (its first offending name)."""
    found: dict[tuple[Path, int], str] = {}
    for package in CHECKED:
        for path in sorted((root / package).rglob("*.py")):
            for imp in imports_of(root, path):
                rule = broken_rule(imp)
                if rule and (path, imp.line) not in found:
                    where = f"{path.relative_to(root)}:{imp.line}"
                    found[path, imp.line] = f"{imp.module} ({where}) imports {imp.name}: {rule}"
    return sorted(found.values())


def test_no_module_breaks_the_layer_rule() -> None:
    found = violations(REPO_ROOT)
    assert not found, "layer rule (services/__init__.py) broken:\n" + "\n".join(found)


def test_the_walk_sees_every_package_and_the_composers_exist() -> None:
    modules = {
        module_name(REPO_ROOT, p) for pkg in CHECKED for p in (REPO_ROOT / pkg).rglob("*.py")
    }
    assert set(COMPOSERS) <= modules, "a composer moved: update COMPOSERS and services/__init__"
    for package in CHECKED:
        assert package in modules
    assert "services.protocol.trajectory" in modules  # subpackages are walked


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_names_each_kind_of_violation(tmp_path: Path) -> None:
    init = {f"{p}/__init__.py": "" for p in CHECKED}
    _write(
        tmp_path,
        {
            **init,
            "services/queue/__init__.py": "",
            "services/queue/keys.py": "def f():\n    from adapter.app import create_app\n",
            "services/config.py": "import importlib\nimportlib.import_module('trainer.data')\n",
            "services/store/__init__.py": "from . import keys\n",
            "services/store/keys.py": "from .. import demo\n",
            "adapter/app.py": "import services.demo\n",
            "trainer/data.py": "from sandbox_worker.tasks import scripted\n",
            "sandbox_worker/worker.py": "from . import config\nfrom services.protocol import x\n",
            "services/demo.py": "import adapter.app, trainer.data\n",
        },
    )
    assert violations(tmp_path) == [
        "adapter.app (adapter/app.py:1) imports services.demo: "
        "nothing but a composer imports a composer",
        "services.config (services/config.py:2) imports trainer.data: "
        "the shared base imports no plane",
        "services.queue.keys (services/queue/keys.py:2) imports adapter.app: "
        "the shared base imports no plane",
        "services.store.keys (services/store/keys.py:1) imports services.demo: "
        "nothing but a composer imports a composer",
        "trainer.data (trainer/data.py:1) imports sandbox_worker.tasks: "
        "a plane imports no other plane (share it through the base)",
    ]
