"""Test infrastructure: the files a patch may not change, per repository, and their restoration.

A model patch is graded on the tests the instance defines, run the way the repository runs
them at its base commit. Files that decide *how* tests are collected, configured, imported or
reported are test infrastructure, not code under test: hook files (every ``conftest.py``), ini
files (``pytest.ini``, ``tox.ini``, ``setup.cfg``, ``pyproject.toml``), interpreter start-up files
(``sitecustomize.py``, ``usercustomize.py``, ``*.pth``), package metadata that declares plugins
(``*.dist-info``, ``*.egg-info``), compiled bytecode, everything in the test directories, any
symbolic link the patch creates, and a new module that would shadow the standard library or
pytest (file and directory patterns match in any letter case: ``X.DIST-INFO`` is found by
``importlib.metadata`` as a plugin's metadata; ``pytest.py`` at the repository root wins over
the installed pytest for ``python -m pytest``).

After the patch is applied, every such file it added, changed or deleted is **restored** to its
state at the base (new ones removed, changed or deleted ones brought back), and the evaluation
reports each restored path with the reason. Restoring (rather than rejecting the patch) is the
SWE-bench rule generalised: the harness already restores the files the test patch touches and
grades the rest of the patch; a legitimate fix that also edited, say, a linter section of
``setup.cfg`` keeps its reward, a fix that relied on changed test infrastructure loses it.

What is infrastructure depends on the repository (django's own ``django/test/`` package and
sympy's ``sympy/testing/`` are library code and fix targets; pytest's tests live in
``testing/`` and its ``src/_pytest/`` is code under test): :data:`REPO_RULES` holds the
per-repository rules, :data:`DEFAULT_RULE` applies to the others, and the evaluation config may
override both. A file the instance's gold patch changes is never protected: the reference fix
defines what a fix may touch.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

# Modules a new file may not shadow: the standard library and what pytest imports.
_REMOVED_STDLIB = ("asynchat", "asyncore", "distutils", "imp", "smtpd")  # still in 3.11 envs
PYTEST_MODULES = (
    "pytest",
    "_pytest",
    "py",
    "pluggy",
    "iniconfig",
    "packaging",
    "tomli",
    "exceptiongroup",
    "attr",
    "attrs",
    "more_itertools",
    "atomicwrites",
    "colorama",
    "six",
    "setuptools",
    "pkg_resources",
    "_distutils_hack",
    "importlib_metadata",
    "zipp",
    "typing_extensions",
    "pytest_*",
    "_swerl*",
    "swerl_report_*",
)
SHADOWED_MODULES: tuple[str, ...] = tuple(
    sorted({*sys.stdlib_module_names, *_REMOVED_STDLIB, *PYTEST_MODULES})
)
_MODULE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd")


class TestInfraRule(BaseModel):
    """Which paths of a repository are test infrastructure (fnmatch patterns)."""

    __test__ = False  # not a pytest test class
    model_config = ConfigDict(frozen=True, extra="forbid")

    # A path with a directory component matching one of these is protected.
    protected_dirs: tuple[str, ...] = (
        "test",
        "tests",
        "testing",
        "e2e",
        "__pycache__",
        ".pytest_cache",
        "*.dist-info",
        "*.egg-info",
    )
    # A path whose file name matches one of these is protected.
    protected_names: tuple[str, ...] = (
        "conftest.py",
        "pytest.ini",
        ".pytest.ini",
        "tox.ini",
        "setup.cfg",
        "pyproject.toml",
        "sitecustomize.py",
        "usercustomize.py",
        "*.pth",
        "*.egg-link",
        "test_*.py",
        "*_test.py",
        "*.pyc",
        "*.pyo",
    )
    # Whole repository-relative paths that are protected (runners outside test directories).
    protected_paths: tuple[str, ...] = ()
    # Paths never protected even if a pattern above matches (runner code that is a fix target).
    allowed_paths: tuple[str, ...] = ()
    protect_symlinks: bool = True  # a symlink the patch creates or changes
    shadowed_modules: tuple[str, ...] = SHADOWED_MODULES  # new modules in non-package dirs

    def reason(self, path: str, is_symlink: bool) -> str | None:
        """Why ``path`` (repository-relative, ``/``-separated) is protected, or None."""
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in self.allowed_paths):
            return None
        if is_symlink and self.protect_symlinks:
            return "symlink"
        parts = path.split("/")
        for part in parts[:-1]:
            if _matches(part, self.protected_dirs):
                return f"in a protected directory ({part}/)"
        if _matches(parts[-1], self.protected_names):
            return f"protected file name ({parts[-1]})"
        if _matches(path, self.protected_paths):
            return "protected runner path"
        return None

    def shadow_reason(self, path: str, is_package_dir: PackageDirs) -> str | None:
        """Why a *new* ``path`` shadows an installed module, or None."""
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in self.allowed_paths):
            return None
        parts = path.split("/")
        for depth, part in enumerate(parts):
            parent = "/".join(parts[:depth])
            if is_package_dir(parent):
                continue  # inside a package: a submodule, not a top-level module
            last = depth == len(parts) - 1
            if last and not part.endswith(_MODULE_SUFFIXES):
                continue
            module = part.split(".", 1)[0]
            if any(fnmatch.fnmatchcase(module, pattern) for pattern in self.shadowed_modules):
                return f"shadows the module {module!r}"
        return None


class PackageDirs:
    """``is_package_dir(dir)``: does the tree after the patch hold ``dir/__init__.py``?"""

    def __init__(self, files: Iterable[str]) -> None:
        self._packages = {f[: -len("/__init__.py")] for f in files if f.endswith("/__init__.py")}
        self._root_is_package = "__init__.py" in files

    def __call__(self, directory: str) -> bool:
        return self._root_is_package if directory == "" else directory in self._packages


def _matches(name: str, patterns: Iterable[str]) -> bool:
    """Case-insensitive: ``importlib.metadata`` finds ``X.DIST-INFO`` and a case-insensitive
    filesystem opens ``CONFTEST.PY``; a protected pattern must not be dodged by letter case."""
    folded = name.casefold()
    return any(fnmatch.fnmatchcase(folded, pattern.casefold()) for pattern in patterns)


DEFAULT_RULE = TestInfraRule()

REPO_RULES: dict[str, TestInfraRule] = {
    # django/test/ is the test framework shipped to users (often fixed); the suite is tests/,
    # run by tests/runtests.py with the settings module tests/test_sqlite.py.
    "django/django": TestInfraRule(protected_dirs=("tests", "__pycache__", "*.egg-info")),
    # sympy/testing/ (runtests.py) is library code; bin/test and bin/doctest are the runners.
    "sympy/sympy": TestInfraRule(
        protected_dirs=("tests", "__pycache__", "*.egg-info"),
        protected_paths=("bin/test", "bin/doctest"),
    ),
    # pytest tests itself from testing/; src/_pytest/ is the code under test (no pattern
    # matches it; a new src/pytest*.py module is a fix, not a shadow of the installed pytest).
    "pytest-dev/pytest": TestInfraRule(
        protected_dirs=("testing", "__pycache__", "*.egg-info", "*.dist-info"),
        allowed_paths=("src/_pytest/*", "src/pytest/*"),
    ),
}


def rule_for(repo: str, overrides: Mapping[str, TestInfraRule] | None = None) -> TestInfraRule:
    """The rule of ``repo``: a configured override, else the built-in one, else the default."""
    if overrides and repo in overrides:
        return overrides[repo]
    if overrides and "*" in overrides:
        return REPO_RULES.get(repo, overrides["*"])
    return REPO_RULES.get(repo, DEFAULT_RULE)


@dataclass(frozen=True)
class TreeState:
    """The working tree's non-directory entries: repository-relative path -> find's type
    letter (``f`` file, ``l`` symlink, ...)."""

    entries: dict[str, str]

    @classmethod
    def parse(cls, listing: bytes) -> TreeState:
        """Parse ``find . ! -type d -printf '%y\\0%p\\0'`` output."""
        fields = listing.split(b"\0")
        if fields and fields[-1] == b"":
            fields.pop()
        if len(fields) % 2:
            raise ValueError("malformed tree listing (odd number of fields)")
        entries = {}
        for kind, raw in zip(fields[0::2], fields[1::2], strict=True):
            path = raw.decode("utf-8", "surrogateescape")
            entries[path[2:] if path.startswith("./") else path] = kind.decode()
        return cls(entries)


@dataclass
class RestorePlan:
    """What to undo: ``remove`` (rm -rf), then ``checkout`` (tracked, from the base commit)
    and ``extract`` (untracked at the base, from the snapshot); ``reasons`` per path."""

    remove: list[str] = field(default_factory=list)
    checkout: list[str] = field(default_factory=list)
    extract: list[str] = field(default_factory=list)
    reasons: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.reasons)


def protected_at_base(before: TreeState, rule: TestInfraRule) -> list[str]:
    """Paths of the base tree the rule protects (the candidates for a snapshot)."""
    return sorted(
        path for path, kind in before.entries.items() if rule.reason(path, kind == "l") is not None
    )


def plan_restore(
    before: TreeState,
    after: TreeState,
    *,
    tracked: set[str],
    changed_tracked: set[str],
    changed_untracked: set[str],
    rule: TestInfraRule,
    exempt: set[str],
) -> RestorePlan:
    """The protected paths the patch added, changed or deleted, and how to restore each.

    ``changed_tracked``: tracked paths whose content differs from the base commit (``git diff
    --name-only``); ``changed_untracked``: untracked-at-base paths whose content changed;
    ``exempt``: paths the gold patch changes (never protected).
    """
    new = set(after.entries) - set(before.entries)
    gone = set(before.entries) - set(after.entries)
    retyped = {
        p for p in set(before.entries) & set(after.entries) if before.entries[p] != after.entries[p]
    }
    touched = new | gone | retyped | changed_tracked | changed_untracked
    packages = PackageDirs(after.entries)
    plan = RestorePlan()
    for path in sorted(touched - exempt):
        is_symlink = after.entries.get(path) == "l" or before.entries.get(path) == "l"
        reason = rule.reason(path, is_symlink)
        if reason is None and path in new:
            reason = rule.shadow_reason(path, packages)
        if reason is None:
            continue
        plan.reasons[path] = reason
        if path in after.entries:
            plan.remove.append(path)
        if path in tracked:
            plan.checkout.append(path)
        elif path in before.entries:
            plan.extract.append(path)
    return plan
