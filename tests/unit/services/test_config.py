"""The one config system: precedence, env parsing and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.config import ConfigError, StrictModel, dump_config, load_config


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

    cfg = load_config(Cfg, section="s", environ={"SWERL_S__VALUE": raw})
    assert cfg.value == expected
