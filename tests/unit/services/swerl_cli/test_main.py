"""The ``swerl`` argument parsing: specs built from flags, usage errors exit 2, help teaches."""

from __future__ import annotations

import tomllib
from importlib import import_module
from pathlib import Path

import pytest

from services.swerl_cli.errors import EXIT_UNREACHABLE, EXIT_USAGE, CliError
from services.swerl_cli.main import build_parser, main, spec_from_args
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
    assert "cannot reach the API at http://127.0.0.1:9" in capsys.readouterr().err


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
