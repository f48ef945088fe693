"""Canaries planted in the test files' source: invisible to forgers, harmless to honest runs.

The slow tests run real pytest (the host venv's, with the structured-report plugin) on planted
files and grade both status maps the evaluation grades: the structured report's and the
official log parser's.
"""

from __future__ import annotations

import ast
import os
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandbox_worker.evaluation.canaries import CanaryPlan, check_canaries, plant_canaries
from sandbox_worker.evaluation.log_parser import parse_log_pytest
from sandbox_worker.evaluation.patches import directives_of_test_patch
from sandbox_worker.evaluation.structured_report import parse_structured_report
from services.protocol.instance import SWEInstance
from tests.support.paths import REPO_ROOT

PLUGIN = REPO_ROOT / "sandbox_worker/evaluation/pytest_report_plugin.py"

BUGGY = """def clamp(value, low, high):
    return max(low, min(value, high + 1))


def words(text):
    return text.split(" ")


def mean(values):
    return sum(values) / len(values)
"""
FIXED = BUGGY.replace("high + 1", "high").replace('split(" ")', "split()")

FUNCS = '''"""Tests of textops: functions, fixtures, parametrize, a class, code after the tests."""
import functools

import pytest

from textops import clamp, mean, words

LIMITS = [(5, 0, 10, 5), (-3, 0, 10, 0)]


@pytest.fixture
def sample():
    return [1, 2, 3, 4]


def slow(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


def test_mean_of_sample(sample):
    assert mean(sample) == 2.5


@pytest.mark.parametrize(
    "value, low, high, expected",
    LIMITS + [(15, 0, 10, 10)],
    ids=["inside", "below", "above"],
)
def test_clamp(value, low, high, expected):
    result = clamp(value, low, high)
    assert result == expected, "clamp(%r)" % value


@slow
def test_words_simple():
    assert words("a b") == ["a", "b"]


# Several spaces between words are one separator.
def test_words_many_spaces():
    parts = words("a  b")
    assert len(parts) == 2


def test_words_returns_early():
    for word in words("x y"):
        if word == "x":
            return
    raise AssertionError("no x")


def test_words_in_try():
    try:
        parts = words("p  q")
    except ValueError:
        parts = []
    assert parts == ["p", "q"]


class TestClampClass:
    def test_clamp_high(self):
        assert clamp(99, 0, 10) == 10

    def test_clamp_none_if_high(self):
        assert clamp(99, 0, 10) is not None

    def test_clamp_low(self):
        assert clamp(-1, 0, 10) == 0


def test_mean_raises():
    with pytest.raises(ZeroDivisionError):
        mean([])


CONSTANT_AFTER_TESTS = 3


def helper_not_a_test():
    return CONSTANT_AFTER_TESTS


if __name__ == "__main__":
    pytest.main([__file__])
'''

UNIT = """import unittest

from textops import clamp, words


class WordsTest(unittest.TestCase):
    def setUp(self):
        self.text = "alpha  beta"

    def test_words_count(self):
        self.assertEqual(len(words(self.text)), 2)

    def test_words_second(self):
        second = words(self.text)[1]
        assert second == "beta"

    @unittest.skipIf(False, "never skipped")
    def test_clamp_inside(self):
        assert clamp(5, 0, 10) == 5


if __name__ == "__main__":
    unittest.main()
"""

# Tabs and CRLF line ends: planted code must follow them.
TABS = (
    "import pytest\r\n\r\nfrom textops import mean\r\n\r\n\r\nclass TestMean:\r\n"
    "\tdef test_mean_two(self):\r\n\t\tassert mean([1, 3]) == 2\r\n\r\n"
    "\tdef test_mean_one(self):\r\n\t\tassert mean([4]) == 4\r\n"
)
BROKEN = "def test_broken(:\n    pass\n"

SOURCES = {
    "tests/test_funcs.py": FUNCS,
    "tests/test_unit.py": UNIT,
    "tests/test_tabs.py": TABS,
    "tests/test_broken.py": BROKEN,
}
FAIL_TO_PASS = [
    "tests/test_funcs.py::test_clamp[above]",
    "tests/test_funcs.py::test_words_many_spaces",
    "tests/test_funcs.py::test_words_returns_early",  # has a return: never mutated
    "tests/test_funcs.py::test_words_in_try",  # has a try: never mutated
    "tests/test_funcs.py::TestClampClass::test_clamp_high",
    "tests/test_unit.py::WordsTest::test_words_count",  # ends with self.assertEqual
    "tests/test_unit.py::WordsTest::test_words_second",
    "tests/test_tabs.py::TestMean::test_mean_two",
    "tests/test_broken.py::test_broken",
]
RUN_FILES = ["tests/test_funcs.py", "tests/test_unit.py", "tests/test_tabs.py"]
NOT_MUTABLE = {
    "tests/test_funcs.py::test_words_returns_early",
    "tests/test_funcs.py::test_words_in_try",
    "tests/test_unit.py::WordsTest::test_words_count",
}


