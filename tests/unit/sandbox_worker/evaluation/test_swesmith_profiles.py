"""SWE-smith rows graded as SWE-smith's harness grades them: each repository profile's test
command and log parser (sandbox_worker/evaluation/swesmith_profiles.py), against what
swesmith 0.0.9's own ``get_test_cmd`` and ``log_parser`` gave (recorded by
``generate_swesmith_profiles.py`` into tests/data/swesmith_profiles/), and one row through the
whole evaluation in harness mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandbox_worker.evaluation import EvalConfig, evaluate_patch
from sandbox_worker.evaluation import swesmith_profiles as profiles
from sandbox_worker.evaluation.log_parser import HARNESS_PARSERS
from sandbox_worker.evaluation.specs import harness_parser_name
from services.protocol.instance import SWEInstance
from tests.support.paths import REPO_ROOT
from tests.unit.sandbox_worker.test_task_state import smith  # noqa: F401 (fixture)

FIXTURES = REPO_ROOT / "tests" / "data" / "swesmith_profiles"
PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


def row(**fields: object) -> SWEInstance:
    values = {"problem_statement": "p", "patch": PATCH, "FAIL_TO_PASS": ["t.py::t"]}
    values |= {"PASS_TO_PASS": [], **fields}
    values.pop("base_commit", None)
    return SWEInstance(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "recorded", json.loads((FIXTURES / "commands.json").read_text()), ids=lambda r: r["row"]["repo"]
)
def test_the_test_command_is_swesmiths(recorded: dict) -> None:
    instance = row(**{**recorded["row"], "patch": PATCH})
    if recorded["test_command"].endswith(" -k"):  # SWE-smith's own: -k with no expression
        with pytest.raises(profiles.UngradableRowError, match="no -k expression") as refused:
            profiles.profile_test_command(instance)
        assert instance.instance_id in str(refused.value)
        assert isinstance(refused.value, profiles.UnknownProfileError)  # callers' one error
    else:
        assert profiles.profile_test_command(instance) == recorded["test_command"]


@pytest.mark.parametrize(
    "recorded", json.loads((FIXTURES / "commands.json").read_text()), ids=lambda r: r["row"]["repo"]
)
def test_the_test_files_are_swesmiths(recorded: dict) -> None:
    """The files SWE-smith's harness hides and reverts (``get_test_files``)."""
    instance = row(**{**recorded["row"], "patch": PATCH})
    assert [*profiles.profile_test_files(instance)] == recorded["test_files"]


def test_the_recorded_rows_cover_each_command_rule() -> None:
    """The parity above checks mypy's rule both ways and the unittest profiles' commands."""
    recorded = json.loads((FIXTURES / "commands.json").read_text())
    table = json.loads(profiles.PROFILES_PATH.read_text())["repos"]
    mypy = [
        r
        for r in recorded
        if table[r["row"]["repo"].removeprefix("swesmith/")]["test_cmd_rule"]
        == "k_test_patch_cases"
    ]
    assert {r["test_command"].endswith(" -k") for r in mypy} == {True, False}
    assert any(r["row"].get("instance_ref") for r in mypy if r["test_command"].endswith(" -k"))
    rules = {table[r["row"]["repo"].removeprefix("swesmith/")]["test_files_rule"] for r in recorded}
    assert rules == set(profiles.FILE_RULES)  # every test-file rule checked against swesmith


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("not a mapping", "instance_ref must be a mapping"),
        ({"test_patch": 3}, "instance_ref.test_patch must be a string"),
        ({"test_patch": "[case testA]\n[case test$B]\n"}, "'test\\$B' .* double quotes"),
        ({"test_patch": '[case testA]\n[case test"B]\n'}, "double quotes"),
    ],
)
def test_a_mypy_reference_swesmith_would_mishandle_is_refused(ref: object, message: str) -> None:
    key = "python__mypy.e93f06ce"
    instance = row(instance_id=f"{key}.pr_1", repo=f"swesmith/{key}", instance_ref=ref)
    with pytest.raises(profiles.UngradableRowError, match=message):
        profiles.profile_test_command(instance)


