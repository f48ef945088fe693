"""The contamination check between a training mixture and SWE-bench Verified rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.datasets import load_instances
from services.datasets.denylist import load_denylist
from services.datasets.mixture import MixtureEntry
from services.datasets.overlap import find_overlaps, jaccard, main, shingles
from tests.support.paths import TEST_DATA

VERIFIED = TEST_DATA / "swebench_verified" / "rows.jsonl"
PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"


def _verified() -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in VERIFIED.read_text().splitlines() if line.strip()]
    return {row["instance_id"]: row for row in rows}


def _row(instance_id: str, repo: str, statement: str, base: str = "c" * 40) -> dict[str, Any]:
    return {
        "instance_id": instance_id,
        "repo": repo,
        "base_commit": base,
        "patch": PATCH,
        "problem_statement": statement,
        "FAIL_TO_PASS": ["t.py::test_a"],
        "PASS_TO_PASS": [],
    }


def _training(tmp_path: Path) -> Path:
    verified = _verified()
    leaked = verified["django__django-11099"]
    rows = [
        # the evaluation task itself
        _row("django__django-11099", "django/django", "something else entirely"),
        # another task on the exact tree of an evaluation instance
        _row("django__django-99999", "django/django", "Admin crashes", leaked["base_commit"]),
        # a reworded copy of an evaluation problem (the published statement, a term respelled)
        _row(
            "octo__web-3",
            "octo/web",
            verified["django__django-14011"]["problem_statement"].replace(
                "LiveServerTestCase", "LiveServer test case"
            ),
        ),
        _row("octo__web-4", "octo/web", "Parser drops the last token of a quoted string"),
    ]
    path = tmp_path / "gym.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_shingles_and_jaccard_by_hand() -> None:
    a, b = shingles("A b, c d"), shingles("a B c e")
    assert a == {("a", "b", "c"), ("b", "c", "d")}
    assert jaccard(a, b) == pytest.approx(1 / 3)  # {abc} / {abc, bcd, bce}
    assert shingles("Two words") == {("two",), ("words",)}
    assert jaccard(shingles(""), shingles("")) == 0


def test_each_kind_of_overlap_is_found(tmp_path: Path) -> None:
    train = [MixtureEntry("gym", inst) for inst in load_instances(_training(tmp_path))]
    report = find_overlaps(train, load_instances(VERIFIED), threshold=0.6)
    got = {(o.train_key, o.eval_id, o.kind) for o in report.overlaps}
    assert got == {
        ("gym/django__django-11099", "django__django-11099", "same instance"),
        ("gym/django__django-99999", "django__django-11099", "same snapshot"),
        ("gym/octo__web-3", "django__django-14011", "near-duplicate problem"),
    }
    near = next(o for o in report.overlaps if o.kind == "near-duplicate problem")
    assert 0.6 <= near.similarity < 1
    assert report.shared_repos == {"django/django": (2, 2)}
    stricter = find_overlaps(train, load_instances(VERIFIED), threshold=0.99)
    assert "near-duplicate problem" not in {o.kind for o in stricter.overlaps}
    with pytest.raises(ValueError, match="threshold"):
        find_overlaps(train, [], threshold=0)


def test_cli_exit_status_report_and_deny_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    deny, out = tmp_path / "deny.txt", tmp_path / "report.json"
    argv = ["--train", f"gym={_training(tmp_path)}", "--eval", str(VERIFIED)]
    assert main([*argv, "--deny-out", str(deny), "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "3 overlap(s)" in printed and "django/django: 2, 2" in printed
    assert load_denylist(deny) == {
        "django__django-11099": "same instance of django__django-11099",
        "django__django-99999": "same snapshot of django__django-11099",
        "octo__web-3": "near-duplicate problem of django__django-14011",
    }
    assert json.loads(out.read_text())["shared_repos"] == {"django/django": [2, 2]}
    clean = tmp_path / "clean.jsonl"
    clean.write_text(json.dumps(_row("octo__web-4", "octo/web", "Parser drops a token")) + "\n")
    assert main(["--train", str(clean), "--eval", str(VERIFIED)]) == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--threshold", "1.5"], "--threshold must be in"), (["--eval", "nope.jsonl"], "no such")],
)
def test_cli_bad_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    argv = ["--train", str(_training(tmp_path)), "--eval", str(VERIFIED), *extra]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
