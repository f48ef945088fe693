"""The harness's eval script and parser for each row shape, against the harness itself.

Published rows (no ``eval_script``): the older harness's scripts for the fixture rows were
recorded by ``sandbox_worker/evaluation/generate_swebench_specs.py --eval-scripts`` (swebench
4.1.0); swebench 5.0.2's ``make_test_spec`` then turns such a script into the one it runs.
Rows that carry ``eval_script``: 5.0.2's ``make_test_spec`` on the row itself. Fixture sources:
tests/data/swebench_verified/README.md.
"""

from __future__ import annotations

import gzip
import json

import pytest

from sandbox_worker.evaluation.log_parser import PARSERS, REPO_PARSERS
from sandbox_worker.evaluation.row_grading import row_grading
from sandbox_worker.evaluation.specs import (
    UnknownSpecError,
    harness_eval_script,
    harness_parser_name,
    harness_test_directives,
    spec_for,
    specs_source,
)
from services.datasets import load_instances
from services.protocol.instance import SWEInstance
from tests.support import swebench_ref
from tests.support.paths import TEST_DATA

SWE = swebench_ref.load()
FIXTURES = TEST_DATA / "swebench_verified"
ROWS = {
    json.loads(line)["instance_id"]: json.loads(line)
    for line in (FIXTURES / "rows.jsonl").read_text().splitlines()
}
# The same rows through the dataset loader, as a run would read the published file.
LOADED = {inst.instance_id: inst for inst in load_instances(FIXTURES / "rows.jsonl")}
INDEX = [json.loads(line) for line in (FIXTURES / "index.jsonl").read_text().splitlines()]
VERIFIED_REPOS = {entry["repo"] for entry in INDEX}


def _swebench_502_script(row: dict, eval_script: str) -> str:
    """The script swebench 5.0.2 runs for ``row`` carrying ``eval_script``."""
    shaped = {
        **row,
        "eval_script": eval_script,
        "image": "img",
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
    }
    return SWE["harness_utils"].make_test_spec(shaped).eval_script


def test_one_fixture_row_per_verified_repository() -> None:
    assert {row["repo"] for row in ROWS.values()} == VERIFIED_REPOS
    assert len(VERIFIED_REPOS) == 12
    assert {path.stem for path in (FIXTURES / "eval_scripts").glob("*.sh")} == set(ROWS)


@pytest.mark.parametrize("instance_id", sorted(ROWS))
def test_published_row_gets_the_harness_script(instance_id: str) -> None:
    row = ROWS[instance_id]
    recorded = (FIXTURES / "eval_scripts" / f"{instance_id}.sh").read_text()
    ours = harness_eval_script(LOADED[instance_id])
    assert ours == _swebench_502_script(row, recorded)
    assert "SWEBENCH_TEST_EXIT_CODE=$?" in ours  # 5.0.2 records the test command's status


@pytest.mark.parametrize(
    "instance_id", ["django__django-11099", "sympy__sympy-20590", "pylint-dev__pylint-7080"]
)
def test_row_with_eval_script_uses_it(instance_id: str) -> None:
    row = ROWS[instance_id]
    own = (
        "#!/bin/bash\nset -uxo pipefail\ncd /testbed\nexport CUSTOM=1\n"
        ": '>>>>> Start Test Output'\nmake check TESTS='a b'\n: '>>>>> End Test Output'\n"
        "git checkout HEAD -- tests\n"
    )
    ours = harness_eval_script(SWEInstance.model_validate({**row, "eval_script": own}))
    assert ours == _swebench_502_script(row, own)
    assert "make check TESTS='a b'" in ours


def test_row_with_eval_script_without_end_marker_is_left_unchanged() -> None:
    row = ROWS["psf__requests-2317"]
    own = "#!/bin/bash\nset -uxo pipefail\npytest -rA\n"
    ours = harness_eval_script(SWEInstance.model_validate({**row, "eval_script": own}))
    assert ours == _swebench_502_script(row, own)
    assert "SWEBENCH_TEST_EXIT_CODE" not in ours


