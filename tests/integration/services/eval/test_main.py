"""``python -m services.eval`` (and ``swerl eval``) on the mini set through the real sandboxes.

bwrap for most runs (fast), docker once. Parity: every ``report.json`` equals swebench 5.0.2's
``get_eval_report`` on the same ``test_output.txt``, and the run report's harness keys equal
swebench's own ``make_run_report`` over the same directory (its other keys are the hardened
verdicts and tamper flags, new keys only). The hardened pass is checked on a gold, a
conftest-forging and a ``.git/config``-by-context-diff prediction.
"""

from __future__ import annotations

import difflib
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from sandbox_worker.evaluation.patches import directives_of_test_patch, modified_files
from sandbox_worker.tasks.checks import broken_patch
from sandbox_worker.tasks.repos import materialize_repo
from services.eval.hardened import HARDENED_FILE, HARDENED_LOG, summary_keys
from services.eval.main import main
from services.protocol.instance import SWEInstance
from tests.support import swebench_ref
from tests.support.grading_attacks import ATTACKS, build_attack_patch

SWE = swebench_ref.load()
MODEL = "acme/agent-1"
NOTES = (  # applies cleanly, fixes nothing: unresolved
    "diff --git a/NOTES.txt b/NOTES.txt\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES.txt\n"
    "@@ -0,0 +1 @@\n+nothing fixed here\n"
)


