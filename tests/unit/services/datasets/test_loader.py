"""Loading SWE-bench / SWE-Gym / SWE-smith style datasets from JSONL, JSON and parquet."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from services.datasets import DatasetError, load_instances, load_instances_collect
from services.protocol.instance import SWEInstance
from tests.support.paths import TEST_DATA

PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"
TEST_PATCH = "diff --git a/t.py b/t.py\n--- a/t.py\n+++ b/t.py\n@@ -1 +1 @@\n-a\n+b\n"
MINI = TEST_DATA / "instances.jsonl"

# The SWE-bench Hugging Face row form: test lists are JSON-encoded strings.
SWEBENCH_ROW: dict[str, Any] = {
    "repo": "octo/lib",
    "instance_id": "octo__lib-17",
    "base_commit": "a" * 40,
    "patch": PATCH,
    "test_patch": TEST_PATCH,
    "problem_statement": "It breaks.",
    "hints_text": "",
    "created_at": "2024-01-02T03:04:05Z",
    "version": "1.2",
    "FAIL_TO_PASS": '["t.py::test_new"]',
    "PASS_TO_PASS": '["t.py::test_old"]',
    "environment_setup_commit": "b" * 40,
}
# SWE-smith: lists, no base_commit / test_patch / version, extra columns.
SMITH_ROW: dict[str, Any] = {
    "instance_id": "octo__lib.a1b2c3d4.func_pm_op_swap__x1",
    "repo": "swesmith/octo__lib.a1b2c3d4",
    "patch": PATCH,
    "FAIL_TO_PASS": ["t.py::test_new"],
    "PASS_TO_PASS": [],
    "image_name": "jyangballin/swesmith.x86_64.octo_1776_lib.a1b2c3d4",
    "problem_statement": "",
}
REQUIRED = ["instance_id", "repo", "patch", "problem_statement", "FAIL_TO_PASS", "PASS_TO_PASS"]


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_swebench_style_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [SWEBENCH_ROW])
    (inst,) = load_instances(path)
    assert inst.FAIL_TO_PASS == ["t.py::test_new"] and inst.PASS_TO_PASS == ["t.py::test_old"]
    assert inst.base_ref == "a" * 40
    assert inst.to_swebench_dict() == SWEBENCH_ROW


def test_swesmith_style_rows_keep_extras_and_default_base(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [SMITH_ROW, {**SWEBENCH_ROW}])
    smith, bench = load_instances(path)
    assert smith.base_commit is None and smith.base_ref == "HEAD"
    assert smith.test_patch == "" and smith.PASS_TO_PASS == []
    assert smith.model_extra == {"image_name": SMITH_ROW["image_name"]}
    assert bench.instance_id == "octo__lib-17"
    # SWE-smith's patch introduces the bug: the gold patch is its reverse
    assert smith.is_swesmith and not bench.is_swesmith
    assert smith.gold_patch == PATCH.replace("-a\n+b", "-b\n+a") and bench.gold_patch == PATCH


def test_a_swesmith_bug_patch_that_cannot_be_reversed_is_a_row_error(tmp_path: Path) -> None:
    binary = "diff --git a/x.bin b/x.bin\n--- a/x.bin\n+++ b/x.bin\nGIT binary patch\n"
    path = write_jsonl(tmp_path / "d.jsonl", [{**SMITH_ROW, "patch": PATCH + binary}])
    with pytest.raises(DatasetError, match="SWE-smith bug patch must be reversible"):
        load_instances(path)


def test_the_mini_set_loads() -> None:
    instances = load_instances(MINI)
    assert len(instances) >= 8
    assert len({inst.repo for inst in instances}) >= 3
    assert all(inst.FAIL_TO_PASS and inst.base_commit for inst in instances)


def test_blank_lines_and_json_list(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("\n" + json.dumps(SWEBENCH_ROW) + "\n   \n")
    assert len(load_instances(path)) == 1
    listed = tmp_path / "d.json"
    listed.write_text(json.dumps([SWEBENCH_ROW, SMITH_ROW]))
    assert [i.instance_id for i in load_instances(listed)] == [
        SWEBENCH_ROW["instance_id"],
        SMITH_ROW["instance_id"],
    ]


@pytest.mark.parametrize("field", REQUIRED)
def test_each_missing_field_is_named_with_file_and_line(tmp_path: Path, field: str) -> None:
    row = {k: v for k, v in SWEBENCH_ROW.items() if k != field}
    other = {**SWEBENCH_ROW, "instance_id": "octo__lib-1"}
    path = write_jsonl(tmp_path / "d.jsonl", [other, row])
    with pytest.raises(DatasetError) as info:
        load_instances(path)
    message = str(info.value)
    assert message.startswith(f"{path}:line 2")
    assert f"missing required field '{field}'" in message
    if field != "instance_id":
        assert "(instance 'octo__lib-17')" in message


def test_bad_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(SWEBENCH_ROW) + '\n\n{"instance_id": "x",}\n')
    with pytest.raises(DatasetError, match=r"d\.jsonl:line 3: invalid JSON: .*column"):
        load_instances(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(DatasetError, match="line 1: expected a JSON object, got list"):
        load_instances(path)


@pytest.mark.parametrize(
    ("update", "expected"),
    [
        ({"FAIL_TO_PASS": "not json"}, "'FAIL_TO_PASS'.*not a JSON-encoded list"),
        ({"FAIL_TO_PASS": "[]"}, "'FAIL_TO_PASS'.*at least 1 item"),
        ({"PASS_TO_PASS": '["ok", ""]'}, "'PASS_TO_PASS'.*non-empty strings"),
        ({"PASS_TO_PASS": '{"a": 1}'}, "'PASS_TO_PASS'.*valid list"),
        ({"instance_id": "has space"}, "'instance_id'.*pattern"),
        ({"repo": "no-slash"}, "'repo'.*pattern"),
        ({"base_commit": "abc; rm -rf /"}, "'base_commit'.*pattern"),
        ({"patch": ""}, "'patch'.*at least 1 character"),
        ({"patch": "just words"}, "'patch'.*not a unified diff"),
        ({"test_patch": "junk"}, "'test_patch'.*not a unified diff"),
        ({"patch": PATCH[: PATCH.index("-a")]}, "'patch'.*truncated hunk"),
        ({"patch": PATCH.replace("@@ -1 +1 @@", "@@ -x +1 @@")}, "'patch'.*malformed hunk"),
        ({"patch": PATCH.replace("\n-a\n", "\n*a\n")}, "'patch'.*diff line 5: '\\*a' inside"),
        ({"patch": PATCH.replace("+b\n", "+b\n+c\n-d\n")}, "'patch'.*longer than its header"),
        ({"patch": "@@ -1 +1 @@\n-a\n+b\n"}, "'patch'.*hunk before any"),
        ({"problem_statement": 7}, "'problem_statement'.*valid string"),
    ],
    ids=lambda v: v if isinstance(v, str) and len(v) < 20 else None,
)
def test_invalid_fields(tmp_path: Path, update: dict[str, Any], expected: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{**SWEBENCH_ROW, **update}])
    with pytest.raises(DatasetError, match=expected):
        load_instances(path)


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such dataset file"):
        load_instances(tmp_path / "missing.jsonl")
    with pytest.raises(DatasetError, match="unsupported dataset format"):
        load_instances(tmp_path / "data.csv")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DatasetError, match="no instances"):
        load_instances(empty)
    listed = tmp_path / "d.json"
    listed.write_text('{"instances": []}')
    with pytest.raises(DatasetError, match="must be a list"):
        load_instances(listed)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b"\xff\xfe garbage")
    with pytest.raises(DatasetError, match="cannot read"):
        load_instances(latin)


def test_duplicates_and_only(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [SWEBENCH_ROW, SMITH_ROW, SWEBENCH_ROW])
    with pytest.raises(DatasetError, match=r"line 3: duplicate instance_id 'octo__lib-17'.*line 1"):
        load_instances(path)
    path = write_jsonl(tmp_path / "d.jsonl", [SWEBENCH_ROW, SMITH_ROW])
    only = load_instances(path, only=[SMITH_ROW["instance_id"]])
    assert [i.instance_id for i in only] == [SMITH_ROW["instance_id"]]
    with pytest.raises(DatasetError, match="no instance with id 'nope'"):
        load_instances(path, only=["octo__lib-17", "nope"])


def test_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {**SWEBENCH_ROW, "version": 1.2, "created_at": datetime(2024, 1, 2, 3, 4, 5)},
        {
            **SWEBENCH_ROW,
            "instance_id": "octo__lib-18",
            "version": 3.0,
            "created_at": datetime(2024, 2, 1),
        },
    ]
    for row in rows:  # the list-typed columns of SWE-Gym / SWE-smith parquet files
        row["FAIL_TO_PASS"] = json.loads(row["FAIL_TO_PASS"])
        row["PASS_TO_PASS"] = json.loads(row["PASS_TO_PASS"])
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    first, second = load_instances(path)
    assert first.version == "1.2" and second.version == "3.0"
    assert first.created_at == "2024-01-02T03:04:05"
    assert second.FAIL_TO_PASS == ["t.py::test_new"]
    bad = [dict(rows[0]), {k: v for k, v in rows[1].items() if k != "patch"}]
    bad[1]["patch"] = None
    pq.write_table(pa.Table.from_pylist(bad), path)
    with pytest.raises(DatasetError, match=r"row 2 \(instance 'octo__lib-18'\): field 'patch'"):
        load_instances(path)
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match="not a readable parquet file"):
        load_instances(path)


def test_parquet_without_pyarrow_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # makes the import fail
    with pytest.raises(DatasetError, match="needs the 'pyarrow' package"):
        load_instances(path)


def test_model_directly() -> None:
    inst = SWEInstance.model_validate({**SWEBENCH_ROW, "FAIL_TO_PASS": ("a", "b")})
    assert inst.FAIL_TO_PASS == ["a", "b"]
    with pytest.raises(ValueError):
        inst.__setattr__("patch", "x")  # frozen


# Rows in the published shapes (field lists from the datasets' cards: SWE-Gym/SWE-Gym has
# SWE-bench's fields without environment_setup_commit, lists for the test ids; SWE-smith has
# instance_id, patch, FAIL_TO_PASS, PASS_TO_PASS (lists), image_name, repo, problem_statement).
GYM_ROW: dict[str, Any] = {
    **{k: v for k, v in SWEBENCH_ROW.items() if k != "environment_setup_commit"},
    "instance_id": "octo__lib-90",
    "FAIL_TO_PASS": ["t.py::test_new"],
    "PASS_TO_PASS": ["t.py::test_old", "t.py::test_other"],
}


def test_verified_row_keeps_its_extra_columns(tmp_path: Path) -> None:
    row = {**SWEBENCH_ROW, "difficulty": "15 min - 1 hour"}
    (inst,) = load_instances(write_jsonl(tmp_path / "verified.jsonl", [row]))
    assert inst.model_extra == {"difficulty": "15 min - 1 hour"}
    assert inst.to_swebench_dict() == row


def test_gym_row_with_lists_in_jsonl(tmp_path: Path) -> None:
    (inst,) = load_instances(write_jsonl(tmp_path / "gym.jsonl", [GYM_ROW]))
    assert inst.PASS_TO_PASS == ["t.py::test_old", "t.py::test_other"]
    assert inst.environment_setup_commit is None and inst.base_ref == "a" * 40


def test_smith_parquet_with_list_columns(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "smith.parquet"
    pq.write_table(pa.Table.from_pylist([SMITH_ROW]), path)
    (inst,) = load_instances(path)
    assert inst.base_ref == "HEAD" and inst.FAIL_TO_PASS == ["t.py::test_new"]
    assert inst.model_extra == {"image_name": SMITH_ROW["image_name"]}
    garbled = {**SMITH_ROW, "patch": PATCH.replace("+b\n", "")}
    pq.write_table(pa.Table.from_pylist([SMITH_ROW, garbled]), path)
    with pytest.raises(DatasetError, match=r"smith\.parquet:row 2 .*'patch'.*truncated hunk"):
        load_instances(path)


def test_git_diffs_without_hunks_and_no_newline_markers_parse() -> None:
    rename = "diff --git a/x.py b/y.py\nsimilarity index 100%\nrename from x.py\nrename to y.py\n"
    no_newline = PATCH.rstrip("\n") + "\n\\ No newline at end of file\n"
    two_files = PATCH + "--- /dev/null\n+++ b/n.py\n@@ -0,0 +1,2 @@\n+x\n+y\n"
    for patch in (rename + PATCH, no_newline, two_files):
        assert SWEInstance.model_validate({**SWEBENCH_ROW, "patch": patch}).patch == patch


def test_verified_parquet_with_json_string_columns(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = {**SWEBENCH_ROW, "difficulty": "<15 min fix"}  # Verified: every column a string
    path = tmp_path / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist([row]), path)
    (inst,) = load_instances(path)
    assert inst.FAIL_TO_PASS == ["t.py::test_new"] and inst.PASS_TO_PASS == ["t.py::test_old"]
    assert inst.to_swebench_dict() == row


MALFORMED_DIFFS = [
    PATCH.replace("@@ -1 +1 @@", "@@ -x +1 @@"),
    PATCH.replace("\n-a\n", "\n*a\n"),
    PATCH.replace("@@ -1 +1 @@", "@@ -1,3 +1,3 @@"),
    "@@ -1 +1 @@\n-a\n+b\n",
]


def test_what_the_evaluation_parser_rejects_the_loader_rejects() -> None:
    """A row the loader accepts never makes the evaluation's diff parser raise later."""
    from sandbox_worker.evaluation.patches import PatchParseError, patched_files
    from services.protocol.diffs import unified_diff_problem

    for diff in MALFORMED_DIFFS:
        with pytest.raises(PatchParseError):
            patched_files(diff)
        assert unified_diff_problem(diff) is not None, diff
    for inst in load_instances(MINI):
        for diff in (inst.patch, inst.test_patch):
            assert unified_diff_problem(diff) is None and patched_files(diff)


