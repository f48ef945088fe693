"""SWE-Gym's repositories get the eval script of SWE-Gym's fork of the harness: for one row
of each repository the fork specifies and SWE-bench does not, swerl's script is the fork's
own (recorded by generate_swegym_specs.py from the fork's make_eval_script_list) plus the
output markers around the test command and the exit-status capture that grading needs; mypy's
tests are selected by their [case ...] names; the fork's parsers are used, pydantic's equal to
the fork's on a recorded map. Fixtures: tests/data/swegym_specs/README.md."""

from __future__ import annotations

import json

import pytest

from sandbox_worker.evaluation.constants import (
    END_TEST_OUTPUT,
    START_TEST_OUTPUT,
    TEST_EXIT_CODE,
    TEST_EXIT_CODE_VAR,
)
from sandbox_worker.evaluation.log_parser import SWEGYM_PARSERS
from sandbox_worker.evaluation.specs import (
    harness_eval_script,
    harness_parser_name,
    is_swegym_repo,
    known_repos,
    spec_for,
)
from services.protocol.instance import SWEInstance
from tests.support.paths import TEST_DATA

FIXTURES = TEST_DATA / "swegym_specs"
ROWS = {
    row["instance_id"]: row
    for row in map(json.loads, (FIXTURES / "rows.jsonl").read_text().splitlines())
}
ADDED = (f": '{START_TEST_OUTPUT}'", f": '{END_TEST_OUTPUT}'", f"{TEST_EXIT_CODE_VAR}=$?")
STATUS_ECHO = f'echo "{TEST_EXIT_CODE}: ${TEST_EXIT_CODE_VAR}"'


def without_grading_lines(script: str) -> str:
    """The script less the markers and the exit-status lines swerl adds for grading."""
    lines = [line for line in script.split("\n") if line not in (*ADDED, STATUS_ECHO)]
    return "\n".join(lines)


def test_a_fixture_row_per_repository_only_swegym_specifies() -> None:
    repos = {row["repo"] for row in ROWS.values()}
    assert len(repos) == 12 and all(is_swegym_repo(r) for r in repos)
    assert {p.stem for p in (FIXTURES / "scripts").glob("*.sh")} == set(ROWS)
    assert not is_swegym_repo("django/django")  # SWE-bench's own specs win
    assert "getmoto/moto" in known_repos() and "django/django" in known_repos()


@pytest.mark.parametrize("instance_id", sorted(ROWS))
def test_the_script_is_the_forks_with_the_grading_markers(instance_id: str) -> None:
    inst = SWEInstance.model_validate(ROWS[instance_id])
    ours = harness_eval_script(inst)
    recorded = (FIXTURES / "scripts" / f"{instance_id}.sh").read_text()
    assert without_grading_lines(ours) == recorded
    lines = ours.split("\n")
    start, end = lines.index(ADDED[0]), lines.index(ADDED[1])
    test_command = lines[start + 1]
    assert end == start + 3 and lines[start + 2] == ADDED[2]  # the command, then its status
    assert test_command.startswith(spec_for(inst.repo, inst.version).test_cmd)
    if inst.repo == "python/mypy":
        assert test_command.endswith('-k "testEmptyFile or testNewThing or testOther"')
    else:
        assert test_command.endswith(".py") and ".json" not in test_command


def test_parsers_follow_the_fork() -> None:
    moto = SWEInstance.model_validate(next(r for r in ROWS.values() if r["repo"] == "getmoto/moto"))
    assert harness_parser_name(moto) == "parse_log_pytest"
    pydantic = next(r for r in ROWS.values() if r["repo"] == "pydantic/pydantic")
    assert harness_parser_name(SWEInstance.model_validate(pydantic)) == "parse_log_pytest_pydantic"


def test_the_pydantic_parser_equals_the_forks() -> None:
    """On a log in pydantic's format (classic console style, FAILED [ NN%] lines, colour
    codes), the status map the fork's parser made (recorded), quirks included."""
    recorded = json.loads((FIXTURES / "parsed.json").read_text())
    assert recorded
    for name, want in recorded.items():
        got = SWEGYM_PARSERS["parse_log_pytest_pydantic"]((FIXTURES / "logs" / name).read_text())
        assert got == want, name
    assert want["tests/test_main.py::test_ultra_simple_missing"] == "FAILED"
    assert want["tests/test_types.py::test_color"] == "PASSED"  # behind colour codes
