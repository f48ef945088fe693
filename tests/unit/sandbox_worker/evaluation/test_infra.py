"""The test-infrastructure rule (which paths a patch may not change) and the restore plan."""

from __future__ import annotations

import pytest

from sandbox_worker.evaluation import EvalConfig
from sandbox_worker.evaluation.infra import (
    DEFAULT_RULE,
    PackageDirs,
    TestInfraRule,
    TreeState,
    plan_restore,
    protected_at_base,
    rule_for,
)
from sandbox_worker.evaluation.patches import modified_files, new_files
from services.protocol.instance import SWEInstance


def _reason(repo: str, path: str, *, new: bool = False, files: tuple[str, ...] = ()) -> str | None:
    rule = rule_for(repo)
    reason = rule.reason(path, is_symlink=False)
    if reason is None and new:
        reason = rule.shadow_reason(path, PackageDirs([*files, path]))
    return reason


def test_no_gold_patch_of_the_task_set_touches_protected_files(
    mini_instances: dict[str, SWEInstance],
) -> None:
    """The rule itself (not the gold-patch exemption) lets every reference fix through."""
    checked = 0
    for inst in mini_instances.values():
        for path in modified_files(inst.patch):
            assert _reason(inst.repo, path) is None, (inst.instance_id, path)
            checked += 1
        for path in new_files(inst.patch):
            assert _reason(inst.repo, path, new=True) is None, (inst.instance_id, path)
            checked += 1
        # ... while the test patch's files are all protected.
        for path in modified_files(inst.test_patch) + new_files(inst.test_patch):
            assert _reason(inst.repo, path) is not None, (inst.instance_id, path)
    assert checked >= len(mini_instances)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("conftest.py", "conftest.py"),
        ("pkg/sub/conftest.py", "conftest.py"),
        ("pytest.ini", "pytest.ini"),
        (".pytest.ini", ".pytest.ini"),
        ("tox.ini", "tox.ini"),
        ("setup.cfg", "setup.cfg"),
        ("pyproject.toml", "pyproject.toml"),
        ("sitecustomize.py", "sitecustomize.py"),
        ("src/usercustomize.py", "usercustomize.py"),
        ("evil.pth", "evil.pth"),
        ("pkg/test_x.py", "test_x.py"),
        ("pkg/x_test.py", "x_test.py"),
        ("pkg/mod.pyc", "mod.pyc"),
        ("tests/helpers.py", "tests/"),
        ("tests/__init__.py", "tests/"),
        ("a/b/testing/data.json", "testing/"),
        ("pkg/__pycache__/mod.cpython-311.pyc", "__pycache__/"),
        ("x-1.0.dist-info/entry_points.txt", "x-1.0.dist-info/"),
        ("x.egg-info/entry_points.txt", "x.egg-info/"),
    ],
)
def test_default_rule_protects_infrastructure(path: str, why: str) -> None:
    reason = _reason("someone/project", path)
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    "path",
    ["pkg/core.py", "README.md", "docs/conf.py", "pkg/contest.py", "pkg/testament.py", "setup.py"],
)
def test_default_rule_leaves_source_alone(path: str) -> None:
    assert _reason("someone/project", path) is None
    assert _reason("someone/project", path, new=True) is None


def test_new_modules_that_shadow_pytest_or_the_stdlib() -> None:
    assert "'pytest'" in (_reason("o/p", "pytest.py", new=True) or "")
    assert "'_pytest'" in (_reason("o/p", "_pytest/runner.py", new=True) or "")
    assert "'pluggy'" in (_reason("o/p", "pluggy/__init__.py", new=True) or "")
    assert "'json'" in (_reason("o/p", "scripts/json.py", new=True) or "")
    assert "'pytest_evil'" in (_reason("o/p", "pytest_evil.py", new=True) or "")
    # Inside a package it is a submodule (pkg.json), not a shadow of json.
    assert _reason("o/p", "pkg/json.py", new=True, files=("pkg/__init__.py",)) is None
    assert _reason("o/p", "pkg/sub/typing.py", new=True, files=("pkg/sub/__init__.py",)) is None
    # A data file named like a module is not a module.
    assert _reason("o/p", "scripts/json.txt", new=True) is None