def test_collect_all_reports_every_bad_row_and_keeps_the_rest(tmp_path: Path) -> None:
    good = SWEBENCH_ROW
    bad_patch = {**SWEBENCH_ROW, "instance_id": "octo__lib-18", "patch": "not a diff\n"}
    no_repo = {k: v for k, v in SWEBENCH_ROW.items() if k != "repo"} | {"instance_id": "x-1"}
    path = tmp_path / "d.jsonl"
    lines = [json.dumps(good), json.dumps(bad_patch), "{not json", json.dumps(no_repo)]
    lines.append(json.dumps({**SWEBENCH_ROW, "instance_id": "octo__lib-19"}))
    lines.append(json.dumps(good))  # a duplicate of line 1
    path.write_text("\n".join(lines) + "\n")
    instances, errors = load_instances_collect(path)
    assert [inst.instance_id for inst in instances] == ["octo__lib-17", "octo__lib-19"]
    assert [(e.where, e.instance_id) for e in errors] == [
        ("line 2", "octo__lib-18"),
        ("line 3", None),
        ("line 4", "x-1"),
        ("line 6", "octo__lib-17"),
    ]
    assert "'patch'" in errors[0].message and "unified diff" in errors[0].message
    assert errors[1].message.startswith(f"{path}:line 3: invalid JSON")
    assert "missing required field 'repo'" in errors[2].message
    assert "duplicate instance_id 'octo__lib-17' (first at line 1)" in errors[3].message
    # the strict loader stops at the first of them
    with pytest.raises(DatasetError, match="line 2"):
        load_instances(path)


