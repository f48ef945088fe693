"""tests/data/instances.jsonl is built from tests/data/instances/*/ and agrees with them."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from sandbox_worker.evaluation.patches import patched_files
from sandbox_worker.tasks import mini

RECORDS = {
    json.loads(line)["instance_id"]: json.loads(line)
    for line in mini.INSTANCES_JSONL.read_text().splitlines()
}
SOURCES = {source.instance_id: source for source in mini.read_sources()}


def test_sources_and_file_hold_the_same_instances() -> None:
    assert sorted(RECORDS) == sorted(SOURCES)
    assert len(RECORDS) >= 8
    assert list(RECORDS) == sorted(RECORDS)  # the file is sorted by instance id
    for instance_id in RECORDS:
        assert instance_id.startswith("swerl__")


@pytest.mark.parametrize("instance_id", sorted(SOURCES))
def test_record_matches_its_source(instance_id: str) -> None:
    built = mini.build_record(SOURCES[instance_id], python=None)
    stored = RECORDS[instance_id]
    assert {k: v for k, v in stored.items() if k not in ("FAIL_TO_PASS", "PASS_TO_PASS")} == built
    assert json.loads(stored["FAIL_TO_PASS"])
    assert list(stored) == [  # SWE-bench's field set
        "repo",
        "instance_id",
        "base_commit",
        "patch",
        "test_patch",
        "problem_statement",
        "hints_text",
        "created_at",
        "version",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
        "environment_setup_commit",
    ]


def test_gold_patches_never_touch_tests_and_test_patches_only_touch_tests() -> None:
    for source in SOURCES.values():
        for patched in patched_files(source.patch):
            assert not patched.target.startswith("tests/"), source.instance_id
        for patched in patched_files(source.test_patch):
            assert patched.target.startswith("tests/"), source.instance_id


@pytest.mark.slow  # runs an instance's test suite
def test_test_lists_are_recomputed_identically() -> None:
    source = SOURCES["swerl__tinyini-3"]
    built = mini.build_record(source, python=sys.executable)
    assert built["FAIL_TO_PASS"] == RECORDS[source.instance_id]["FAIL_TO_PASS"]
    assert built["PASS_TO_PASS"] == RECORDS[source.instance_id]["PASS_TO_PASS"]


TRIVIAL_TEST = (  # adds one test that already passes at base
    "diff --git a/tests/test_text.py b/tests/test_text.py\n"
    "--- a/tests/test_text.py\n+++ b/tests/test_text.py\n"
    "@@ -1,6 +1,10 @@\n import pytest\n \n"
    " from strkit import count_words, normalize_whitespace, slugify, truncate\n"
    "+\n+\n+def test_trivial():\n+    assert True\n"
    " \n \n def test_normalize_whitespace():\n"
)


@pytest.mark.slow  # runs instances' test suites
def test_builder_refuses_invalid_instances() -> None:
    strkit1, strkit2 = SOURCES["swerl__strkit-1"], SOURCES["swerl__strkit-2"]
    touching_tests = dataclasses.replace(strkit1, patch=strkit1.patch + strkit1.test_patch)
    with pytest.raises(mini.BuildError, match="touches test file"):
        mini.build_record(touching_tests, python=sys.executable)
    wrong_fix = dataclasses.replace(strkit1, patch=strkit2.patch)
    with pytest.raises(mini.BuildError, match="with the gold patch these tests fail"):
        mini.build_record(wrong_fix, python=sys.executable)
    nothing_fails = dataclasses.replace(strkit1, test_patch=TRIVIAL_TEST)
    with pytest.raises(mini.BuildError, match="no test that fails before"):
        mini.build_record(nothing_fails, python=sys.executable)
    with pytest.raises(mini.BuildError, match="no test results"):
        mini.build_record(strkit1, python="/bin/false")


def test_check_mode_reports_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = SOURCES["swerl__tinyini-2"]
    monkeypatch.setattr(mini, "read_sources", lambda: [source])
    # The real build is covered above; here only main's file handling is under test.
    monkeypatch.setattr(mini, "build_record", lambda src, python: RECORDS[src.instance_id])
    out = tmp_path / "instances.jsonl"
    assert mini.main(["--output", str(out), "--check"]) == 1  # missing file
    assert mini.main(["--output", str(out)]) == 0
    assert json.loads(out.read_text()) == RECORDS["swerl__tinyini-2"]
    assert mini.main(["--output", str(out), "--check"]) == 0
    out.write_text(out.read_text().replace("getboolean", "get_boolean"))
    assert mini.main(["--output", str(out), "--check"]) == 1


def test_incomplete_source_directory(tmp_path: Path) -> None:
    (tmp_path / "swerl__x-1").mkdir()
    (tmp_path / "swerl__x-1" / "meta.json").write_text('{"repo": "swerl/strkit"}')
    with pytest.raises(mini.BuildError, match="incomplete instance source"):
        mini.read_sources(tmp_path)