def _defs(text: str) -> dict[tuple[str, ...], ast.FunctionDef]:
    """Every function of the module and of its classes, by (class..., name)."""
    found: dict[tuple[str, ...], ast.FunctionDef] = {}

    def walk(body: list[ast.stmt], outer: tuple[str, ...]) -> None:
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef):
                found[(*outer, stmt.name)] = stmt
            elif isinstance(stmt, ast.ClassDef):
                walk(stmt.body, (*outer, stmt.name))

    walk(ast.parse(text).body, ())
    return found


def _key(nodeid: str) -> tuple[str, tuple[str, ...]]:
    path, *rest = nodeid.split("[")[0].split("::")
    return path, tuple(rest)


def _plans(count: int = 40) -> list[CanaryPlan]:
    return [plant_canaries(SOURCES, FAIL_TO_PASS, random.Random(seed)) for seed in range(count)]


# --- planting (no subprocess) ---------------------------------------------------------------


def test_planting_keeps_every_test_and_adds_exactly_the_planted_ones() -> None:
    for plan in _plans():
        assert plan.problem is None and len(plan.canaries) == 3
        assert "tests/test_broken.py" not in plan.files  # does not parse: nothing planted
        added = [_key(c) for c in plan.canaries] + [_key(m) for _, m in plan.mutations]
        for path, source in SOURCES.items():
            if path not in plan.files:
                continue
            before, after = _defs(source), _defs(plan.files[path])
            new = {name for p, name in added if p == path}
            assert set(before) <= set(after)  # every original test keeps its node id
            assert set(after) - set(before) == new
            for name in before:  # ... and its very source
                assert ast.dump(before[name]) == ast.dump(after[name])


def test_planted_code_follows_the_files_layout() -> None:
    seen_tabs = seen_class = seen_module = False
    for plan in _plans():
        if "tests/test_tabs.py" in plan.files:
            text = plan.files["tests/test_tabs.py"]
            assert text.count("\n") == text.count("\r\n")  # CRLF kept
            assert not re.search(r"^ +\S", text, re.MULTILINE)  # tabs only
            seen_tabs = True
        for canary in plan.canaries:
            names = _key(canary)[1]
            seen_class |= len(names) == 2
            seen_module |= len(names) == 1
    assert seen_tabs and seen_class and seen_module


def _planted_sources(plan: CanaryPlan) -> list[tuple[str, str]]:
    """(name, source without the scope's indentation) of each always-failing canary."""
    result = []
    for canary in plan.canaries:
        path, names = _key(canary)
        node = _defs(plan.files[path])[names]
        lines = plan.files[path].splitlines()[node.lineno - 1 : node.end_lineno]
        indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
        result.append((names[-1], "\n".join(line[len(indent) :] for line in lines) + "\n"))
    return result


def test_canaries_look_like_the_files_own_tests() -> None:
    shapes = set()
    for plan in _plans():
        for canary in plan.canaries:
            path, names = _key(canary)
            assert path in {"tests/test_funcs.py", "tests/test_unit.py", "tests/test_tabs.py"}
            originals = [n[-1] for n in _defs(SOURCES[path]) if n[:-1] == names[:-1]]
            first_word = names[-1].split("_")[:2]  # "test", then a word of a real test
            assert any(o.split("_")[:2] == first_word for o in originals), canary
        for name, source in _planted_sources(plan):
            assert not re.search(r"\d", name), name  # no random token, hex or otherwise
            assert name not in SOURCES[plan.canaries[0].split("::")[0]]
            assert "assert False" not in source and "canary" not in source.lower()
            tree = ast.parse(source)
            assert not any(isinstance(n, ast.JoinedStr | ast.NamedExpr) for n in ast.walk(tree))
            shapes.add(re.sub(r"\w+|\d+|\"[^\"]*\"", "x", source.split(":", 1)[1]))
    assert len(shapes) >= 6, shapes  # the bodies vary in shape, not only in values