def test_per_repository_rules() -> None:
    # django: django/test/ is the test framework (a fix target); tests/ is the suite and runner.
    assert _reason("django/django", "django/test/testcases.py") is None
    assert _reason("django/django", "tests/runtests.py") is not None
    assert _reason("django/django", "tests/admin_views/tests.py") is not None
    assert _reason("someone/project", "django/test/testcases.py") is not None  # default rule
    # sympy: the runners under bin/ are protected; sympy/testing/ is library code.
    assert _reason("sympy/sympy", "bin/test") is not None
    assert _reason("sympy/sympy", "sympy/testing/runtests.py") is None
    assert _reason("sympy/sympy", "sympy/core/tests/test_basic.py") is not None
    # pytest: src/_pytest/ is the code under test, testing/ its suite.
    assert _reason("pytest-dev/pytest", "src/_pytest/python.py") is None
    assert _reason("pytest-dev/pytest", "src/_pytest/pytester.py", new=True) is None
    assert _reason("pytest-dev/pytest", "testing/test_python.py") is not None
    assert _reason("someone/project", "src/_pytest/python.py", new=True) is not None


def test_configured_rules_override_the_built_in_ones() -> None:
    lenient = TestInfraRule(protected_dirs=(), protected_names=("conftest.py",))
    config = EvalConfig(infra_rules={"django/django": lenient, "*": lenient})
    assert rule_for("django/django", config.infra_rules) is lenient
    assert rule_for("someone/project", config.infra_rules) is lenient
    # A built-in repository rule wins over the "*" default, not over a named override.
    only_default = {"*": lenient}
    assert rule_for("sympy/sympy", only_default).protected_paths == ("bin/test", "bin/doctest")
    assert rule_for("someone/project") is DEFAULT_RULE
    with pytest.raises(ValueError):
        EvalConfig.model_validate({"infra_rules": {"o/p": {"protected_dir": ["x"]}}})


def test_allowed_paths_win() -> None:
    rule = TestInfraRule(allowed_paths=("tests/runtests.py",))
    assert rule.reason("tests/runtests.py", is_symlink=False) is None
    assert rule.reason("tests/other.py", is_symlink=False) is not None


def test_tree_listing_parse() -> None:
    raw = b"f\0./a.py\0l\0./tests\0f\0./caf\xe9/x.py\0"
    tree = TreeState.parse(raw)
    assert tree.entries == {"a.py": "f", "tests": "l", "caf\udce9/x.py": "f"}
    # Undecodable bytes survive the round trip to the restore lists.
    assert "caf\udce9/x.py".encode("utf-8", "surrogateescape") == b"caf\xe9/x.py"
    with pytest.raises(ValueError, match="malformed"):
        TreeState.parse(b"f\0./a.py\0l\0")


def test_restore_plan() -> None:
    before = TreeState(
        {
            "pkg/__init__.py": "f",
            "pkg/core.py": "f",
            "tests/test_core.py": "f",
            "tests/test_other.py": "f",
            "conftest.py": "f",
            "pkg.egg-info/entry_points.txt": "f",
        }
    )
    after = TreeState(
        {
            "pkg/__init__.py": "f",
            "pkg/core.py": "f",  # changed (source: kept)
            "pkg/new.py": "f",  # new source: kept
            "tests/test_core.py": "l",  # replaced by a symlink
            # tests/test_other.py deleted
            "conftest.py": "f",  # changed
            "pkg.egg-info/entry_points.txt": "f",  # untracked, changed
            "pytest.py": "f",  # shadows pytest
            "tests/conftest.py": "f",  # new hook file
            "setup.cfg": "f",  # new, but the gold patch adds it (exempt)
        }
    )
    plan = plan_restore(
        before,
        after,
        tracked={"pkg/__init__.py", "pkg/core.py", "tests/test_core.py", "tests/test_other.py"}
        | {"conftest.py"},
        changed_tracked={"pkg/core.py", "conftest.py", "tests/test_core.py"},
        changed_untracked={"pkg.egg-info/entry_points.txt"},
        rule=DEFAULT_RULE,
        exempt={"setup.cfg"},
    )
    assert set(plan.reasons) == {
        "tests/test_core.py",
        "tests/test_other.py",
        "conftest.py",
        "pkg.egg-info/entry_points.txt",
        "pytest.py",
        "tests/conftest.py",
    }
    assert plan.reasons["tests/test_core.py"] == "symlink"
    removed = ["tests/test_core.py", "conftest.py", "pkg.egg-info/entry_points.txt"]
    removed += ["pytest.py", "tests/conftest.py"]
    assert sorted(plan.remove) == sorted(removed)
    assert sorted(plan.checkout) == ["conftest.py", "tests/test_core.py", "tests/test_other.py"]
    assert plan.extract == ["pkg.egg-info/entry_points.txt"]
    assert protected_at_base(before, DEFAULT_RULE) == [
        "conftest.py",
        "pkg.egg-info/entry_points.txt",
        "tests/test_core.py",
        "tests/test_other.py",
    ]
    untouched = plan_restore(
        before,
        before,
        tracked=set(),
        changed_tracked=set(),
        changed_untracked=set(),
        rule=DEFAULT_RULE,
        exempt=set(),
    )
    assert not untouched and untouched.reasons == {}
