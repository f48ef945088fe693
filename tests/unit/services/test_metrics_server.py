"""The Prometheus endpoint of the worker, manager, evaluator and trainer services: its config
keys (validated, off by default, env and YAML overrides) and the HTTP server."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel

from sandbox_worker.config import WorkerConfig
from services.config import ConfigError, load_config
from services.eval.service_config import EvalServiceConfig
from services.manager.config import ManagerConfig
from services.metrics_server import (
    DEFAULT_ADDR,
    DEFAULT_PORTS,
    MetricsServer,
    MetricsServerError,
    serve_metrics,
    start_metrics_server,
)
from tests.support.paths import REPO_ROOT
from trainer.service.config import TrainerServiceConfig

SECTIONS: dict[str, type[BaseModel]] = {
    "worker": WorkerConfig,
    "manager": ManagerConfig,
    "eval_service": EvalServiceConfig,
    "trainer_service": TrainerServiceConfig,
}


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("swerl_test_things_total", "Things.", registry=reg).inc(3)
    return reg


@pytest.fixture
def served(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    server = start_metrics_server(registry, 0, "127.0.0.1")
    yield server
    server.close()


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_metrics_are_off_by_default_and_set_by_the_environment(section: str) -> None:
    model = SECTIONS[section]
    plain = load_config(model, section=section, environ={})
    assert (plain.metrics_port, plain.metrics_addr) == (None, DEFAULT_ADDR)  # type: ignore[attr-defined]
    env = {
        f"SWERL_{section.upper()}__METRICS_PORT": "9399",
        f"SWERL_{section.upper()}__METRICS_ADDR": "0.0.0.0",
    }
    cfg = load_config(model, section=section, environ=env)
    assert (cfg.metrics_port, cfg.metrics_addr) == (9399, "0.0.0.0")  # type: ignore[attr-defined]


@pytest.mark.parametrize("section", sorted(SECTIONS))
@pytest.mark.parametrize("port", ["0", "70000", "-1"])
def test_a_port_prometheus_cannot_scrape_is_refused_naming_the_key(section: str, port: str) -> None:
    env = {f"SWERL_{section.upper()}__METRICS_PORT": port}
    with pytest.raises(ConfigError) as err:
        load_config(SECTIONS[section], section=section, environ=env)
    text = str(err.value)
    assert f"{section}.metrics_port" in text and "1-65535" in text and "unset" in text
    assert f"SWERL_{section.upper()}__METRICS_PORT" in text


@pytest.mark.parametrize("addr", ["", "head-node", "127.0.0.1:9303", "999.1.1.1"])
def test_a_bind_address_must_be_an_ip_address(addr: str) -> None:
    with pytest.raises(ConfigError, match="metrics_addr must be an IP address"):
        load_config(WorkerConfig, section="worker", environ={"SWERL_WORKER__METRICS_ADDR": addr})


@pytest.mark.parametrize("addr", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost"])
def test_usual_bind_addresses_are_accepted(addr: str) -> None:
    assert ManagerConfig(metrics_addr=addr).metrics_addr == addr


def test_the_endpoint_serves_the_registry(served: MetricsServer) -> None:
    assert served.port > 0
    reply = httpx.get(f"http://127.0.0.1:{served.port}/metrics", timeout=10)
    assert reply.status_code == 200
    assert "swerl_test_things_total 3.0" in reply.text
    assert reply.headers["content-type"].startswith("text/plain")


def test_a_busy_port_is_a_clear_error(registry: CollectorRegistry) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsServerError) as err:
            start_metrics_server(registry, port, "127.0.0.1")
    assert f"127.0.0.1:{port}" in str(err.value) and "metrics_port" in str(err.value)


def test_no_port_serves_nothing(registry: CollectorRegistry) -> None:
    assert serve_metrics(registry, None, "127.0.0.1", logging.getLogger("t")) is None


PROMETHEUS = REPO_ROOT / "deploy" / "prometheus"
JOBS = {"swerl-manager": "manager", "swerl-evaluator": "eval_service", "swerl-worker": "worker"}


def _targets(path: Path) -> dict[str, list[str]]:
    jobs = yaml.safe_load(path.read_text())["scrape_configs"]
    return {j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]] for j in jobs}


@pytest.mark.parametrize("name", ["prometheus.yml", "prometheus-cpu.yml"])
def test_the_scrape_configs_use_each_services_metrics_port(name: str) -> None:
    targets = _targets(PROMETHEUS / name)
    for job, section in JOBS.items():
        assert targets[job], f"{name}: no {job} target"
        for target in targets[job]:
            assert target.endswith(f":{DEFAULT_PORTS[section]}"), (name, job, target)
    if name == "prometheus.yml":  # the trainer service runs in the cluster's train profile
        port = DEFAULT_PORTS["trainer_service"]
        assert [t.endswith(f":{port}") for t in targets["swerl-trainer-service"]] == [True]


def test_the_one_machine_config_scrapes_compose_services_of_the_cpu_profile() -> None:
    services = yaml.safe_load((REPO_ROOT / "compose.yaml").read_text())["services"]
    cpu = {name for name, svc in services.items() if "cpu" in svc.get("profiles", [])}
    hosts = {t.rsplit(":", 1)[0] for ts in _targets(PROMETHEUS / "prometheus-cpu.yml").values()
             for t in ts}  # fmt: skip
    assert hosts == {"api", "adapter", "manager", "evaluator", "sandbox-worker"}
    assert hosts <= cpu, f"not services of the cpu profile: {sorted(hosts - cpu)}"