@pytest.mark.parametrize("log", sorted(json.loads((FIXTURES / "parsed.json").read_text())))
def test_the_log_parsers_are_swesmiths(log: str) -> None:
    recorded = json.loads((FIXTURES / "parsed.json").read_text())[log]
    key = recorded["profile"]
    instance = row(instance_id=f"{key}.lm_rewrite__x", repo=f"swesmith/{key}")
    parser = harness_parser_name(instance)
    assert parser.startswith("swesmith_")
    got = HARNESS_PARSERS[parser]((FIXTURES / "logs" / log).read_text())
    assert got == recorded["status_map"] and got  # the same map, quirks included


def test_every_profile_is_reproduced_or_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    table = json.loads(profiles.PROFILES_PATH.read_text())["repos"]
    for key in table:
        instance = row(instance_id=f"{key}.func_pm__x", repo=f"swesmith/{key}")
        profile = profiles.profile_for(instance)  # swesmith 0.0.9: every profile reproduced
        assert profile.log_parser in HARNESS_PARSERS
        conda = profile.test_cmd.startswith("source /opt/miniconda3/bin/activate; conda activate")
        assert conda or key.startswith("pydantic__")  # pydantic's profile runs uv
    assert len(table) == 133
    key = "pallets__click.fde47b4b"
    for field in ("test_cmd_rule", "test_files_rule", "log_parser"):
        value = "own:Acme"
        own = {"source": "t", "repos": {key: {**table[key], field: value}}}
        monkeypatch.setattr(profiles, "_table", lambda own=own: own)
        instance = row(instance_id=f"{key}.func_pm__x", repo=f"swesmith/{key}")
        with pytest.raises(profiles.UnknownProfileError, match=f"{key} .*in code of its own"):
            profiles.profile_for(instance)
    monkeypatch.undo()
    unknown = row(instance_id="acme__tool.0123abcd.func_pm__x", repo="swesmith/acme__tool.0123abcd")
    with pytest.raises(profiles.UnknownProfileError, match="no SWE-smith profile for 'acme__tool"):
        profiles.profile_for(unknown)


@pytest.mark.slow  # runs the instance's tests three times
def test_a_row_is_graded_with_its_profile_in_harness_mode(
    smith: tuple[SWEInstance, dict[str, Path]],  # noqa: F811 (the imported fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Harness mode: the task state, then the profile's command (min_testing: the graded
    files) and its verbose-line parser. The mini row's repository stands for a profile whose
    command is SWE-smith's default without the conda activation (no conda here)."""
    from sandbox_worker.testing.local_sandbox import LocalDirBackend

    row_, images = smith
    key = profiles.profile_key(row_)
    command = "python3 -m pytest --disable-warnings --color=no --tb=no --verbose"
    table = {"source": "test", "repos": {key: {
        "test_cmd": command, "min_testing": True, "timeout": 90, "log_parser": "swesmith_pytest",
        "test_cmd_rule": "test_files", "test_files_rule": "pytest_ids",
    }}}  # fmt: skip
    monkeypatch.setattr(profiles, "_table", lambda: table)
    backend = LocalDirBackend(images, tmp_path / "scratch")
    config = EvalConfig(
        workdir=str(tmp_path / "testbed"),
        scratch_dir=str(tmp_path / "scratch"),
        eval_script="harness",
        grading="swebench",
        log_parser="auto",
        test_timeout_s=120,
    )

    def grade(patch: str):
        return evaluate_patch(backend, row_, patch, "snapshot", node="n", config=config)

    gold = grade(row_.gold_patch)
    assert gold.infra_error is None and gold.resolved and gold.reward == 1.0, gold.log_tail
    assert gold.tests_status  # read by the verbose-line parser: pytest's -rA summary is off
    empty = grade("")
    assert empty.infra_error is None and not empty.resolved and empty.reward == 0.0
    monkeypatch.setattr(profiles, "_table", lambda: {"source": "test", "repos": {}})
    unknown = grade(row_.gold_patch)  # no profile: an infrastructure failure, not a 0
    assert unknown.reward is None and "no SWE-smith profile" in (unknown.infra_error or "")
