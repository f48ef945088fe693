"""The one config system: precedence, env parsing, the root schema of sections, clear errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from services import config
from services.config import (
    SECTIONS,
    ConfigError,
    StrictModel,
    dump_config,
    load_config,
    register_section,
)
from tests.support.paths import REPO_ROOT


class Limits(StrictModel):
    max_steps: int = 300
    wall_time_s: float = 3600.0


class WorkerCfg(StrictModel):
    node: str = "node-0"
    slots: int = 4
    tags: list[str] = []
    limits: Limits = Limits()
    admin_token: str = ""
    default_max_tokens: int = 512


def test_defaults_without_any_source() -> None:
    cfg = load_config(WorkerCfg, section="worker", environ={})
    assert cfg == WorkerCfg()


def test_precedence_yaml_then_env_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "swerl.yaml"
    f.write_text("worker:\n  node: a\n  slots: 2\n  limits: {max_steps: 10}\nadapter: {port: 1}\n")
    env = {"SWERL_WORKER__SLOTS": "6", "SWERL_WORKER__LIMITS__WALL_TIME_S": "12.5"}
    cfg = load_config(WorkerCfg, section="worker", path=f, environ=env, overrides={"node": "b"})
    assert (cfg.node, cfg.slots) == ("b", 6)
    assert cfg.limits == Limits(max_steps=10, wall_time_s=12.5)


def test_config_file_from_env_variable(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("worker:\n  tags: [x, y]\n")
    cfg = load_config(WorkerCfg, section="worker", environ={"SWERL_CONFIG": str(f)})
    assert cfg.tags == ["x", "y"]


def test_none_overrides_are_ignored() -> None:
    cfg = load_config(WorkerCfg, section="worker", environ={}, overrides={"slots": None})
    assert cfg.slots == 4


def test_errors_name_key_value_and_env_variable() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(WorkerCfg, section="worker", environ={"SWERL_WORKER__SLOTS": "many"})
    msg = str(err.value)
    assert "worker.slots" in msg and "'many'" in msg and "SWERL_WORKER__SLOTS" in msg


def test_unknown_keys_are_errors(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("worker:\n  slotz: 3\n")
    with pytest.raises(ConfigError, match=r"worker\.slotz"):
        load_config(WorkerCfg, section="worker", path=f, environ={})


@pytest.mark.parametrize(
    ("text", "match"),
    [("worker: [1, 2]\n", "must be a mapping"), ("- a\n", "must hold a mapping"),
     ("a: [\n", "not valid YAML")],
)  # fmt: skip
def test_bad_files_are_clear(tmp_path: Path, text: str, match: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(WorkerCfg, section="worker", path=f, environ={})


def test_missing_file_is_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(WorkerCfg, section="worker", path=tmp_path / "nope.yaml", environ={})


def test_dump_masks_secrets() -> None:
    text = dump_config(WorkerCfg(admin_token="s3cret"))
    assert "s3cret" not in text and "admin_token: '***'" in text
    assert "default_max_tokens: 512" in text


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("swerl:", "swerl:"), ("a: b", "a: b"), ("- x", "- x"), ("[x, y]", ["x", "y"]), ("", "")],
)
def test_env_values_are_scalars_unless_flow_collections(raw: str, expected: object) -> None:
    class Cfg(StrictModel):
        value: str | list[str] = "default"

    cfg = load_config(Cfg, section="worker", environ={"SWERL_WORKER__VALUE": raw})
    assert cfg.value == expected


# --- the root schema: every section of a file and of SWERL_<SECTION>__ must be a known one -----


def error_of(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> str:
    """The ConfigError message of loading the worker section of a file holding ``text``."""
    f = tmp_path / "swerl.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(WorkerCfg, section="worker", path=f, environ=environ or {})
    return str(err.value)


def test_a_misspelled_yaml_section_is_an_error_naming_the_closest(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "worker:\n  slots: 2\nadpater: {port: 9999}\n")
    f = tmp_path / "swerl.yaml"
    assert msg.startswith("unknown configuration section:")
    assert f"section 'adpater' of config file {f}: did you mean 'adapter'?" in msg


def test_a_misspelled_env_section_is_an_error_naming_the_closest(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "", {"SWERL_ADPATER__PORT": "1"})
    assert "environment variable SWERL_ADPATER__PORT: did you mean SWERL_ADAPTER__PORT?" in msg


def test_every_unknown_section_is_named_at_once(tmp_path: Path) -> None:
    env = {"SWERL_WROKER__QUEUE__PREFIX": "x", "SWERL_QQQ__A": "1"}
    msg = error_of(tmp_path, "Worker: {}\nzzz: {}\n7: {}\n", env)
    f = tmp_path / "swerl.yaml"
    assert "section 'Worker' of config file" in msg and "did you mean 'worker'?" in msg
    assert "did you mean SWERL_WORKER__QUEUE__PREFIX?" in msg
    # No close name: the line names the culprit, and the message lists the sections.
    assert f"section 'zzz' of config file {f}\n" in msg
    assert f"section '7' of config file {f}\n" in msg
    assert "environment variable SWERL_QQQ__A\n" in msg
    assert msg.endswith("  sections: " + ", ".join(SECTIONS))


def test_other_swerl_variables_are_not_configuration() -> None:
    """Only SWERL_<SECTION>__ is config; the tools' single-underscore variables are left alone."""
    env = {
        "SWERL_CACHE_DIR": "/tmp/cache",
        "SWERL_SGLANG_URL": "http://127.0.0.1:1",
        "SWERL_LONG_TOKENS": "3000",
        "SWERL_IMAGE_NAMESPACE": "t",
        "SWERL_WORKER_SLOTS": "9",  # one underscore: not the worker's slots
        "SWERL_WORKER__SLOTS": "3",
    }
    assert load_config(WorkerCfg, section="worker", environ=env) == WorkerCfg(slots=3)