def test_every_published_verified_row_is_graded_as_the_harness_grades_it() -> None:
    """The published SWE-bench Verified file itself (500 rows, as a user would point swerl at
    it): every row loads, and by default (``auto``) gets exactly the harness's eval script --
    5.0.2's ``make_test_spec`` over the older harness's script recorded for that row -- and
    the parser 5.0.2 maps its repository to."""
    import pyarrow.parquet as pq

    published = FIXTURES / "test-00000-of-00001.parquet"
    loaded = load_instances(published)  # strict: the first bad row would raise
    assert {inst.instance_id for inst in loaded} == {entry["instance_id"] for entry in INDEX}
    rows = {row["instance_id"]: row for row in pq.read_table(published).to_pylist()}
    with gzip.open(FIXTURES / "eval_scripts_all.jsonl.gz", "rt") as f:
        recorded = {e["instance_id"]: e["eval_script"] for e in map(json.loads, f)}
    assert set(recorded) == set(rows)
    repo_parsers = SWE["parsers_py"].MAP_REPO_TO_PARSER_PY
    wrong_script, wrong_parser = [], []
    for inst in loaded:
        chosen = row_grading(inst, "auto", "auto", "auto")
        assert (chosen.eval_script, chosen.grading) == ("harness", "swebench"), inst.instance_id
        expected = _swebench_502_script(rows[inst.instance_id], recorded[inst.instance_id])
        if harness_eval_script(inst) != expected:
            wrong_script.append(inst.instance_id)
        if PARSERS[chosen.log_parser] is not PARSERS[repo_parsers[inst.repo].__name__]:
            wrong_parser.append(inst.instance_id)
    assert not wrong_script and not wrong_parser


def test_every_verified_repository_and_version_has_a_spec() -> None:
    for entry in INDEX:
        spec = spec_for(entry["repo"], entry["version"])
        assert spec.test_cmd, entry
        # The older harness names the function (aliases resolve to e.g. parse_log_pytest_v2).
        assert spec.log_parser is not None
        assert PARSERS[spec.log_parser] is PARSERS[REPO_PARSERS[entry["repo"]]], entry
    assert "swebench==4.1.0" in specs_source()


def test_specs_carry_the_environment_steps() -> None:
    django = spec_for("django/django", "3.0")
    assert django.test_cmd.startswith("./tests/runtests.py --verbosity 2")
    assert "export LANG=en_US.UTF-8" in django.eval_commands
    astropy = spec_for("astropy/astropy", "4.3")
    assert astropy.install and astropy.pre_install
    script = harness_eval_script(SWEInstance.model_validate(ROWS["django__django-11099"]))
    assert "export LANG=en_US.UTF-8\n" in script and "conda activate testbed\n" in script


def test_unknown_repository_or_version_is_a_clear_error() -> None:
    with pytest.raises(UnknownSpecError, match=r"repository 'me/mine'.*eval_script"):
        spec_for("me/mine", "1.0")
    with pytest.raises(UnknownSpecError, match=r"django/django version '0\.1'.*known: "):
        spec_for("django/django", "0.1")
    row = {**ROWS["psf__requests-2317"], "repo": "me/mine"}
    with pytest.raises(UnknownSpecError):
        harness_eval_script(SWEInstance.model_validate(row))


def test_django_directives_are_modules() -> None:
    # The published test patch changes django/test/testcases.py and tests/servers/tests.py.
    row = ROWS["django__django-14011"]
    assert harness_test_directives(row["repo"], row["test_patch"]) == [
        "django.test.testcases",
        "servers.tests",
    ]


def test_new_files_are_directives_but_data_files_are_not() -> None:
    # The published test patch adds four files under tests/roots/ (one of them text.txt).
    row = ROWS["sphinx-doc__sphinx-11510"]
    root = "tests/roots/test-directive-include"
    assert harness_test_directives(row["repo"], row["test_patch"]) == [
        f"{root}/baz/baz.rst",
        f"{root}/conf.py",
        f"{root}/foo.rst",
        "tests/test_directive_other.py",
    ]


def test_parser_follows_the_row_then_the_repository() -> None:
    row = ROWS["sympy__sympy-20590"]
    assert harness_parser_name(SWEInstance.model_validate(row)) == "parse_log_sympy"
    shaped = {**row, "log_parser": "parse_log_pytest"}
    assert harness_parser_name(SWEInstance.model_validate(shaped)) == "parse_log_pytest"
