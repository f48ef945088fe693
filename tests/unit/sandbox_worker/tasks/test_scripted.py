"""SCRIPTED gold solutions (test machinery): the script the reference engine replays."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from adapter.tool_parsers import HermesParser
from sandbox_worker.tasks.scripted import (
    HEREDOC_DELIMITER,
    LABEL,
    PATCH_PATH,
    ScriptBuildError,
    build_script,
    main,
    needs_base64,
    solution_turns,
    write_patch_command,
)
from services.datasets import load_instances
from services.protocol.instance import SWEInstance
from tests.unit.sandbox_worker.conftest import INSTANCES


@pytest.fixture(scope="module")
def mini() -> list[SWEInstance]:
    return load_instances(INSTANCES)


def test_each_instance_gets_a_unique_match_from_its_problem_statement(
    mini: list[SWEInstance],
) -> None:
    entries = build_script(mini)
    assert len(entries) == len(mini)
    for inst, entry in zip(mini, entries, strict=True):
        assert entry["match"] in inst.problem_statement
        for other, other_entry in zip(mini, entries, strict=True):
            if other.instance_id == inst.instance_id:
                continue
            # Nothing another conversation's prompt can contain selects this script.
            assert entry["match"] not in other.problem_statement
            assert all(entry["match"] not in turn for turn in other_entry["turns"])


def test_turns_are_hermes_calls_of_the_openhands_tools(mini: list[SWEInstance]) -> None:
    inst = mini[0]
    parsed = [HermesParser().parse(turn, None) for turn in solution_turns(inst)]
    assert not any(p.malformed for p in parsed)
    calls = [p.tool_calls for p in parsed]
    assert [[c.name for c in cs] for cs in calls] == [["terminal"], ["terminal"], ["finish"]]
    assert calls[0][0].arguments["command"] == write_patch_command(inst.patch)
    assert calls[1][0].arguments["command"] == (
        f"cd /testbed && git apply --verbose {PATCH_PATH} && git status --short"
    )
    assert set(calls[2][0].arguments) == {"message"}
    assert all(LABEL in (p.content or "") for p in parsed[:2])  # labelled as scripted


def _run_write_command(command: str, tmp_path: Path) -> bytes:
    target = tmp_path / "out.diff"
    subprocess.run(
        ["bash", "-c", command.replace(PATCH_PATH, str(target), 1)], check=True, timeout=30
    )
    return target.read_bytes()


@pytest.mark.parametrize(
    ("patch", "encoded"),
    [
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a = 'b'\n+a = \"c $HOME `x` \\\\n\"\n", False),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-\tindented\n+\tindented again\n", True),  # tabs
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-caf\u00e9\n+caf\u00e8\r\n", True),  # non-ASCII, CR
        (f"--- a/x\n+++ b/x\n@@ -1 +1 @@\n-{HEREDOC_DELIMITER}\n+y\n", True),
        ("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-" + "z" * 5000 + "\n+y\n", True),  # long line
    ],
)
def test_the_write_command_reproduces_the_patch_exactly(
    patch: str, encoded: bool, tmp_path: Path
) -> None:
    assert needs_base64(patch) is encoded
    command = write_patch_command(patch)
    assert command.startswith("base64 -d" if encoded else "cat >")
    assert _run_write_command(command, tmp_path) == patch.encode()


def test_refusals(mini: list[SWEInstance]) -> None:
    with pytest.raises(ScriptBuildError, match="end with a newline"):
        write_patch_command("--- a/x\n+++ b/x")
    with pytest.raises(ScriptBuildError, match="duplicate instance ids"):
        build_script([mini[0], mini[0]])
    with pytest.raises(ScriptBuildError, match="no instances"):
        build_script([])
    twin = mini[1].model_copy(update={"problem_statement": mini[0].problem_statement})
    with pytest.raises(ScriptBuildError, match="no prefix of its problem statement is unique"):
        build_script([mini[0], twin])
    with pytest.raises(ScriptBuildError, match="gold patch is empty"):
        solution_turns(mini[0].model_copy(update={"patch": " "}))
    with pytest.raises(ScriptBuildError, match="plain absolute path"):
        solution_turns(mini[0], repo_dir="testbed; rm -rf /")


def test_a_longer_prefix_is_used_when_the_first_line_is_shared(mini: list[SWEInstance]) -> None:
    a = mini[0].model_copy(update={"problem_statement": "Bug report\nalpha() is broken\n"})
    b = mini[1].model_copy(update={"problem_statement": "Bug report\nbeta() is broken\n"})
    matches = [e["match"] for e in build_script([a, b])]
    assert matches == ["Bug report\nalpha() is broken", "Bug report\nbeta() is broken"]


def test_cli_writes_a_jsonl_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "script.jsonl"
    ids = ["swerl__strkit-1", "swerl__tinyini-2"]
    argv = ["--out", str(out), "--instances", str(INSTANCES)]
    assert main([*argv, "--only", ids[0], "--only", ids[1]]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [set(line) for line in lines] == [{"match", "turns"}] * 2
    assert main(["--out", str(out), "--instances", str(tmp_path / "missing.jsonl")]) == 2
    assert "error:" in capsys.readouterr().err