def _preds(path: Path, patches: dict[str, str | None]) -> Path:
    rows = [{"instance_id": i, "model_name_or_path": MODEL, "model_patch": p} for i, p in
            patches.items()]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(capsys: pytest.CaptureFixture[str], dataset: Path, *args: str) -> tuple[int, str, str]:
    code = main(["--dataset", str(dataset), "--backend", "bwrap", "--workers", "2", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _spec(inst: SWEInstance) -> Any:
    return SWE["types"].TestSpec(
        instance_id=inst.instance_id, image="img", eval_script_list=[], repo=inst.repo,
        version=inst.version, FAIL_TO_PASS=inst.FAIL_TO_PASS, PASS_TO_PASS=inst.PASS_TO_PASS,
        log_parser="parse_log_pytest", eval_type="pass_and_fail",
    )  # fmt: skip


@pytest.mark.slow
def test_mixed_predictions_graded_as_the_harness_grades_them(
    mini_set: Path,
    instances: dict[str, SWEInstance],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gold = ["swerl__spanlib-1", "swerl__strkit-1", "swerl__tinyini-1"]
    patches: dict[str, str | None] = {i: instances[i].patch for i in gold}
    patches |= {"swerl__spanlib-2": "", "swerl__spanlib-3": None}
    patches |= {"swerl__strkit-2": broken_patch(instances["swerl__strkit-2"])}
    patches |= {"swerl__strkit-3": NOTES, "swerl__tinyini-3": NOTES}  # tinyini-2: no prediction
    preds = _preds(tmp_path / "preds.jsonl", patches)
    out_dir = tmp_path / "out"
    code, out, err = _run(
        capsys, mini_set, "--predictions", str(preds), "--report-dir", str(out_dir)
    )
    assert code == 0, err
    report_path = out_dir / "acme__agent-1.preds.json"
    ours = json.loads(report_path.read_text())
    assert ours["resolved_ids"] == gold
    assert ours["unresolved_ids"] == ["swerl__strkit-3", "swerl__tinyini-3"]
    assert ours["error_ids"] == ["swerl__strkit-2"]  # a patch that does not apply: an error
    assert ours["empty_patch_ids"] == ["swerl__spanlib-2", "swerl__spanlib-3"]
    assert ours["incomplete_ids"] == ["swerl__tinyini-2"]
    assert (ours["total_instances"], ours["submitted_instances"], ours["completed_instances"]) == (
        9, 8, 5
    )  # fmt: skip
    assert "Resolved: 3/9 (33.3%)" in out and f"Report written to {report_path}" in out
    assert "swerl__strkit-2: error: the patch does not apply" in err
    run_dir = out_dir / "logs" / "run_evaluation" / "preds" / "acme__agent-1"
    broken = run_dir / "swerl__strkit-2"
    assert not (broken / "report.json").exists()
    assert ">>>>> Patch Apply Failed" in (broken / "run_instance.log").read_text()
    assert (broken / "patch.diff").read_text() == patches["swerl__strkit-2"]
    for iid in ours["completed_ids"]:  # report.json == get_eval_report on the same log
        theirs = SWE["grading"].get_eval_report(
            _spec(instances[iid]),
            {"instance_id": iid, "model_name_or_path": MODEL, "model_patch": patches[iid]},
            str(run_dir / iid / "test_output.txt"),
            include_tests_status=True,
        )
        assert json.loads((run_dir / iid / "report.json").read_text()) == theirs
    monkeypatch.chdir(out_dir)  # the harness reads logs/run_evaluation relative to the cwd
    rows = [json.loads(line) for line in preds.read_text().splitlines()]
    theirs_path = importlib.import_module("swebench.harness.reporting").make_run_report(
        {r["instance_id"]: r for r in rows},
        [{"instance_id": iid} for iid in instances],
        "preds",
        report_dir=str(tmp_path / "theirs"),
    )
    theirs = json.loads(Path(theirs_path).read_text())
    assert {key: ours[key] for key in theirs} == theirs  # the harness's keys, as the harness
    assert set(ours) - set(theirs) == set(summary_keys({}, [], enabled=True))  # new keys only
    assert ours["hardened_resolved_ids"] == gold and ours["tampered_ids"] == []


def _harness_row(inst: SWEInstance) -> dict[str, Any]:
    """The row in swebench 5.0.2's shape: its own eval_script (the harness's form, for the
    mini images: /testbed, Debian's pytest), log_parser, eval_type, image."""
    base, tests = inst.base_commit, " ".join(modified_files(inst.test_patch))
    script = "\n".join([
        "#!/bin/bash", "set -uxo pipefail", "cd /testbed", "git status",
        f"git -c core.fileMode=false diff {base}", f"git checkout {base} {tests}",
        "git apply -v - <<'EOF_114329324912'", inst.test_patch.rstrip("\n"), "EOF_114329324912",
        ": '>>>>> Start Test Output'",
        "python3 -m pytest -rA -p no:cacheprovider "
        + " ".join(directives_of_test_patch(inst.test_patch)),
        ": '>>>>> End Test Output'", f"git checkout {base} {tests}",
    ])  # fmt: skip
    return {**inst.to_swebench_dict(), "eval_script": script, "log_parser": "parse_log_pytest",
            "eval_type": "pass_and_fail", "image": "img"}  # fmt: skip


@pytest.mark.slow
def test_rows_with_the_harness_script_run_it(
    mini_set: Path,
    instances: dict[str, SWEInstance],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    chosen = ["swerl__spanlib-3", "swerl__tinyini-2"]
    rows = [_harness_row(instances[i]) for i in chosen]
    dataset = tmp_path / "harness-shaped.jsonl"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    patches = {chosen[0]: instances[chosen[0]].patch, chosen[1]: NOTES}
    preds = _preds(tmp_path / "h.jsonl", patches)
    code, out, err = _run(capsys, dataset, "--predictions", str(preds), "--report-dir",
                          str(tmp_path / "o"))  # fmt: skip
    assert code == 0, err
    report = json.loads((tmp_path / "o" / "acme__agent-1.h.json").read_text())
    assert report["resolved_ids"] == [chosen[0]] and report["unresolved_ids"] == [chosen[1]]
    assert "Resolved: 1/2 (50.0%)" in out
    run_dir = tmp_path / "o" / "logs" / "run_evaluation" / "h" / "acme__agent-1"
    for row in rows:
        iid = row["instance_id"]
        spec = SWE["harness_utils"].make_test_spec(row)  # the harness's own spec of the row
        assert (run_dir / iid / "eval.sh").read_text().rstrip("\n") == spec.eval_script.rstrip("\n")
        assert "eval script: harness" in (run_dir / iid / "run_instance.log").read_text()
        theirs = SWE["grading"].get_eval_report(
            spec,
            {"instance_id": iid, "model_name_or_path": MODEL, "model_patch": patches[iid]},
            str(run_dir / iid / "test_output.txt"),
            include_tests_status=True,
        )
        assert json.loads((run_dir / iid / "report.json").read_text()) == theirs


@pytest.mark.slow
def test_gold_resolves_everything_and_resume_grades_nothing_again(
    mini_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    args = ("--predictions", "gold", "--report-dir", str(out_dir))
    code, out, err = _run(capsys, mini_set, *args)
    assert code == 0, err
    assert "Resolved: 9/9 (100.0%)" in out
    report = json.loads((out_dir / "gold.gold.json").read_text())
    assert report["resolved_instances"] == 9 and report["error_ids"] == []
    run_dir = out_dir / "logs" / "run_evaluation" / "gold" / "gold"
    stamps = {p: p.stat().st_mtime_ns for p in run_dir.glob("*/report.json")}
    assert len(stamps) == 9

    code, _, err = _run(capsys, mini_set, *args)  # the same run id without --resume
    assert code == 2 and "exists: pass --resume" in err

    (run_dir / "swerl__tinyini-2" / "report.json").unlink()
    code, out, err = _run(capsys, mini_set, *args, "--resume")
    assert code == 0, err
    assert "1 to grade (8 already graded)" in err
    assert "[1/1] swerl__tinyini-2: resolved" in err
    assert "Resolved: 9/9 (100.0%)" in out
    for path, stamp in stamps.items():
        if path.parent.name != "swerl__tinyini-2":
            assert path.stat().st_mtime_ns == stamp, f"{path} was graded again"


def test_empty_patches_resolve_nothing(
    mini_set: Path, instances: dict[str, SWEInstance], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    preds = _preds(tmp_path / "empty.jsonl", {i: "" for i in instances})
    code, out, err = _run(capsys, mini_set, "--predictions", str(preds), "--report-dir",
                          str(tmp_path / "o"))  # fmt: skip
    assert code == 0, err
    report = json.loads((tmp_path / "o" / "acme__agent-1.empty.json").read_text())
    assert report["empty_patch_instances"] == 9 and report["resolved_instances"] == 0
    assert report["completed_ids"] == [] and report["error_ids"] == []
    assert "Resolved: 0/9 (0.0%)" in out


def test_a_missing_image_is_an_error_not_unresolved(
    mini_set: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(
        capsys, mini_set, "--predictions", "gold", "--report-dir", str(tmp_path / "o"),
        "--instances", "swerl__spanlib-1", "--image-namespace", "nowhere",
    )  # fmt: skip
    assert code == 1, err  # an infrastructure failure: the rate is a lower bound
    report = json.loads((tmp_path / "o" / "gold.gold.json").read_text())
    assert report["error_ids"] == ["swerl__spanlib-1"] and report["unresolved_ids"] == []
    log = (
        tmp_path / "o/logs/run_evaluation/gold/gold/swerl__spanlib-1/run_instance.log"
    ).read_text()
    assert "nowhere/sweb.eval.x86_64.swerl_1776_spanlib-1:latest" in log
    assert "Resolved: 0/1 (0.0%)" in out


@pytest.mark.slow
def test_docker_backend(
    mini_set: Path, instances: dict[str, SWEInstance], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    patches = {"swerl__tinyini-1": instances["swerl__tinyini-1"].patch, "swerl__strkit-3": NOTES}
    preds = _preds(tmp_path / "d.jsonl", patches)
    args = ["--predictions", str(preds), "--report-dir", str(tmp_path / "o")]
    code = main(["--dataset", str(mini_set), "--backend", "docker", *args,
                 "--instances", ",".join(patches)])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads((tmp_path / "o" / "acme__agent-1.d.json").read_text())
    assert report["resolved_ids"] == ["swerl__tinyini-1"]
    assert report["unresolved_ids"] == ["swerl__strkit-3"]
    assert "Resolved: 1/2 (50.0%)" in out


def _swerl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "services.swerl_cli", "eval", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.slow
def test_swerl_eval_runs_the_script_and_bad_predictions_exit_2(
    mini_set: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        json.dumps(
            {"instance_id": "swerl__spanlib-1", "model_name_or_path": "m", "model_patch": ""}
        )
        + "\n"
        + json.dumps({"instance_id": "swerl__spanlib-2", "model_name_or_path": "m"})
        + "\n"
    )
    res = _swerl("--dataset", str(mini_set), "--predictions", str(bad))
    assert res.returncode == 2
    assert "bad.jsonl:line 2 (instance 'swerl__spanlib-2'): missing required field" in res.stderr
    assert "Traceback" not in res.stderr
    res = _swerl("--dataset", str(mini_set), "--predictions", "gold", "--workers", "0")
    assert res.returncode == 2 and "--workers: must be >= 1" in res.stderr
    res = _swerl("--dataset", str(mini_set), "--model", str(tmp_path / "nope"))
    assert res.returncode == 2 and "no such checkpoint directory" in res.stderr
    res = _swerl("--dataset", str(mini_set), "--model", str(tmp_path), "--predictions", "gold")
    assert res.returncode == 2 and "not allowed with argument" in res.stderr
    res = _swerl("--dataset", str(mini_set), "--predictions", "gold", "--backend", "bwrap",
                 "--instances", "swerl__strkit-1", "--report-dir", str(tmp_path / "o"))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "Resolved: 1/1 (100.0%)" in res.stdout


def _conftest_forgery(inst: SWEInstance) -> str:
    """A new root ``conftest.py`` whose hook turns every test report into a pass."""
    return build_attack_patch(next(a for a in ATTACKS if a.name == "conftest_root"), inst)


def _git_config_by_context_diff(inst: SWEInstance) -> str:
    """A context diff (``*** a/.git/config`` headers) adding a section to ``.git/config``: git
    apply finds no patch in it, GNU patch (the harness's last fallback) applies it."""
    with tempfile.TemporaryDirectory(prefix="swerl-ctx-") as tmp:
        repo = Path(tmp) / "repo"
        materialize_repo(inst.repo, repo)
        old = (repo / ".git" / "config").read_text().splitlines(keepends=True)
    new = [*old, "[swerl]\n", "\tplanted = by-the-patch\n"]
    diff = "".join(difflib.context_diff(old, new, "a/.git/config", "b/.git/config"))
    assert diff.startswith("*** a/.git/config"), diff
    return diff


@pytest.mark.slow
def test_the_hardened_verdict_and_tamper_flags_sit_next_to_the_official_one(
    mini_set: Path,
    instances: dict[str, SWEInstance],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Gold resolves under both gradings without a flag; a forged conftest and a context diff
    into .git/config are flagged and never resolved by the hardened grading. The official
    verdicts are those of a --no-hardened run of the same predictions, which still reports
    what its own pass found."""
    gold, forge, git = "swerl__strkit-1", "swerl__spanlib-1", "swerl__tinyini-1"
    patches = {
        gold: instances[gold].patch,
        forge: _conftest_forgery(instances[forge]),
        git: _git_config_by_context_diff(instances[git]),
    }
    preds = _preds(tmp_path / "h.jsonl", patches)
    common = ["--predictions", str(preds), "--instances", ",".join(patches)]
    code, out, err = _run(capsys, mini_set, *common, "--report-dir", str(tmp_path / "on"))
    assert code == 0, err
    report = json.loads((tmp_path / "on" / "acme__agent-1.h.json").read_text())
    verdicts = report["verdicts"]
    assert set(verdicts) == set(patches) and report["hardened_evaluation"] is True

    assert (verdicts[gold]["resolved"], verdicts[gold]["hardened_resolved"]) == (True, True)
    assert verdicts[gold]["tamper"] == []

    forged = verdicts[forge]
    assert forged["hardened_resolved"] is False
    assert "test_infra_touched" in forged["tamper"] and "conftest.py" in forged["infra_touched"]
    # the official pass grades the tree the patch left: if the forgery fooled it, it is named
    assert ("resolved_only_official" in forged["tamper"]) == forged["resolved"]
    assert forged["resolved"] == (forge in report["resolved_ids"])

    planted = verdicts[git]
    assert planted["hardened_resolved"] is False and planted["hardened_status"] == "error"
    assert {"patch_refused_strict", "git_touched"} <= set(planted["tamper"])
    assert planted["strict_refusal"]

    assert report["hardened_resolved_ids"] == [gold]
    assert report["tampered_ids"] == sorted([forge, git])
    for flag in ("test_infra_touched", "git_touched", "patch_refused_strict"):
        assert report["tamper_counts"][flag] == len(report["tamper_ids"][flag]) >= 1
    assert report["tamper_ids"]["git_touched"] == [git]
    assert "Hardened verdict: resolved 1/3 (33.3%)" in out
    assert "Predictions with tamper flags: 2" in out
    assert f"{git}: " in err and "hardened: error: patch refused" in err
    run_dir = tmp_path / "on" / "logs" / "run_evaluation" / "h" / "acme__agent-1"
    for iid in patches:
        assert json.loads((run_dir / iid / HARDENED_FILE).read_text())["instance_id"] == iid
        assert "hardened pass: grading" in (run_dir / iid / HARDENED_LOG).read_text()

    code, out, err = _run(capsys, mini_set, *common, "--report-dir", str(tmp_path / "off"),
                          "--no-hardened")  # fmt: skip
    assert code == 0, err
    plain = json.loads((tmp_path / "off" / "acme__agent-1.h.json").read_text())
    harness_keys = ("resolved_ids", "unresolved_ids", "error_ids", "completed_ids")
    assert {k: plain[k] for k in harness_keys} == {k: report[k] for k in harness_keys}
    assert plain["hardened_evaluation"] is False and plain["hardened_resolved_ids"] == []
    assert "Hardened verdict: not run (--no-hardened)" in out
    assert "git_touched" in plain["verdicts"][git]["tamper"]  # the official pass's own flags
    assert "test_infra_touched" in plain["verdicts"][forge]["tamper"]
    assert not (tmp_path / "off" / "logs" / "run_evaluation" / "h" / "acme__agent-1" / gold
                / HARDENED_LOG).exists()  # fmt: skip