def test_a_known_section_of_another_service_is_not_read(tmp_path: Path) -> None:
    f = tmp_path / "swerl.yaml"
    f.write_text("worker: {slots: 2}\nmanager: {slots: [not, an, int]}\n")
    env = {"SWERL_ADAPTER__SLOTS": "x"}
    assert load_config(WorkerCfg, section="worker", path=f, environ=env) == WorkerCfg(slots=2)


def test_reading_an_unknown_section_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match=r"unknown config section 'wroker'.*SECTIONS"):
        load_config(WorkerCfg, section="wroker", environ={})


@pytest.mark.parametrize(
    ("text", "env", "hint"),
    [
        ("worker:\n  slotz: 3\n", {}, "worker.slotz: Extra inputs are not permitted (did you "
         "mean 'slots'?)"),
        ("", {"SWERL_WORKER__LIMITS__MAX_STEPZ": "3"},
         "worker.limits.max_stepz: Extra inputs are not permitted (did you mean 'max_steps'?)"),
    ],
)  # fmt: skip
def test_an_unknown_key_names_the_closest_key(
    tmp_path: Path, text: str, env: dict[str, str], hint: str
) -> None:
    assert hint in error_of(tmp_path, text, env)


def test_an_unknown_key_without_a_close_one_has_no_hint(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "worker:\n  limits: {qqqq: 1}\n")
    assert "worker.limits.qqqq: Extra inputs are not permitted  [env:" in msg


def test_values_that_may_be_secrets_are_not_echoed(tmp_path: Path) -> None:
    """A bad secret's value, or an unknown key's (a misspelled token), stays out of the logs."""
    msg = error_of(
        tmp_path, "worker:\n  admin_tokn: s3cret-a\n  admin_token: [s3cret-b]\n  slots: x\n"
    )
    assert "worker.admin_tokn: Extra inputs are not permitted (did you mean 'admin_token'?)" in msg
    assert "worker.admin_token: Input should be a valid string  [env:" in msg
    assert "s3cret" not in msg
    assert "worker.slots: Input should be a valid integer, unable to parse string as an integer " \
        "(got 'x')" in msg  # fmt: skip


def test_register_section_accepts_only_known_names_and_one_model_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(config, "_MODELS", {})
    with pytest.raises(ValueError, match=r"'wroker' is not in services.config.SECTIONS"):
        register_section("wroker", WorkerCfg)
    register_section("worker", WorkerCfg)
    register_section("worker", WorkerCfg)  # importing the module again is fine
    with pytest.raises(ValueError, match=r"'worker' is already registered to .*\.WorkerCfg"):
        register_section("worker", Limits)
    assert config.section_models() == {"worker": WorkerCfg}


@pytest.mark.slow  # starts the manager
def test_the_readme_lists_every_section_and_the_real_error() -> None:
    # The README named five of the nine sections (issue 33, point 10): the list and the sample
    # error must follow services.config.SECTIONS.
    readme = (REPO_ROOT / "README.md").read_text()
    listing = readme.split("One file configures a whole node: the sections are", 1)[1]
    listing = listing.split("(`services.config.SECTIONS`", 1)[0]
    assert re.findall(r"`(\w+)`", listing) == list(config.SECTIONS)
    real = subprocess.run(
        [sys.executable, "-m", "services.manager"],
        env={"SWERL_ADPATER__PORT": "1", "PATH": "/usr/bin:/bin"},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert real.returncode == 2
    assert real.stderr.strip() and real.stderr.strip() in readme
