"""The real ``docker-compose config`` (v1.29, the one this machine has) accepts compose.yaml with
every node env file and every profile, and the environment it gives each service is a valid
configuration of that service (its own config model, strict: a misspelled key is an error)."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from adapter.config import AdapterConfig
from sandbox_worker.config import WorkerConfig
from services.api.config import ApiConfig
from services.config import ConfigError, load_config
from services.manager.config import ManagerConfig
from tests.support.deploy_scripts import DEPLOY, load
from tests.support.paths import REPO_ROOT
from trainer.config import TrainerConfig
from trainer.publish.config import PublishConfig
from trainer.service.config import TrainerServiceConfig

pytestmark = pytest.mark.slow

lint = load("compose_lint")
ENV_FILES = sorted((DEPLOY / "nodes").glob("*.env"))
# The services that read a swerl config section, and the sections they read.
SECTIONS: dict[str, list[tuple[str, type[BaseModel]]]] = {
    "adapter": [("adapter", AdapterConfig)],
    "api": [("api", ApiConfig)],
    "manager": [("manager", ManagerConfig)],
    "sandbox-worker": [("worker", WorkerConfig)],
    "trainer": [
        ("trainer_service", TrainerServiceConfig),
        ("manager", ManagerConfig),
        ("publish", PublishConfig),
        ("trainer", TrainerConfig),
    ],
}


@pytest.fixture(scope="module", autouse=True)
def _docker_compose_installed() -> None:
    assert shutil.which("docker-compose"), "docker-compose missing: run deploy/dev/setup.sh system"


@functools.cache
def resolved(env_file: Path, profile: str) -> dict[str, Any]:
    return lint.docker_compose_config(env_file, profile)


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.stem)
def test_docker_compose_accepts_every_profile(env_file: Path) -> None:
    values = lint.read_env_file(env_file)
    own = values["COMPOSE_PROFILES"].split(",")
    for profile in lint.PROFILES:
        config = resolved(env_file, profile)
        active = lint.active_services(config, [profile])
        assert active, (env_file.name, profile)
        for name in active:
            assert "healthcheck" in config["services"][name], name
    # The node's own roles: a worker everywhere; GPU services only where the layout puts them.
    mine = set(lint.active_services(resolved(env_file, own[0]), own))
    assert "sandbox-worker" in mine
    assert ("trainer" in mine) == ("train" in own)
    assert ("redis" in mine) == ("head" in own or "cpu" in own)


def _mount(volume: str | dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(target, long form) of a volume as docker-compose config prints it (either form)."""
    if isinstance(volume, dict):
        return volume["target"], volume
    source, target, *_ = volume.split(":")
    return target, {"source": source, "target": target}


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


@pytest.mark.parametrize("env_file", ENV_FILES, ids=lambda p: p.stem)
def test_each_service_environment_is_a_valid_config(env_file: Path) -> None:
    profile = lint.read_env_file(env_file)["COMPOSE_PROFILES"].split(",")[0]
    services = resolved(env_file, profile)["services"]
    for name, sections in SECTIONS.items():
        env = _environment(services[name])
        path = REPO_ROOT / "deploy" / "config" / "trainer.yaml" if name == "trainer" else None
        for section, model in sections:
            config = load_config(model, section=section, path=path, environ=env)
            assert isinstance(config, model)
    values = lint.read_env_file(env_file)
    if "train" in values["COMPOSE_PROFILES"].split(","):  # the trainer service: node's torchrun
        trainer_env = _environment(services["trainer"])
        service = load_config(TrainerServiceConfig, section="trainer_service", environ=trainer_env)
        assert service.command[0] == "torchrun"
        assert service.command[-3:] == ["-m", "trainer", "train"]
        assert f"--node-rank={values['NODE_RANK']}" in service.command
        assert f"--nnodes={values['NNODES']}" in service.command
        assert services["trainer"]["command"][:4] == ["python", "-m", "trainer", "serve"]
    worker = load_config(
        WorkerConfig, section="worker", environ=_environment(services["sandbox-worker"])
    )
    assert worker.node == lint.read_env_file(env_file)["NODE_NAME"]
    mounts = dict(map(_mount, services["sandbox-worker"]["volumes"]))
    state = mounts[str(worker.rollout.backend.state_root)]  # mounted at its own path
    assert state["source"] == state["target"] and state["bind"]["propagation"] == "rshared"
    for path in worker.rollout.instances:  # the task files are inside the datasets mount
        assert path.startswith("/datasets/") and "/datasets" in mounts


def test_a_misspelled_compose_key_fails_the_service_config(tmp_path: Path) -> None:
    """The check above can fail: a key the worker does not have is rejected by name."""
    env = _environment(
        resolved(DEPLOY / "nodes" / "node4.env", "sandbox")["services"]["sandbox-worker"]
    )
    env["SWERL_WORKER__SLOT"] = "4"
    with pytest.raises(ConfigError, match="slot"):
        load_config(WorkerConfig, section="worker", environ=env)


def test_a_missing_required_value_is_rejected_by_docker_compose(tmp_path: Path) -> None:
    values = lint.read_env_file(DEPLOY / "nodes" / "node2.env")
    values.pop("SWERL_ADMIN_TOKEN")
    bad = tmp_path / "node2.env"
    bad.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    with pytest.raises(ValueError, match="set SWERL_ADMIN_TOKEN"):
        lint.docker_compose_config(bad, "train")
