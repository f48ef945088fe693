"""The ``swerl`` argument parsing: specs built from flags, usage errors exit 2, help teaches."""

from __future__ import annotations

import tomllib
from importlib import import_module
from pathlib import Path

import pytest

from services.swerl_cli.errors import (
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
)
from services.swerl_cli.main import build_parser, cmd_submit, main, spec_from_args, watch
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
