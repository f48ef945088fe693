"""The shared start-up of the service entry points (services/cli.py) and its use by all three.

Each service must behave the same at start-up: a bad value exits 2 naming the key,
``--print-config`` prints YAML that reads back to the same configuration, and ``--log-level``
reaches the logs.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from adapter.__main__ import main as adapter_main
from adapter.config import AdapterConfig
from sandbox_worker.__main__ import main as worker_main
from sandbox_worker.config import WorkerConfig
from services.cli import (
    add_common_arguments,
    configure_logging,
    load_cli_config,
    log_format,
    nest_overrides,
    service_parser,
)
from services.config import StrictModel, load_config
from services.manager.__main__ import main as manager_main
from services.manager.config import ManagerConfig
from tests.support.node_config import WHOLE_NODE, assert_holds, write_node_config
from tests.support.paths import REPO_ROOT

REPO = REPO_ROOT
Main = Callable[[list[str] | None], int]


@pytest.fixture(autouse=True)
def _no_swerl_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Configuration from the caller's environment must not leak into these tests."""
    for key in list(os.environ):
        if key.startswith("SWERL_"):
            monkeypatch.delenv(key)


@pytest.fixture
def _services_must_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``main`` that goes past ``--print-config`` fails the test instead of serving forever."""

    def started(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the service started although it should have exited")

    monkeypatch.setattr("services.manager.__main__.connect", started)
    monkeypatch.setattr("sandbox_worker.__main__.connect", started)
    monkeypatch.setattr("adapter.__main__.configure_logging", started)


@contextmanager
def bare_root_logger() -> Iterator[logging.Logger]:
    """The root logger without the test runner's handlers, restored afterwards.

    A context manager, not a fixture: pytest adds its handlers when the test body starts.
    """
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers = []
    try:
        yield root
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers = saved_handlers
        root.setLevel(saved_level)


class Small(StrictModel):
    port: int = 1
    log_level: str = "INFO"


class Nested(BaseModel):
    prefix: str = "swerl:"


class WithNested(StrictModel):
    name: str = "a"
    queue: Nested = Nested()


def _parser(
    section: str = "manager", log_levels: tuple[str, ...] | None = None
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="t")
    add_common_arguments(p, section, log_levels=log_levels)
    return p


# --- bad values: exit 2, the key named --------------------------------------------------------


@pytest.mark.parametrize(
    ("main", "argv", "yaml_text", "message"),
    [
        (manager_main, ["--prefetch", "65"], None, "manager.prefetch: Input should be less"),
        (worker_main, [], "worker:\n  slots: 0\n", "worker.slots: Input should be greater"),
        (
            adapter_main,
            ["--engines", "http://127.0.0.1:1", "--model", "m", "--port", "0"],
            None,
            "adapter.port: Input should be greater than or equal to 1",
        ),
        (adapter_main, ["--model", "m"], None, "adapter.engines: Field required"),
        (
            adapter_main,
            ["--engines", "http://127.0.0.1:1", "--model", "m"],
            "adapter:\n  log_level: chatty\n",
            "adapter.log_level: unknown log level 'chatty'",
        ),
    ],
)
@pytest.mark.usefixtures("_services_must_not_start")
def test_bad_value_exits_2_and_names_the_key(
    main: Main,
    argv: list[str],
    yaml_text: str | None,
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if yaml_text is not None:
        cfg_file = tmp_path / "swerl.yaml"
        cfg_file.write_text(yaml_text)
        argv = [*argv, "--config", str(cfg_file)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: invalid configuration")
    assert message in captured.err
    assert captured.out == ""


@pytest.mark.usefixtures("_services_must_not_start")
def test_bad_environment_value_is_named_with_its_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWERL_MANAGER__PREFETCH", "lots")
    assert manager_main(["--print-config"]) == 2
    err = capsys.readouterr().err
    assert "manager.prefetch" in err and "'lots'" in err and "SWERL_MANAGER__PREFETCH" in err


@pytest.mark.usefixtures("_services_must_not_start")
def test_unreadable_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert worker_main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "error: cannot read config file" in capsys.readouterr().err


# --- unknown sections: exit 2, the closest section named -------------------------------------

# Each service with the flags it needs to get as far as its configuration.
SERVICES = [
    pytest.param(manager_main, [], id="manager"),
    pytest.param(worker_main, [], id="worker"),
    pytest.param(adapter_main, ["--engines", "http://127.0.0.1:1", "--model", "m"], id="adapter"),
]


@pytest.mark.parametrize(("main", "argv"), SERVICES)
@pytest.mark.usefixtures("_services_must_not_start")
def test_a_misspelled_section_in_the_file_exits_2_naming_the_closest(
    main: Main, argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg_file = tmp_path / "swerl.yaml"
    cfg_file.write_text("adpater: {port: 9999}\n")
    assert main([*argv, "--config", str(cfg_file), "--print-config"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: unknown configuration section:")
    assert f"section 'adpater' of config file {cfg_file}: did you mean 'adapter'?" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(("main", "argv"), SERVICES)
@pytest.mark.usefixtures("_services_must_not_start")
def test_a_misspelled_section_in_the_environment_exits_2_naming_the_closest(
    main: Main, argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWERL_ADPATER__PORT", "1")
    assert main([*argv, "--print-config"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error: unknown configuration section:")
    assert "SWERL_ADPATER__PORT: did you mean SWERL_ADAPTER__PORT?" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    ("main", "section"),
    [(manager_main, "manager"), (worker_main, "worker"), (adapter_main, "adapter")],
)
@pytest.mark.usefixtures("_services_must_not_start")
def test_every_service_reads_its_section_of_a_whole_node_file(
    main: Main, section: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node_file = write_node_config(tmp_path)
    assert main(["--config", str(node_file), "--print-config"]) == 0
    assert_holds(yaml.safe_load(capsys.readouterr().out), WHOLE_NODE[section])


# --- --print-config: YAML that reads back to the same config ----------------------------------


# Secrets are printed as "***" (the output goes to logs); the round trip puts them back.
WORKER_SECRETS = [("rollout", "openhands", "api_key")]


@pytest.mark.parametrize(
    ("main", "model", "section", "argv", "expected", "secrets"),
    [
        (
            manager_main,
            ManagerConfig,
            "manager",
            ["--prefetch", "4", "--prefix", "t9", "--log-level", "DEBUG"],
            {"prefetch": 4, "queue": {"prefix": "t9:"}, "log_level": "DEBUG"},
            [],
        ),
        (
            worker_main,
            WorkerConfig,
            "worker",
            ["--node", "n7", "--slots", "3", "--backend", "simulated", "--grace", "1.5",
             "--prefix", "t9", "--log-level", "WARNING"],
            {"node": "n7", "slots": 3, "backend": "simulated", "shutdown_grace_s": 1.5,
             "queue": {"prefix": "t9:"}, "log_level": "WARNING"},
            WORKER_SECRETS,
        ),
        (
            adapter_main,
            AdapterConfig,
            "adapter",
            ["--engines", "http://127.0.0.1:1, http://127.0.0.1:2/", "--model", "/m",
             "--port", "8199", "--served-model-name", "x", "--log-level", "debug"],
            {"engines": ["http://127.0.0.1:1", "http://127.0.0.1:2"], "model": "/m",
             "port": 8199, "served_model_name": "x", "log_level": "debug"},
            [],
        ),
    ],
)  # fmt: skip
@pytest.mark.usefixtures("_services_must_not_start")
def test_print_config_reads_back_to_the_same_config(
    main: Main,
    model: type[BaseModel],
    section: str,
    argv: list[str],
    expected: dict[str, Any],
    secrets: list[tuple[str, ...]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*argv, "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    for key, value in expected.items():
        if isinstance(value, dict):
            assert {k: printed[key][k] for k in value} == value
        else:
            assert printed[key] == value
    want = load_config(model, section=section, overrides=expected, environ={})
    for path in secrets:
        *parents, leaf = path
        printed_node, real = printed, want.model_dump(mode="json")
        for part in parents:
            printed_node, real = printed_node[part], real[part]
        assert printed_node[leaf] == "***"
        printed_node[leaf] = real[leaf]
    cfg_file = tmp_path / "printed.yaml"
    cfg_file.write_text(yaml.safe_dump({section: printed}))
    assert load_config(model, section=section, path=cfg_file, environ={}) == want


@pytest.mark.usefixtures("_services_must_not_start")
def test_print_config_includes_the_config_file_and_masks_secrets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg_file = tmp_path / "swerl.yaml"
    cfg_file.write_text("adapter:\n  default_max_tokens: 7\n  admin_token: s3cret\n")
    argv = ["--engines", "http://127.0.0.1:1", "--model", "/m", "--config", str(cfg_file)]
    assert adapter_main([*argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    assert printed["default_max_tokens"] == 7
    assert printed["admin_token"] == "***"
    assert "s3cret" not in out


@pytest.mark.parametrize("module", ["adapter", "services.manager", "sandbox_worker"])
@pytest.mark.slow  # starts each service's CLI
def test_every_service_documents_the_common_flags(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for flag in ("--config FILE", "--log-level", "--print-config"):
        assert flag in result.stdout
    assert "print the effective config, exit" in result.stdout


# --- the log level ----------------------------------------------------------------------------


@pytest.mark.usefixtures("_services_must_not_start")
def test_log_level_flag_sets_the_config_level(capsys: pytest.CaptureFixture[str]) -> None:
    assert manager_main(["--log-level", "ERROR", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["log_level"] == "ERROR"
    with pytest.raises(SystemExit) as exit_:
        manager_main(["--log-level", "LOUD"])
    assert exit_.value.code == 2
    assert "invalid choice: 'LOUD'" in capsys.readouterr().err


def test_configure_logging_sets_level_and_format(capsys: pytest.CaptureFixture[str]) -> None:
    with bare_root_logger() as root:
        configure_logging("warning", tag="node3")
        assert root.level == logging.WARNING
        log = logging.getLogger("swerl.test")
        log.info("quiet line")
        log.warning("loud line")
    err = capsys.readouterr().err
    assert "quiet line" not in err
    assert "WARNING [node3] swerl.test: loud line" in err


def test_configure_logging_rejects_an_unknown_level() -> None:
    with bare_root_logger() as root:
        with pytest.raises(ValueError, match="unknown log level 'chatty'"):
            configure_logging("chatty")
        assert root.handlers == []


def test_log_format_without_tag_has_no_brackets() -> None:
    assert log_format() == "%(asctime)s %(levelname)s %(name)s: %(message)s"
    assert "[w1] " in log_format("w1")


@pytest.mark.parametrize(("level", "shown"), [("info", True), ("warning", False)])
@pytest.mark.slow  # starts the adapter CLI
def test_adapter_log_level_flag_reaches_its_logs(level: str, shown: bool, tmp_path: Path) -> None:
    """End to end: the adapter logs its configuration at INFO before it loads the tokenizer."""
    result = subprocess.run(
        [sys.executable, "-m", "adapter", "--engines", "http://127.0.0.1:1",
         "--model", str(tmp_path), "--log-level", level],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == 2
    assert "cannot load the model's tokenizer" in result.stderr
    assert ("INFO adapter: configuration:" in result.stderr) is shown


# --- the helpers' own boundaries --------------------------------------------------------------


def test_nest_overrides_nests_dotted_keys_and_drops_unset_flags() -> None:
    flat = {"a": 1, "q.prefix": "p", "q.ttl": None, "b": None, "x.y.z": 2}
    assert nest_overrides(flat) == {"a": 1, "q": {"prefix": "p"}, "x": {"y": {"z": 2}}}
    assert nest_overrides({"q.prefix": None}) == {}


@pytest.mark.parametrize(
    ("flat", "message"),
    [
        ({"q.": 1}, "empty part"),
        ({".q": 1}, "empty part"),
        ({"q": 1, "q.prefix": "p"}, "conflicts with override 'q'"),
        ({"q.prefix": "p", "q": 1}, "conflicts with a nested override"),
    ],
)
def test_nest_overrides_rejects_bad_keys(flat: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nest_overrides(flat)


def test_load_cli_config_merges_flags_file_and_log_level(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("worker:\n  name: from-file\n  queue: {prefix: f}\n")
    p = argparse.ArgumentParser()
    add_common_arguments(p, "worker")
    args = p.parse_args(["--config", str(cfg_file)])
    cfg = load_cli_config(WithNested, "worker", args, {"queue.prefix": "flag:"})
    assert cfg == WithNested(name="from-file", queue=Nested(prefix="flag:"))
    small = load_cli_config(Small, "manager", _parser().parse_args(["--log-level", "debug"]), {})
    assert small == Small(log_level="debug")


def test_load_cli_config_needs_the_common_arguments() -> None:
    args = argparse.Namespace(config=None, log_level=None)
    with pytest.raises(ValueError, match=r"'print_config'.*add_common_arguments"):
        load_cli_config(Small, "manager", args, {})


def test_load_cli_config_refuses_overrides_of_the_common_flags() -> None:
    args = _parser().parse_args([])
    with pytest.raises(ValueError, match=r"common flags: \['log_level'\]"):
        load_cli_config(Small, "manager", args, {"log_level": "DEBUG"})


def test_add_common_arguments_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="section must be"):
        add_common_arguments(argparse.ArgumentParser(), "")
    with pytest.raises(ValueError, match="at least one level"):
        add_common_arguments(argparse.ArgumentParser(), "s", log_levels=())


def test_add_common_arguments_choices_are_enforced(capsys: pytest.CaptureFixture[str]) -> None:
    p = _parser(log_levels=("INFO", "ERROR"))
    assert p.parse_args(["--log-level", "ERROR"]).log_level == "ERROR"
    with pytest.raises(SystemExit):
        p.parse_args(["--log-level", "DEBUG"])
    assert "invalid choice: 'DEBUG'" in capsys.readouterr().err


def test_service_parser_keeps_the_help_layout() -> None:
    text = "first line\n\n  an indented example   # with spacing\n"
    help_text = service_parser("python -m x", "what x does", text).format_help()
    assert "what x does" in help_text
    assert "\n  an indented example   # with spacing\n" in help_text


@pytest.mark.parametrize(("prog", "description"), [("", "d"), ("p", " ")])
def test_service_parser_needs_prog_and_description(prog: str, description: str) -> None:
    with pytest.raises(ValueError, match="needs a prog name and a description"):
        service_parser(prog, description)