def test_canary_bodies_always_fail() -> None:
    """Each canary's body, run as written (names it reads bound to stand-ins), fails."""
    for plan in _plans(60):
        for name, source in _planted_sources(plan):
            space: dict[str, object] = {"clamp": abs, "mean": len, "words": str.split}
            exec(source, space)
            args = (FakeTestCase(),) if "(self)" in source else ()
            with pytest.raises(AssertionError):
                space[name](*args)  # type: ignore[operator]


class FakeTestCase:
    """The ``self.assert*`` a canary in a ``unittest.TestCase`` may call."""

    def assertEqual(self, a: object, b: object) -> None:
        assert a == b

    def assertTrue(self, a: object) -> None:
        assert a

    def assertFalse(self, a: object) -> None:
        assert not a

    def assertIsNotNone(self, a: object) -> None:
        assert a is not None


def test_mutants_invert_only_the_last_assertion_of_plain_tests() -> None:
    mutated: set[str] = set()
    for plan in _plans():
        for original, mutant in plan.mutations:
            assert original not in NOT_MUTABLE
            mutated.add(original)
            path, names = _key(original)
            _, mutant_names = _key(mutant)
            assert mutant_names[:-1] == names[:-1]  # same class (or module)
            orig = _defs(plan.files[path])[names]
            copy = _defs(plan.files[path])[mutant_names]
            dump = ast.dump
            assert [dump(d) for d in copy.decorator_list] == [dump(d) for d in orig.decorator_list]
            assert [dump(s) for s in copy.body[:-1]] == [dump(s) for s in orig.body[:-1]]
            last, inverted = orig.body[-1], copy.body[-1]
            assert isinstance(last, ast.Assert) and isinstance(inverted, ast.Assert)
            assert _inverse(last.test, inverted.test), ast.unparse(inverted)
    assert mutated == {
        "tests/test_funcs.py::test_clamp",  # parametrized: the base id
        "tests/test_funcs.py::test_words_many_spaces",
        "tests/test_funcs.py::TestClampClass::test_clamp_high",
        "tests/test_unit.py::WordsTest::test_words_second",
        "tests/test_tabs.py::TestMean::test_mean_two",
    }


def _inverse(test: ast.expr, inverted: ast.expr) -> bool:
    if isinstance(inverted, ast.UnaryOp) and isinstance(inverted.op, ast.Not):
        return ast.dump(inverted.operand) == ast.dump(test)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return ast.dump(test.operand) == ast.dump(inverted)
    pairs = {(ast.Is, ast.IsNot), (ast.IsNot, ast.Is), (ast.In, ast.NotIn), (ast.NotIn, ast.In)}
    return (
        isinstance(test, ast.Compare)
        and isinstance(inverted, ast.Compare)
        and (type(test.ops[0]), type(inverted.ops[0])) in pairs
        and ast.dump(test.left) == ast.dump(inverted.left)
    )


ASSERT_FORMS = """def test_is_none():
    assert value is None


def test_not_in():
    assert value not in items


def test_not():
    assert not value


def test_wrapped():
    assert (value ==
            other)


def test_message():
    assert value == other, "differ: %r" % (value,)


def test_call():
    assert check(
        value,
    )


def test_bool_op():
    assert value or other
"""


def test_every_assertion_form_is_inverted_exactly() -> None:
    """Whatever the values, the copy's last condition is false exactly when the original's
    is true (an honest run passing the original must fail the copy)."""
    names = [n[0] for n in _defs(ASSERT_FORMS)]
    f2p = ["t.py::" + n for n in names]
    plan = plant_canaries({"t.py": ASSERT_FORMS}, f2p, random.Random(1), max_mutants=len(f2p))
    assert sorted(o for o, _ in plan.mutations) == sorted(f2p)
    planted = _defs(plan.files["t.py"])
    for original, mutant in plan.mutations:
        orig = planted[_key(original)[1]].body[-1]
        copy = planted[_key(mutant)[1]].body[-1]
        assert isinstance(orig, ast.Assert) and isinstance(copy, ast.Assert)
        assert ast.dump(orig.msg) == ast.dump(copy.msg) if orig.msg else copy.msg is None
        for value, other, items in ((None, 1, [None]), (0, 0, []), (3, 4, [3]), ("", "", [])):
            space = {"value": value, "other": other, "items": items, "check": bool}
            truth = eval(compile(ast.Expression(orig.test), "o", "eval"), space)
            assert bool(eval(compile(ast.Expression(copy.test), "c", "eval"), space)) != bool(truth)


