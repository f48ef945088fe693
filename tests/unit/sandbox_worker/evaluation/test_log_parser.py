"""Every log parser against swebench 5.0.2's own, and the grade of each recorded log against
swebench's ``get_eval_report`` (fixtures: tests/data/swebench_logs, sources in its README)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_worker.evaluation import grading
from sandbox_worker.evaluation.log_parser import (
    DEFAULT_PARSER,
    PARSERS,
    REPO_PARSERS,
    parser_name_for,
)
from tests.support import eval_logs, swebench_ref
from tests.support.paths import TEST_DATA

SWE = swebench_ref.load()
LOGS_DIR = TEST_DATA / "swebench_logs"
CASES: dict[str, dict] = json.loads((LOGS_DIR / "cases.json").read_text())
LOGS = {path.stem: path.read_text() for path in sorted(LOGS_DIR.glob("*.log"))}
# The pytest-format logs of the older comparison tests too: every parser sees every format.
ALL_LOGS = {**LOGS, **{f"pytest-{name}": text for name, text in eval_logs.ALL_LOGS.items()}}
VERIFIED_REPOS = {
    "astropy/astropy",
    "django/django",
    "matplotlib/matplotlib",
    "mwaskom/seaborn",
    "pallets/flask",
    "psf/requests",
    "pydata/xarray",
    "pylint-dev/pylint",
    "pytest-dev/pytest",
    "scikit-learn/scikit-learn",
    "sphinx-doc/sphinx",
    "sympy/sympy",
}


def test_every_case_has_a_log_and_every_log_a_case() -> None:
    assert set(CASES) == set(LOGS)
    # One log at least for each format the Verified repositories use.
    formats = {PARSERS[REPO_PARSERS[case["repo"]]] for case in CASES.values()}
    assert formats == {PARSERS[REPO_PARSERS[repo]] for repo in VERIFIED_REPOS}


def test_parser_names_are_swebench_python_parsers() -> None:
    theirs = {name for name in SWE["parsers"].PARSER_REGISTRY if name in vars(SWE["parsers_py"])}
    assert set(PARSERS) == theirs


def test_repository_registry_matches_swebench() -> None:
    theirs = SWE["parsers_py"].MAP_REPO_TO_PARSER_PY
    assert set(REPO_PARSERS) == set(theirs)
    assert set(REPO_PARSERS) >= VERIFIED_REPOS
    for repo, name in REPO_PARSERS.items():
        # Aliases share one function: compare the function each name resolves to.
        assert SWE["parsers"].PARSER_REGISTRY[name] is theirs[repo], repo


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_parser_matches_swebench_on_every_log(name: str) -> None:
    theirs = SWE["parsers"].PARSER_REGISTRY[name]
    for log_name, text in ALL_LOGS.items():
        assert PARSERS[name](text) == theirs(text, None), (name, log_name)


def test_parser_choice() -> None:
    assert parser_name_for("django/django") == "parse_log_django"
    assert parser_name_for("sympy/sympy", "parse_log_pytest") == "parse_log_pytest"
    assert parser_name_for("someone/own-repo") == DEFAULT_PARSER
    with pytest.raises(ValueError, match="unknown log parser 'parse_log_cargo'"):
        parser_name_for("x/y", "parse_log_cargo")


def _spec(instance_id: str, case: dict, parser: str) -> object:
    return SWE["types"].TestSpec(
        instance_id=instance_id,
        image="img",
        eval_script_list=[],
        repo=case["repo"],
        version="0",
        FAIL_TO_PASS=case["FAIL_TO_PASS"],
        PASS_TO_PASS=case["PASS_TO_PASS"],
        log_parser=parser,
        eval_type="pass_and_fail",
    )


@pytest.mark.parametrize("instance_id", sorted(CASES))
def test_grade_matches_get_eval_report(instance_id: str, tmp_path: Path) -> None:
    case = CASES[instance_id]
    name = parser_name_for(case["repo"])
    path = tmp_path / "test_output.txt"
    path.write_text(LOGS[instance_id])
    theirs = SWE["grading"].get_eval_report(
        _spec(instance_id, case, name),
        {"instance_id": instance_id, "model_patch": "diff", "model_name_or_path": "m"},
        str(path),
        include_tests_status=True,
    )[instance_id]
    status_map, valid = grading.get_logs_eval(LOGS[instance_id], PARSERS[name])
    assert valid == theirs["patch_successfully_applied"]
    ours = grading.get_eval_tests_report(status_map, case["FAIL_TO_PASS"], case["PASS_TO_PASS"])
    tests_status = theirs["tests_status"]
    assert ours.f2p_success == tests_status["FAIL_TO_PASS"]["success"]
    assert ours.f2p_failure == tests_status["FAIL_TO_PASS"]["failure"]
    assert ours.p2p_success == tests_status["PASS_TO_PASS"]["success"]
    assert ours.p2p_failure == tests_status["PASS_TO_PASS"]["failure"]
    resolved = grading.resolution_status(ours) is grading.ResolvedStatus.FULL
    assert resolved == theirs["resolved"]