def test_collect_all_still_raises_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such dataset file"):
        load_instances_collect(tmp_path / "missing.jsonl")
    (tmp_path / "d.json").write_text('{"a": 1}')
    with pytest.raises(DatasetError, match="must be a list"):
        load_instances_collect(tmp_path / "d.json")
    (tmp_path / "e.jsonl").write_text("\n\n")
    with pytest.raises(DatasetError, match="no instances"):
        load_instances_collect(tmp_path / "e.jsonl")


def test_a_diff_cut_before_its_last_newline_is_the_rows_error(tmp_path: Path) -> None:
    """``git apply`` rejects such a diff as corrupt, so a row whose gold or test patch lost its
    final newline would otherwise be graded with its tests missing (a silent 0)."""
    import subprocess

    repo = tmp_path / "r"
    repo.mkdir()
    (repo / "m.py").write_text("a\n")
    cut = PATCH.rstrip("\n")
    git = ["git", "-C", str(repo), "apply", "--check", "-"]
    assert subprocess.run(git, input=PATCH, capture_output=True, text=True).returncode == 0
    refused = subprocess.run(git, input=cut, capture_output=True, text=True)
    assert refused.returncode != 0 and "corrupt patch" in refused.stderr
    for field in ("patch", "test_patch"):
        path = tmp_path / f"{field}.jsonl"
        path.write_text(json.dumps({**SWEBENCH_ROW, field: cut}) + "\n")
        with pytest.raises(DatasetError, match=rf"line 1 .*'{field}'.*no newline"):
            load_instances(path)
