"""deploy/compose_lint.py: compose.yaml, the node env files and the Dockerfiles stay in the
subset docker-compose v1.29 and v2 share, and each rule catches what it is for."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy_scripts import DEPLOY, load
from tests.support.paths import REPO_ROOT

lint = load("compose_lint")
NODE_FILES = sorted((DEPLOY / "nodes").glob("node*.env"))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return lint.load_compose(REPO_ROOT / "compose.yaml")


def test_the_repository_compose_file_follows_every_rule(compose: dict[str, Any]) -> None:
    assert lint.compose_problems(compose) == []
    assert lint.main([]) == 0


def test_compose_defines_the_issue_services_and_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    expected = {"redis", "api", "manager", "adapter", "sandbox-worker", "trainer", "evaluator"}
    expected |= {"reference-engine", "sglang-0", "sglang-1", "sglang-2", "sglang-3"}
    assert set(services) == expected
    by_profile = {p: lint.active_services(compose, [p]) for p in lint.PROFILES}
    assert by_profile["head"] == ["adapter", "api", "evaluator", "manager", "redis"]
    assert by_profile["train"] == ["trainer"]
    assert by_profile["rollout"] == ["sglang-0", "sglang-1", "sglang-2", "sglang-3"]
    assert by_profile["sandbox"] == ["sandbox-worker"]
    assert by_profile["cpu"] == sorted(
        ["adapter", "api", "evaluator", "manager", "redis", "reference-engine", "sandbox-worker"]
    )


def test_the_evaluator_drives_the_hosts_engine_like_the_sandbox_worker(
    compose: dict[str, Any],
) -> None:
    """Its grading sandboxes are host containers: the same socket, the state directory at the
    same path inside and out (and the service told so), the agent-server bundle mounts."""
    evaluator, worker = compose["services"]["evaluator"], compose["services"]["sandbox-worker"]
    # socket, state dir, bundle: the worker's mounts less its task inputs (datasets, task sets)
    host_engine = [v for v in worker["volumes"] if not any(
        inputs in str(v) for inputs in (":/datasets", "/tasksets:"))]  # fmt: skip
    assert len(host_engine) == 4
    assert evaluator["volumes"][3:] == host_engine
    state = evaluator["environment"]["SWERL_EVAL_SERVICE__STATE_ROOT"]
    assert state == worker["environment"]["SWERL_WORKER__ROLLOUT__BACKEND__STATE_ROOT"]
    assert evaluator["cap_add"] == ["SYS_ADMIN"]
    assert evaluator["command"][-4:] == ["services.eval", "serve", "--backend", "docker"]


def test_redis_keeps_an_append_only_file_on_a_volume(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--appendfsync") + 1] == "everysec"
    assert "redis-data:/data" in redis["volumes"]


def test_engines_expose_metrics_and_gpu_services_reserve_gpus(compose: dict[str, Any]) -> None:
    for name in ("sglang-0", "sglang-1", "sglang-2", "sglang-3", "trainer"):
        service = compose["services"][name]
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices and all("gpu" in d["capabilities"] for d in devices)
        if name.startswith("sglang"):
            assert "--enable-metrics" in service["command"]
    trainer = compose["services"]["trainer"]
    assert trainer["command"][:4] == ["python", "-m", "trainer", "serve"]  # the trainer service
    per_job = trainer["environment"]["SWERL_TRAINER_SERVICE__COMMAND"]  # its torchrun per job
    assert per_job.startswith("[torchrun, ") and per_job.endswith(", -m, trainer, train]")
    for flag in ("--nnodes=${NNODES", "--node-rank=${NODE_RANK", "--master-addr=${MASTER_ADDR"):
        assert flag in per_job
    # the service knows the same place in the group: rank 0 claims, the others follow
    env = trainer["environment"]
    assert env["SWERL_TRAINER_SERVICE__NNODES"] == "${NNODES:-1}"
    assert env["SWERL_TRAINER_SERVICE__NODE_RANK"] == "${NODE_RANK:-0}"


def test_the_sandbox_state_dir_is_the_same_path_inside_and_out(compose: dict[str, Any]) -> None:
    worker = compose["services"]["sandbox-worker"]
    (state,) = [v for v in worker["volumes"] if isinstance(v, dict)]
    assert state["source"] == state["target"]
    assert state["bind"]["propagation"] == "rshared"
    env = worker["environment"]
    assert env["SWERL_WORKER__ROLLOUT__BACKEND__STATE_ROOT"] == state["source"]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda c: c.update(name="swerl"), "name: v2 only"),
        (lambda c: c.update(include=["other.yaml"]), "include: v2 only"),
        (lambda c: c.update(version="3.9"), "version: obsolete"),
        (lambda c: c.update(configs={}), "configs: unknown top-level key"),
        (lambda c: c["services"]["api"].update(develop={}), "services.api.develop: v2 only"),
        (lambda c: c["services"]["trainer"].update(gpus="all"), "services.trainer.gpus: v2"),
        (lambda c: c["services"]["trainer"].update(runtime="nvidia"), "trainer.runtime"),
        (lambda c: c["services"]["api"].update(build="."), "services.api.build"),
        (lambda c: c["services"]["api"].pop("healthcheck"), "services.api: no healthcheck"),
        (lambda c: c["services"]["api"].pop("image"), "services.api: no image"),
        (lambda c: c["services"]["api"].update(profiles=["gpu"]), "unknown profile 'gpu'"),
        (lambda c: c["services"]["api"].pop("profiles"), "services.api: no profiles"),
        (
            lambda c: c["services"]["api"].update(depends_on=["redis"]),
            "services.api.depends_on: use the long form",
        ),
        (
            lambda c: c["services"]["api"]["depends_on"]["redis"].update(required=False),
            "depends_on.redis: required is v2 only",
        ),
        (
            lambda c: c["services"]["api"]["depends_on"]["redis"].update(
                condition="service_started"
            ),
            "condition must be service_healthy",
        ),
        (
            lambda c: c["services"]["sandbox-worker"].update(
                depends_on={"redis": {"condition": "service_healthy"}}
            ),
            "depends_on.redis: redis is not in profile(s) sandbox",
        ),
        (
            lambda c: c["services"]["api"].update(depends_on={"nosuch": {}}),
            "depends_on.nosuch: no such service",
        ),
        (
            lambda c: c["services"]["trainer"]["deploy"]["resources"]["reservations"]["devices"][
                0
            ].update(capabilities=["compute"]),
            "without capabilities [gpu]",
        ),
        (
            lambda c: c["services"]["api"]["environment"].update(X="${A:+b}"),
            "${A:+b} is interpolation v1.29 does not understand",
        ),
        (
            lambda c: c["services"]["api"]["environment"].update(X="${A:-${B}}"),
            "is interpolation v1.29 does not understand",
        ),
    ],
)
def test_each_rule_catches_its_violation(
    compose: dict[str, Any], mutate: Any, expected: str
) -> None:
    bad = copy.deepcopy(compose)
    mutate(bad)
    problems = lint.compose_problems(bad)
    assert any(expected in p for p in problems), problems


def test_escaped_dollars_and_plain_forms_are_accepted() -> None:
    data = {"x": ["$$HOME", "${A}", "${A:-x}", "${A-x}", "${A:?why}", "${A?why}", "$PLAIN"]}
    assert lint.interpolation_problems(data) == []
    assert lint.variables(data) == {"A": True}


@pytest.mark.parametrize("path", [*NODE_FILES, DEPLOY / "nodes" / "cpu.env"], ids=lambda p: p.stem)
def test_each_env_file_sets_what_compose_needs_and_nothing_else(
    compose: dict[str, Any], path: Path
) -> None:
    assert lint.env_file_problems(path, compose) == []


def test_env_file_typos_and_missing_required_values_are_reported(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    good = lint.read_env_file(DEPLOY / "nodes" / "node4.env")
    good.pop("SWERL_WORKER_TOKEN")
    good["SWERL_WORKR_TOKEN"] = "x" * 20
    good["COMPOSE_PROFILES"] = "rollout,sandbx"
    path = tmp_path / "bad.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in good.items()))
    problems = lint.env_file_problems(path, compose)
    assert any("SWERL_WORKER_TOKEN is required by compose.yaml and not set" in p for p in problems)
    assert any("SWERL_WORKR_TOKEN is not read by compose.yaml" in p for p in problems)
    assert any("unknown profile 'sandbx'" in p for p in problems)


def test_env_files_reject_malformed_and_repeated_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.env"
    path.write_text("A=1\nnot an assignment\n")
    with pytest.raises(ValueError, match=r"x.env:2: not KEY=VALUE"):
        lint.read_env_file(path)
    path.write_text("A=1\n# comment\n\nA=2\n")
    with pytest.raises(ValueError, match=r"x.env:4: A set twice"):
        lint.read_env_file(path)


def _cluster() -> dict[str, dict[str, str]]:
    return {p.stem: lint.read_env_file(p) for p in NODE_FILES}


def test_the_node_files_describe_the_paper_layout() -> None:
    files = _cluster()
    assert sorted(files) == [f"node{i}" for i in range(8)]
    roles = {n: set(v["COMPOSE_PROFILES"].split(",")) for n, v in files.items()}
    assert [n for n in files if "head" in roles[n]] == ["node0"]
    assert sorted(n for n in files if "train" in roles[n]) == ["node0", "node1", "node2", "node3"]
    assert sorted(n for n in files if "rollout" in roles[n]) == [f"node{i}" for i in range(4, 8)]
    assert all("sandbox" in r for r in roles.values())
    assert not any({"train", "rollout"} <= r for r in roles.values())
    assert lint.cluster_problems(files) == []
    engines = yaml.safe_load(files["node0"]["SWERL_ENGINES"])
    assert len(engines) == 16  # 4 rollout nodes x 4 GPU groups


def test_cluster_inconsistencies_are_reported() -> None:
    files = _cluster()
    files["node3"]["SWERL_WORKER_TOKEN"] = "another-token-0123456789"
    files["node2"]["NODE_RANK"] = "1"
    files["node5"]["COMPOSE_PROFILES"] = "rollout,head"
    files["node6"]["NODE_NAME"] = "node7"
    files["node7"]["SGLANG_PORT_3"] = "31000"
    problems = "\n".join(lint.cluster_problems(files))
    assert "node3: SWERL_WORKER_TOKEN differs from node0" in problems
    assert "NODE_RANK [0, 1, 1, 3] must be 0..NNODES-1" in problems
    assert "exactly one node runs the head profile" in problems
    assert "NODE_NAME must differ" in problems
    assert "node5" in problems and "sandbox" in problems  # node5 lost its sandbox profile


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("Dockerfile.*")), ids=lambda p: p.name)
def test_the_dockerfiles_build_from_pinned_inputs(path: Path) -> None:
    assert lint.dockerfile_problems(path) == []


def test_unpinned_dockerfiles_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "Dockerfile.bad"
    path.write_text(
        "ARG BASE=ubuntu\nFROM ${BASE} AS build\nFROM build\nFROM debian:latest\n"
        "RUN apt-get update && pip install torch \\\n  && true\n"
        "COPY --from=build /x /y\nCOPY no/such/file /opt/\nCOPY pyproject.toml /opt/\n"
    )
    problems = lint.dockerfile_problems(path)
    assert problems == [
        "Dockerfile.bad: FROM ${BASE}: pin the base image's tag",
        "Dockerfile.bad: FROM debian:latest: pin the base image's tag",
        "Dockerfile.bad: 'pip install torch': pip install without constraints.txt or "
        "pyproject.toml's pins",
        "Dockerfile.bad: COPY no/such/file: no such file in the repo",
    ]


def test_the_prometheus_config_scrapes_the_cluster_of_the_node_files() -> None:
    files = _cluster()
    assert lint.prometheus_problems(files) == []
    files["node7"]["SGLANG_PORT_3"] = "31000"  # a moved engine the head lists...
    engines = yaml.safe_load(files["node0"]["SWERL_ENGINES"])
    engines[-1] = "http://10.0.0.17:31000"
    files["node0"]["SWERL_ENGINES"] = "[" + ",".join(engines) + "]"
    (problem,) = lint.prometheus_problems(files)  # ...and the scrape config does not
    assert "job sglang" in problem and "10.0.0.17:31000" in problem
