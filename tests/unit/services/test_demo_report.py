"""The demo's tables and summary: rows name instances and engine roles; pass@k per instance."""

from __future__ import annotations

import pytest

from services.demo import main
from services.demo_report import (
    TrajectoryRow,
    instance_scores,
    instance_table,
    progress_line,
    summary,
    trajectory_table,
)


def row(
    instance: str, sample: int, reward: float | None, status: str = "completed"
) -> TrajectoryRow:
    return TrajectoryRow(
        trajectory_id=f"t-{instance}-{sample}",
        instance_id=instance,
        sample_index=sample,
        group_id=f"g-{instance}",
        engines=["scripted" if sample == 0 else "sampling"],
        status=status,
        reward=reward,
        turns=3,
        generated_tokens=40,
        abort_reason="sandbox died" if status == "aborted" else None,
    )


ROWS = [
    row("repo__a-1", 1, 0.0),
    row("repo__a-1", 0, 1.0),
    row("repo__b-2", 0, 0.0),
    row("repo__b-2", 1, None, "aborted"),
]


def test_instance_scores_count_resolved_and_aborted_and_pass_at_k() -> None:
    scores = {s.instance_id: s for s in instance_scores(ROWS)}
    a, b = scores["repo__a-1"], scores["repo__b-2"]
    assert (a.samples, a.resolved, a.aborted, a.pass_at_k) == (2, 1, 0, 1.0)
    assert (b.samples, b.resolved, b.aborted, b.pass_at_k) == (2, 0, 1, 0.0)
    total = instance_table(list(scores.values()))[-1].split()
    assert total[0] == "all" and total[1] == "1/4" and total[-1] == "0.50"


def test_trajectory_table_names_instances_and_roles_not_ports() -> None:
    lines = trajectory_table(ROWS)
    assert len(lines) == 1 + len(ROWS)
    assert lines[1].split()[:3] == ["repo__a-1", "0", "scripted"]  # sorted by instance, sample
    assert "(sandbox died)" in lines[-1]
    assert not any(":" in line.split()[2] for line in lines[1:])


def test_summary_groups_rewards_in_sample_order_and_finds_mixed_groups() -> None:
    s = summary(ROWS, None)
    assert s["groups"] == {"g-repo__a-1": [1.0, 0.0], "g-repo__b-2": [0.0, None]}
    assert s["mixed_groups"] == ["g-repo__a-1"]
    assert [i["pass_at_k"] for i in s["instances"]] == [1.0, 0.0]


def test_progress_line_extrapolates_an_eta() -> None:
    assert progress_line(0, 4, 10.0, "x").startswith("0/4 done, 10s elapsed, ETA --")
    assert "ETA 1m30s" in progress_line(1, 4, 30.0, "x")  # 30 s per trajectory, 3 left


@pytest.mark.parametrize(
    "argv", [["--limit", "-1"], ["--samples", "0"], ["--timeout", "soon"], ["--backend", "vm"]]
)
def test_bad_arguments_exit_2_before_anything_starts(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "Traceback" not in capsys.readouterr().err


def test_an_unreadable_instances_file_is_a_message(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "rows.jsonl"
    bad.write_text('{"instance_id": 3}\n')
    assert main(["--instances", str(bad), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "--instances" in err and str(bad) in err
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