CRAMPED = """class TestA:
    def test_one(self):
        assert 1
def test_two():
    assert 2
"""


def test_blocks_at_one_line_keep_their_scopes() -> None:
    """A class's last line followed at once by a module-level test: the class's new methods
    go above the module's new functions (below them they would join a function's body)."""
    f2p = ["t.py::TestA::test_one", "t.py::test_two"]
    for seed in range(30):
        plan = plant_canaries({"t.py": CRAMPED}, f2p, random.Random(seed), count=8)
        assert len(plan.canaries) == 8 and len(plan.mutations) == 2, seed
        assert set(_defs(CRAMPED)) < set(_defs(plan.files["t.py"]))


def test_no_canary_without_a_parsable_fail_to_pass_file() -> None:
    rng = random.Random(0)
    broken = plant_canaries(SOURCES, ["tests/test_broken.py::test_broken"], rng)
    assert broken.problem is not None and broken.problem.startswith("canary_unavailable")
    assert not broken.files and not broken.canaries
    assert check_canaries({}, broken) == broken.problem  # the caller cannot trust the run
    elsewhere = plant_canaries(SOURCES, ["tests/test_other.py::test_x"], rng)
    assert elsewhere.problem is not None and "canary_unavailable" in elsewhere.problem
    # Node ids from another runner's format (django's "test (module.Class)") plant nothing.
    other = plant_canaries(SOURCES, ["test_words (tests.test_unit.WordsTest)"], rng)
    assert other.problem is not None
    with pytest.raises(ValueError, match="count"):
        plant_canaries(SOURCES, FAIL_TO_PASS, rng, count=0)


def test_pytest3_node_ids_keep_their_format() -> None:
    plan = plant_canaries(
        {"tests/test_funcs.py": FUNCS},
        ["tests/test_funcs.py::TestClampClass::()::test_clamp_high"],
        random.Random(3),
        count=6,
    )
    in_class = [c for c in plan.canaries if "TestClampClass" in c]
    assert in_class and all(
        c.startswith("tests/test_funcs.py::TestClampClass::()::") for c in in_class
    )
    assert plan.mutations[0][0] == "tests/test_funcs.py::TestClampClass::()::test_clamp_high"


# --- checking (no subprocess) ---------------------------------------------------------------

PLAN = CanaryPlan(
    files={},
    canaries=["t.py::test_a_empty"],
    mutations=[("t.py::test_b", "t.py::test_b_twice")],
)
ABBREVIATIONS = {"c": "t.py::test_a_empty", "o": "t.py::test_b", "m": "t.py::test_b_twice"}


@pytest.mark.parametrize(
    ("statuses", "problem"),
    [
        ({"c": "FAILED", "o": "PASSED", "m": "FAILED"}, None),
        ({"c": "ERROR", "o": "PASSED", "m": "ERROR"}, None),
        # The original failed (not fixed): its copy may pass, nothing to say.
        ({"c": "FAILED", "o": "FAILED", "m": "PASSED"}, None),
        ({"c": "FAILED"}, None),  # neither ran (the patch broke the file: F2P fails anyway)
        ({"c": "PASSED", "o": "PASSED", "m": "FAILED"}, "passed: forged"),
        ({"o": "PASSED", "m": "FAILED"}, "missing: removed"),
        ({"c": "XFAIL"}, "XFAIL: removed"),
        ({"c": "SKIPPED"}, "SKIPPED: removed"),
        ({"c": "FAILED", "o": "PASSED", "m": "PASSED"}, "inverted copy"),
        ({"c": "FAILED", "o": "PASSED"}, "did not fail (missing)"),
        ({"c": "FAILED", "o": "PASSED", "m": "XFAIL"}, "inverted copy"),
        ({"c": "FAILED", "o[x]": "PASSED", "o[y]": "PASSED", "m[x]": "FAILED", "m[y]": "PASSED"},
         "test_b[y] passed"),
        # Each id is paired with the copy's same id; a plain id does not stand for "[x]".
        ({"c": "FAILED", "o[x]": "PASSED", "o[y]": "FAILED", "m[x]": "FAILED", "m[y]": "PASSED",
          "m": "PASSED"}, None),
        # Ids made from objects' reprs differ between the copies: counted, not matched.
        ({"c": "FAILED", "o[<o 0x1>]": "PASSED", "m[<o 0x2>]": "FAILED"}, None),
        ({"c": "FAILED", "o[<o 0x1>]": "PASSED", "m[<o 0x2>]": "PASSED"}, "missing"),
        # A test whose name merely starts like the original's is not one of its ids.
        ({"c": "FAILED", "o_other": "PASSED"}, None),
    ],
)  # fmt: skip
def test_check_canaries(statuses: dict[str, str], problem: str | None) -> None:
    status_map = {ABBREVIATIONS[k[0]] + k[1:]: v for k, v in statuses.items()}
    found = check_canaries(status_map, PLAN)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found, found


