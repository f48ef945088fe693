"""Configs and command lines of the services: one file for a whole node, clear errors."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from sandbox_worker.__main__ import main as worker_main
from sandbox_worker.config import WorkerConfig, default_node_name
from services.config import SECTIONS, ConfigError, load_config, section_models
from services.manager.__main__ import main as manager_main
from services.manager.config import ManagerConfig
from services.queue.config import QueueConfig
from services.queue.connection import backoff_delay, connect
from tests.support.node_config import WHOLE_NODE, assert_holds, write_node_config

# The config module of each service; importing it registers the service's section.
SERVICE_CONFIGS = {
    "adapter": "adapter.config",
    "api": "services.api.config",
    "manager": "services.manager.config",
    "worker": "sandbox_worker.config",
    "trainer": "trainer.config",
    "publish": "trainer.publish.config",
    "train": "trainer.loop.config",
    "trainer_service": "trainer.service.config",
    "eval_service": "services.eval.service_config",
}


def test_every_section_is_registered_by_its_service() -> None:
    """The names in services.config and the services' models agree, one for one."""
    assert sorted(SERVICE_CONFIGS) == sorted(SECTIONS) == sorted(WHOLE_NODE)
    for module in SERVICE_CONFIGS.values():
        importlib.import_module(module)
    registered = section_models()
    assert {name: model.__module__ for name, model in registered.items()} == SERVICE_CONFIGS


@pytest.mark.parametrize("section", SECTIONS)
def test_one_file_configures_every_service_of_a_node(section: str, tmp_path: Path) -> None:
    importlib.import_module(SERVICE_CONFIGS[section])
    model = section_models()[section]
    cfg = load_config(model, section=section, path=write_node_config(tmp_path), environ={})
    assert_holds(cfg.model_dump(mode="json"), WHOLE_NODE[section])


def test_worker_heartbeat_must_fit_twice_in_the_ttl() -> None:
    with pytest.raises(ValueError, match=r"at most half of queue\.heartbeat_ttl_s"):
        WorkerConfig(heartbeat_interval_s=6, queue={"heartbeat_ttl_s": 10})
    assert WorkerConfig(heartbeat_interval_s=5, queue={"heartbeat_ttl_s": 10}).slots == 1


def test_queue_prefix_is_validated_and_gets_its_separator() -> None:
    assert QueueConfig(prefix="t1").prefix == "t1:" == QueueConfig(prefix="t1:").prefix
    with pytest.raises(ValueError, match="String should match pattern"):
        QueueConfig(prefix="has space:")


def test_env_overrides_reach_nested_queue_settings() -> None:
    cfg = load_config(
        ManagerConfig,
        section="manager",
        environ={"SWERL_MANAGER__PREFETCH": "3", "SWERL_MANAGER__QUEUE__PREFIX": "t1"},
    )
    assert (cfg.prefetch, cfg.queue.prefix) == (3, "t1:")
    with pytest.raises(ConfigError, match=r"manager.prefetch"):
        load_config(ManagerConfig, section="manager", environ={"SWERL_MANAGER__PREFETCH": "-1"})


def test_default_node_name_is_a_valid_node() -> None:
    assert WorkerConfig(node=default_node_name()).node


def test_connect_rejects_a_non_redis_url() -> None:
    with pytest.raises(ValueError, match="not a Redis URL"):
        connect("http://127.0.0.1:6379")


def test_backoff_grows_and_is_capped() -> None:
    assert backoff_delay(1, cap_s=2.0) <= 0.1
    assert all(1.0 <= backoff_delay(40, cap_s=2.0) <= 2.0 for _ in range(50))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slots", "0"], "worker.slots: Input should be greater than or equal to 1"),
        (["--node", "bad name"], "worker.node: String should match pattern"),
        (["--redis", "http://x"], "worker.redis_url: String should match pattern"),
    ],
)
def test_worker_cli_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert worker_main(argv) == 2
    assert message in capsys.readouterr().err


def test_worker_cli_missing_task_instances_is_a_start_error(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWERL_WORKER__ROLLOUT__INSTANCES", '["/nonexistent/instances.jsonl"]')
    assert worker_main(["--backend", "docker", "--redis", "redis://127.0.0.1:1/0"]) == 2
    assert "cannot load the task instances" in capsys.readouterr().err


def test_worker_cli_unknown_backend_is_an_argparse_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        worker_main(["--backend", "kvm"])
    assert exit_.value.code == 2
    assert "invalid choice: 'kvm'" in capsys.readouterr().err


def test_manager_cli_errors_and_print_config(capsys: pytest.CaptureFixture) -> None:
    assert manager_main(["--prefetch", "-1"]) == 2
    assert "manager.prefetch: Input should be greater than or equal to 0" in capsys.readouterr().err
    assert manager_main(["--prefix", "bad prefix"]) == 2
    assert "manager.queue.prefix: String should match pattern" in capsys.readouterr().err
    assert manager_main(["--print-config", "--prefetch", "4"]) == 0
    assert "prefetch: 4" in capsys.readouterr().out
