"""The ``swerl`` argument parsing: specs built from flags, usage errors exit 2, help teaches."""

from __future__ import annotations

import tomllib
from importlib import import_module
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from services.swerl_cli.errors import (
    EXIT_JOB_FAILED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
)
from services.swerl_cli.main import (
    build_parser,
    cmd_logs,
    cmd_status,
    cmd_submit,
    main,
    spec_from_args,
    watch,
)
from services.swerl_cli.render import progress_line
from tests.support.paths import REPO_ROOT


def parse(*argv: str) -> tuple[str, dict]:
    return spec_from_args(build_parser().parse_args(list(argv)))


def test_rollout_flags_make_the_spec() -> None:
    kind, spec = parse("submit", "rollout", "--instances", "a, b,", "--samples", "3",
                       "--max-steps", "40", "--temperature", "0.5")  # fmt: skip
    assert kind == "rollout"
    assert spec == {
        "instance_ids": ["a", "b"],
        "n_samples": 3,
        "policy_version": 0,
        "limits": {"max_steps": 40},
        "sampling": {"temperature": 0.5},
    }


def test_a_bad_mixture_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    _, spec = parse("submit", "train", "--model", "m", "--dataset", "g=/x/a.parquet:0.5,"
                       "s=/x/b.jsonl:0.5", "--steps", "5", "--checkpoint-dir", "/c")  # fmt: skip
    assert spec["dataset"] == "g=/x/a.parquet:0.5,s=/x/b.jsonl:0.5"
    with pytest.raises(SystemExit) as exc:
        parse("submit", "train", "--model", "m", "--dataset", "a.jsonl:0", "--steps", "5",
              "--checkpoint-dir", "/c")  # fmt: skip
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "weight must be a positive number" in err and "Traceback" not in err


def test_train_flags_make_the_spec() -> None:
    kind, spec = parse("submit", "train", "--model", "m", "--dataset", "d", "--steps", "5",
                       "--checkpoint-dir", "/c", "--resume", "--group", "g2")  # fmt: skip
    assert kind == "train"
    assert (spec["steps"], spec["resume"], spec["trainer_group"]) == (5, True, "g2")
    assert spec["batch"] == {"prompts_per_step": 8, "samples_per_prompt": 8}


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["submit", "rollout"],  # --instances is required
        ["submit", "train", "--model", "m"],
        ["submit", "rollout", "--instances", ","],
        ["status", "--state", "done"],
        ["frobnicate"],
    ],
)
def test_argument_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == EXIT_USAGE
    assert "usage:" in capsys.readouterr().err


def test_submit_without_a_kind_is_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--api", "http://127.0.0.1:9", "submit"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("swerl: error: say what to submit") and "Traceback" not in err


def test_file_and_kind_together_are_refused() -> None:
    args = build_parser().parse_args(["submit", "-f", "job.yaml", "rollout", "--instances", "a"])
    with pytest.raises(CliError) as err:
        spec_from_args(args)
    assert err.value.code == EXIT_USAGE


def test_an_unreachable_api_is_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--api", "http://127.0.0.1:9", "status"]) == EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert err.startswith("swerl: error: the API at http://127.0.0.1:9 is unreachable: ")
    assert "(is it running? --api / $SWERL_API_URL)" in err and "Redis" not in err


def test_help_teaches_commands_and_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for word in ("submit", "status", "logs", "cancel", "exit status:", "SWERL_API_TOKEN"):
        assert word in out