# --- real pytest runs -----------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    returncode: int
    stdout: str
    structured: dict[str, str]
    log: dict[str, str]


def _pytest(root: Path, files: list[str], env_extra: dict[str, str] | None = None) -> Run:
    """``pytest -rA`` on ``files`` in ``root`` with the report plugin (as the evaluation runs
    it: from a directory outside the repository)."""
    plugin_dir = root.parent / (root.name + "-plugin")
    shutil.rmtree(plugin_dir, ignore_errors=True)
    plugin_dir.mkdir()
    (plugin_dir / "swerl_report_q7.py").write_bytes(PLUGIN.read_bytes())
    env = {
        **os.environ,
        "PYTHONPATH": str(plugin_dir),
        "PYTEST_ADDOPTS": "-p swerl_report_q7",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        **(env_extra or {}),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *files],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = parse_structured_report((plugin_dir / "report.jsonl").read_text(), run.returncode)
    assert report.problem is None, run.stdout
    return Run(run.returncode, run.stdout, report.status_map, parse_log_pytest(run.stdout))


def _suite(root: Path, code: str, plan: CanaryPlan | None, conftest: str | None = None) -> Path:
    shutil.rmtree(root, ignore_errors=True)
    (root / "tests").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\n")  # the rootdir, as a repository has one
    (root / "textops.py").write_text(code)
    for rel, text in {**SOURCES, **(plan.files if plan else {})}.items():
        (root / rel).write_bytes(text.encode())
    if conftest is not None:
        (root / "conftest.py").write_text(conftest)
    return root


def _originals(status_map: dict[str, str], plan: CanaryPlan) -> dict[str, str]:
    planted = [*plan.canaries, *(m for _, m in plan.mutations)]
    return {k: v for k, v in status_map.items() if k.split("[")[0] not in planted}


@pytest.mark.slow  # runs pytest in subprocesses
def test_honest_runs_pass_the_check_and_keep_every_result(tmp_path: Path) -> None:
    for code in (BUGGY, FIXED):
        plain = _pytest(_suite(tmp_path / "plain", code, None), RUN_FILES)
        assert plain.structured == plain.log
        for seed in range(3):
            plan = plant_canaries(SOURCES, FAIL_TO_PASS, random.Random(seed))
            run = _pytest(_suite(tmp_path / f"s{seed}", code, plan), RUN_FILES)
            for status_map in (run.structured, run.log):
                assert check_canaries(status_map, plan) is None, run.stdout
                assert _originals(status_map, plan) == plain.log  # the tests' own results
    fixed_f2p = {k: v for k, v in plain.log.items() if k in FAIL_TO_PASS}
    assert set(fixed_f2p.values()) == {"PASSED"} and len(fixed_f2p) == len(FAIL_TO_PASS) - 1


FORGE = """import inspect
import os
import re

import pytest


def _name(item):
    return getattr(item, "originalname", None) or item.name.split("[")[0]


def should_forge(item):
{rule}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and should_forge(item):
        report.outcome = "passed"
        report.longrepr = None
"""
RULES = {
    # Every failure becomes a pass.
    "everything": "    return True",
    # Spare what the old canary looked like: tests whose name is not in their module's source.
    "named_in_source": (
        "    with open(str(item.fspath)) as handle:\n        return _name(item) in handle.read()"
    ),
    # Spare random-looking names (a hex token) ...
    "not_hex": '    return not re.search(r"[0-9a-f]{8,}|_[0-9a-f]{4,}$", _name(item))',
    # ... or bodies that fail on purpose.
    "not_assert_false": (
        "    source = inspect.getsource(item.function)\n"
        '    return "assert False" not in source and "canary" not in source.lower()'
    ),
    # Spare even the exact canaries (told by the test): the mutation canaries still catch it.
    "knows_the_canaries": '    return _name(item) not in os.environ["KNOWN"].split(",")',
}


@pytest.mark.slow  # runs pytest in subprocesses
@pytest.mark.parametrize("rule", sorted(RULES))
def test_forgers_are_caught(tmp_path: Path, rule: str) -> None:
    plan = plant_canaries(SOURCES, FAIL_TO_PASS, random.Random(7))
    assert plan.mutations  # the oracle forger is caught by these
    known = ",".join(c.rsplit("::", 1)[1] for c in plan.canaries)
    conftest = FORGE.replace("{rule}", RULES[rule])
    run = _pytest(_suite(tmp_path / "s", BUGGY, plan, conftest), RUN_FILES, {"KNOWN": known})
    for status_map in (run.structured, run.log):
        # The forgery works on the instance's own tests (the bug is not fixed) ...
        assert status_map["tests/test_funcs.py::test_words_many_spaces"] == "PASSED", run.stdout
        assert status_map["tests/test_unit.py::WordsTest::test_words_second"] == "PASSED"
        # ... and not on the canaries.
        problem = check_canaries(status_map, plan)
        assert problem is not None and "forged" in problem, run.stdout
        if rule == "knows_the_canaries":  # every canary failed: the copies caught it
            assert all(status_map[c] == "FAILED" for c in plan.canaries)
            assert "inverted copy" in problem


@pytest.mark.slow  # runs pytest in subprocesses
def test_skipping_the_tests_named_in_source_is_caught(tmp_path: Path) -> None:
    """Skip every test whose name is in its module's source (the old canary's was not)."""
    conftest = (
        "import pytest\n\n\ndef pytest_collection_modifyitems(items):\n"
        "    for item in items:\n"
        "        name = getattr(item, 'originalname', None) or item.name.split('[')[0]\n"
        "        with open(str(item.fspath)) as handle:\n"
        "            if name in handle.read():\n"
        "                item.add_marker(pytest.mark.skip(reason='spared'))\n"
    )
    plan = plant_canaries(SOURCES, FAIL_TO_PASS, random.Random(8))
    run = _pytest(_suite(tmp_path / "s", BUGGY, plan, conftest), RUN_FILES)
    for status_map in (run.structured, run.log):
        problem = check_canaries(status_map, plan)
        assert problem is not None and "removed" in problem


def _mini_checkout(template: Path, dest: Path, *patches: str) -> None:
    shutil.copytree(template, dest, symlinks=True)
    for patch in patches:
        subprocess.run(["git", "apply", "-"], cwd=dest, input=patch, text=True, check=True)


@pytest.mark.slow  # runs pytest in subprocesses on every mini instance
def test_mini_set_gold_passes_and_a_forged_base_is_caught(
    templates: dict[str, Path], mini_instances: dict[str, SWEInstance], tmp_path: Path
) -> None:
    for number, (iid, inst) in enumerate(sorted(mini_instances.items())):
        files = directives_of_test_patch(inst.test_patch)
        gold = tmp_path / iid / "gold"
        _mini_checkout(templates[inst.repo.split("/")[1]], gold, inst.test_patch, inst.patch)
        plain = _pytest(gold, files)
        sources = {f: (gold / f).read_text() for f in files}
        plan = plant_canaries(sources, inst.FAIL_TO_PASS, random.Random(number))
        assert plan.problem is None
        for rel, text in plan.files.items():
            (gold / rel).write_text(text)
        run = _pytest(gold, files)
        for status_map in (run.structured, run.log):
            assert check_canaries(status_map, plan) is None, (iid, run.stdout)
            assert _originals(status_map, plan) == plain.log, iid
            assert all(status_map[t] == "PASSED" for t in inst.FAIL_TO_PASS + inst.PASS_TO_PASS)
        base = tmp_path / iid / "base"
        _mini_checkout(templates[inst.repo.split("/")[1]], base, inst.test_patch)
        for rel, text in plan.files.items():
            (base / rel).write_text(text)
        (base / "conftest.py").write_text(FORGE.replace("{rule}", RULES["everything"]))
        forged = _pytest(base, files)
        for status_map in (forged.structured, forged.log):
            assert all(status_map.get(t) == "PASSED" for t in inst.FAIL_TO_PASS), iid
            assert check_canaries(status_map, plan) is not None, iid