def test_the_console_script_points_at_main() -> None:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["swerl"].partition(":")
    assert getattr(import_module(module), name) is main


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "--wait", "--idempotency-key", "k", "eval", "--checkpoint", "c",
         "--dataset", "d"],
        ["submit", "eval", "--checkpoint", "c", "--dataset", "d", "--wait",
         "--idempotency-key", "k"],
    ],
)  # fmt: skip
def test_submit_options_go_before_or_after_the_kind(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert (args.wait, args.idempotency_key) == (True, "k")


def test_submit_options_default_off() -> None:
    args = build_parser().parse_args(["submit", "eval", "--checkpoint", "c", "--dataset", "d"])
    assert (args.wait, args.idempotency_key) == (False, None)


def test_eval_runs_the_evaluation_script_with_the_arguments_after_eval(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`swerl [global options] eval ...` runs python -m services.eval with what follows
    `eval`; the child's exit status (2: the dataset file is missing) is swerl's."""
    missing = f"{tmp_path}/none.jsonl"
    code = main(["--api", "http://127.0.0.1:1", "eval", "--dataset", missing, "--predictions",
                 "gold"])  # fmt: skip
    assert code == EXIT_USAGE
    assert f"{missing}: no such dataset file" in capfd.readouterr().err


def test_eval_usage_errors_are_the_parents() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--predictions", "gold"])  # no --dataset
    assert exc.value.code == EXIT_USAGE


@pytest.mark.parametrize(
    ("command", "prog"),
    [("demo", "python -m services.demo"), ("images", "python -m sandbox_worker.images"),
     ("validate", "python -m sandbox_worker.validate")],
)  # fmt: skip
def test_local_tools_run_their_module_with_every_argument_after_the_command(
    command: str, prog: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """`swerl demo|images|validate ...` hands everything after the command (its --help too)
    to the module; the module's exit status is swerl's."""
    assert main(["--api", "http://127.0.0.1:1", command, "--help"]) == 0
    assert f"usage: {prog}" in capfd.readouterr().out
    assert main([command, "--no-such-option"]) == EXIT_USAGE
    assert f"{prog}: error:" in capfd.readouterr().err  # the module's own usage error


def test_unknown_arguments_of_an_api_command_are_still_usage_errors() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["status", "--no-such-option"])
    assert exc.value.code == EXIT_USAGE


class FakeApi:
    """The job API as ``watch`` and ``submit`` see it: one finished job."""

    def __init__(self, job: dict) -> None:
        self.finished = job

    def job(self, job_id: str) -> dict:
        return self.finished

    def submit(self, kind: str, spec: dict, key: str | None) -> dict:
        return {**self.finished, "state": "queued"}


def finished(state: str, aborted: int, **extra: object) -> dict:
    counts = {"total": 4, "graded": 4 - aborted, "resolved": 1, "aborted": aborted}
    return {"id": "rollout-1", "kind": "rollout", "state": state, "message": "done",
            "progress": {"done": 4, "total": 4}, "trajectories": counts, **extra}  # fmt: skip


@pytest.mark.parametrize(
    ("state", "aborted", "allow", "code"),
    [
        ("succeeded", 0, False, EXIT_OK),
        ("succeeded", 1, False, EXIT_JOB_FAILED),  # partial: something failed
        ("succeeded", 1, True, EXIT_OK),  # ... unless the user accepts it
        ("failed", 4, True, EXIT_JOB_FAILED),  # a failed job is never accepted
        ("cancelled", 0, False, EXIT_JOB_FAILED),
    ],
)
def test_watch_exits_6_when_anything_failed(
    state: str, aborted: int, allow: bool, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi(finished(state, aborted))
    assert watch(api, "rollout-1", 0.0, allow_failed_trajectories=allow) == code  # type: ignore[arg-type]
    out = capsys.readouterr()
    assert f"{4 - aborted} graded" in out.out and f"{aborted} failed" in out.out
    if code == EXIT_JOB_FAILED and state == "succeeded":
        assert "--allow-failed-trajectories" in out.err


def test_a_job_without_trajectory_counts_exits_by_its_state() -> None:
    train = {"id": "train-1", "kind": "train", "state": "succeeded", "spec": {"steps": 3},
             "progress": {"current_step": 3}}  # fmt: skip
    assert watch(FakeApi(train), "train-1", 0.0) == EXIT_OK  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "--wait", "--allow-failed-trajectories", "rollout", "--instances", "a"],
        ["submit", "rollout", "--instances", "a", "--wait", "--allow-failed-trajectories"],
        ["status", "rollout-1", "--watch", "--allow-failed-trajectories"],
    ],
)
def test_the_allow_failed_trajectories_flag(argv: list[str]) -> None:
    assert build_parser().parse_args(argv).allow_failed_trajectories is True
    without = [a for a in argv if a != "--allow-failed-trajectories"]
    assert build_parser().parse_args(without).allow_failed_trajectories is False


def test_submit_prints_the_apis_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(finished("succeeded", 0, warnings=["no trainer service of group 'x'"]))
    args = build_parser().parse_args(["submit", "rollout", "--instances", "a"])
    assert cmd_submit(api, args) == EXIT_OK  # type: ignore[arg-type]
    assert "swerl: warning: no trainer service of group 'x'" in capsys.readouterr().err


def event(tid: str, ts: float, **over: object) -> dict:
    return {"trajectory_id": tid, "instance_id": "swerl__spanlib-1", "sample_index": 0,
            "attempt": 1, "phase": "agent", "turn": 1, "tokens": 100, "elapsed_s": ts,
            "current_tool": None, "status": None, "ts": ts, **over}  # fmt: skip


class ProgressApi:
    """A rollout job through its polls: each poll answers the next job state and progress page;
    ``_call`` is the client's request method (the progress route), ``None`` pages a 404."""

    def __init__(self, polls: list[tuple[dict, dict | None]], logs: list[dict] | None = None):
        self.polls, self.i = polls, -1
        self.log_lines = logs or []
        self.asked: list[dict] = []

    def job(self, job_id: str) -> dict:
        self.i = min(self.i + 1, len(self.polls) - 1)
        return self.polls[self.i][0]

    def _call(self, method: str, path: str, params: dict | None = None) -> Any:
        assert (method, path) == ("GET", "/v1/jobs/rollout-1/progress")
        self.asked.append(params or {})
        page = self.polls[max(self.i, 0)][1]
        if page is None:
            raise CliError(EXIT_NOT_FOUND, "not found")
        return SimpleNamespace(json=lambda: page)

    def logs(self, job_id: str, offset: int) -> tuple[list[dict], int]:
        lines = self.log_lines[offset:]
        return lines, offset + len(lines)


def running(**over: object) -> dict:
    return {**finished("running", 0), "trajectories": None, "message": "", **over}


def test_watch_prints_a_line_per_trajectory_when_its_progress_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    a0, b0 = event("rollout-1:0:0.a1", 5.0), event("rollout-1:0:1.a1", 5.0, instance_id="other-2")
    a1 = event("rollout-1:0:0.a1", 11.0, turn=4, current_tool="terminal")
    polls = [
        (running(), {"latest": [a0, b0]}),
        (running(), {"latest": [a0, b0]}),  # nothing new: nothing printed
        (running(), {"latest": [a1, b0]}),
        (finished("succeeded", 0), {"latest": []}),
    ]
    assert watch(ProgressApi(polls), "rollout-1", 0.0) == EXIT_OK  # type: ignore[arg-type]
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    news = [line for line in lines if line.startswith(("swerl__spanlib-1", "other-2"))]
    assert news == [progress_line(a0), progress_line(b0), progress_line(a1)]
    assert "running terminal" in news[-1] and "turn 4" in news[-1]


def test_watch_goes_on_without_progress_from_an_older_api() -> None:
    polls = [(running(), None), (finished("succeeded", 0), None)]
    assert watch(ProgressApi(polls), "rollout-1", 0.0) == EXIT_OK  # type: ignore[arg-type]


def test_status_lists_the_running_trajectories(capsys: pytest.CaptureFixture[str]) -> None:
    done = event("rollout-1:0:1.a1", 9.0, phase="done", status="completed")
    live = event("rollout-1:0:0.a1", 9.0, current_tool="file_editor")
    job = {**running(), "spec": {}, "submitted_by": "alice", "created_at": 0.0}
    api = ProgressApi([(job, {"latest": [live, done]})])
    args = build_parser().parse_args(["status", "rollout-1"])
    assert cmd_status(api, args) == EXIT_OK  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert progress_line(live) in out and progress_line(done) not in out


def test_logs_merge_log_lines_and_progress_events_by_time(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs = [{"ts": 1.0, "level": "INFO", "message": "submitted by alice"},
            {"ts": 20.0, "level": "INFO", "message": "all done"}]  # fmt: skip
    progress = event("rollout-1:0:0.a1", 10.0, turn=3)
    page = {"latest": [progress], "events": [progress], "next_after": "5-0"}
    api = ProgressApi([(finished("succeeded", 0), page)], logs)
    assert cmd_logs(api, build_parser().parse_args(["logs", "rollout-1"])) == EXIT_OK  # type: ignore[arg-type]
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" ", 2)[2] for line in out] == [
        "INFO    submitted by alice",
        f"PROGRESS {progress_line(progress)}",
        "INFO    all done",
    ]
    assert api.asked == [{"after": "0"}]  # the kept history, from the start
