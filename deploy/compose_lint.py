"""Keep compose.yaml and the node env files in the subset docker-compose v1.29 and v2 share.

``python deploy/compose_lint.py [--env-file FILE ...]`` prints every problem and exits 1 if
there is one. Rules (each a function below, each tested in tests/unit/deploy/):

* top level: only ``services``, ``volumes``, ``networks`` and ``x-*`` extension fields; no
  ``name:`` / ``include:`` (v2 only), no ``version:`` (v2 warns it is obsolete), no ``develop:``;
* GPUs only through ``deploy.resources.reservations.devices`` (``capabilities: [gpu]``), never
  ``gpus:``, ``runtime: nvidia`` or ``device_requests``;
* interpolation only ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``,
  ``${VAR?error}`` and ``$$`` (v1 has no ``${VAR:+x}`` and no nested ``${A:-${B}}``);
* every service: an ``image`` (no ``build``: images come from deploy/), a ``healthcheck``,
  ``profiles`` among :data:`PROFILES`; ``depends_on`` only in the long form with
  ``condition: service_healthy`` (no v2-only ``required`` / ``restart``), on a service with a
  healthcheck that is active in every profile the dependent one is (a dependency across
  profiles breaks ``up`` of a node that runs one without the other);
* the Prometheus scrape config (deploy/prometheus/prometheus.yml) covers what the node files
  describe (:func:`prometheus_problems`);
* Dockerfiles of deploy/ build from pinned inputs (:func:`dockerfile_problems`);
* node env files: every variable compose.yaml requires (``:?``) is set, every variable they set
  is one compose.yaml reads (a typo is an error), and the cluster files agree
  (:func:`cluster_problems`).

:func:`docker_compose_config` runs the real ``docker-compose config`` for one env file and
profile; the integration tests validate every pair with it.
"""

from __future__ import annotations

import argparse
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "compose.yaml"
NODES_DIR = REPO / "deploy" / "nodes"
PROFILES = ("head", "train", "rollout", "sandbox", "cpu")
TOP_LEVEL = ("services", "volumes", "networks")
FORBIDDEN_TOP = {
    "name": "v2 only (set COMPOSE_PROJECT_NAME in the env file or pass -p)",
    "include": "v2 only",
    "version": "obsolete in v2 (it warns); v1.29 reads the file without it",
    "develop": "v2 only",
}
FORBIDDEN_SERVICE = {
    "gpus": "v2 only: request GPUs in deploy.resources.reservations.devices",
    "runtime": "GPUs go through deploy.resources.reservations.devices, not a runtime",
    "device_requests": "not compose syntax: use deploy.resources.reservations.devices",
    "develop": "v2 only",
    "build": "images are built by the deploy/ scripts and Dockerfiles, not by compose",
}
_VAR = re.compile(r"\$(\$|\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")
_GOOD_VAR = re.compile(r"^\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^${}]*))?\}$")
_ENV_LINE = re.compile(r"^(?P<key>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")
# Node files of the reference cluster differ only in these keys.
PER_NODE_KEYS = frozenset(
    {"COMPOSE_PROFILES", "NODE_NAME", "NODE_ADDR", "NODE_RANK", "NPROC_PER_NODE", "TRAINER_GPUS"}
    | {"SWERL_REDIS_BIND", "SWERL_API_BIND", "SWERL_ADAPTER_BIND", "SWERL_API_TOKENS"}
    | {"SWERL_ENGINES", "SGLANG_TP", "SANDBOX_SLOTS", "SANDBOX_CPUS", "SANDBOX_MEMORY_MB"}
    | {f"SGLANG_{kind}_{g}" for kind in ("GPUS", "PORT") for g in range(4)}
)


def load_compose(path: Path = COMPOSE_FILE) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a mapping")
    return data


def _strings(node: Any, where: str) -> Iterable[tuple[str, str]]:
    """Every string (keys and values) of a parsed YAML tree, with its dotted location."""
    if isinstance(node, str):
        yield where, node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield where, str(key)
            yield from _strings(value, f"{where}.{key}" if where else str(key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _strings(value, f"{where}[{i}]")


def interpolation_problems(data: Mapping[str, Any]) -> list[str]:
    problems = []
    for where, text in _strings(data, ""):
        for match in _VAR.finditer(text):
            token = match.group(1)
            if token == "$" or not token.startswith("{"):
                continue
            if not _GOOD_VAR.match(token):
                problems.append(
                    f"{where}: ${token} is interpolation v1.29 does not understand (only "
                    "${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}; "
                    "no :+, no nesting)"
                )
    return problems


def variables(data: Mapping[str, Any]) -> dict[str, bool]:
    """Every ${VAR} the file reads -> whether it is required (``:?`` / ``?`` form)."""
    found: dict[str, bool] = {}
    for _, text in _strings(data, ""):
        for match in _VAR.finditer(text):
            good = _GOOD_VAR.match(match.group(1))
            if good:
                required = (good["op"] or "").endswith("?")
                found[good["name"]] = found.get(good["name"], False) or required
    return found


def _gpu_problems(name: str, service: Mapping[str, Any]) -> list[str]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    problems = []
    for device in reservations.get("devices", []):
        if "gpu" not in device.get("capabilities", []):
            problems.append(f"services.{name}: a reserved device without capabilities [gpu]")
        if "count" in device and "device_ids" in device:
            problems.append(f"services.{name}: a device with both count and device_ids")
    return problems


def _depends_problems(name: str, services: Mapping[str, Any]) -> list[str]:
    service = services[name]
    depends = service.get("depends_on", {})
    if isinstance(depends, list):
        return [f"services.{name}.depends_on: use the long form with condition: service_healthy"]
    problems = []
    mine = set(service.get("profiles", []))
    for target, spec in depends.items():
        where = f"services.{name}.depends_on.{target}"
        if target not in services:
            problems.append(f"{where}: no such service")
            continue
        extra = sorted(set(spec or {}) - {"condition"})
        if extra:
            problems.append(f"{where}: {', '.join(extra)} is v2 only")
        if (spec or {}).get("condition") != "service_healthy":
            problems.append(f"{where}: condition must be service_healthy")
        if "healthcheck" not in services[target]:
            problems.append(f"{where}: {target} has no healthcheck to wait for")
        missing = sorted(mine - set(services[target].get("profiles", [])))
        if missing:
            problems.append(f"{where}: {target} is not in profile(s) {', '.join(missing)}")
    return problems


def service_problems(name: str, services: Mapping[str, Any]) -> list[str]:
    service = services[name]
    problems = [
        f"services.{name}.{key}: {why}" for key, why in FORBIDDEN_SERVICE.items() if key in service
    ]
    if "image" not in service:
        problems.append(f"services.{name}: no image")
    if "healthcheck" not in service:
        problems.append(f"services.{name}: no healthcheck")
    profiles = service.get("profiles")
    if not profiles:
        problems.append(f"services.{name}: no profiles (every service belongs to a role)")
    for profile in profiles or []:
        if profile not in PROFILES:
            problems.append(
                f"services.{name}.profiles: unknown profile {profile!r} ({', '.join(PROFILES)})"
            )
    return problems + _gpu_problems(name, service) + _depends_problems(name, services)


def compose_problems(data: Mapping[str, Any]) -> list[str]:
    """Every rule of the module docstring that ``data`` (a parsed compose file) breaks."""
    problems = [f"{key}: {why}" for key, why in FORBIDDEN_TOP.items() if key in data]
    for key in data:
        if key not in TOP_LEVEL and key not in FORBIDDEN_TOP and not str(key).startswith("x-"):
            problems.append(f"{key}: unknown top-level key (allowed: {', '.join(TOP_LEVEL)}, x-*)")
    services = data.get("services") or {}
    if not services:
        problems.append("services: none")
    for name in services:
        problems += service_problems(name, services)
    return problems + interpolation_problems(data)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines (comments and blank lines skipped), as docker-compose reads them."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _ENV_LINE.match(line)
        if match is None:
            raise ValueError(f"{path}:{number}: not KEY=VALUE: {line!r}")
        if match["key"] in values:
            raise ValueError(f"{path}:{number}: {match['key']} set twice")
        values[match["key"]] = match["value"]
    return values


def env_file_problems(path: Path, data: Mapping[str, Any]) -> list[str]:
    """A node env file sets what compose.yaml requires and nothing it does not read."""
    used = variables(data)
    values = read_env_file(path)
    problems = [
        f"{path.name}: {var} is required by compose.yaml and not set"
        for var, required in sorted(used.items())
        if required and not values.get(var)
    ]
    for key in values:
        if key not in used and not key.startswith("COMPOSE_"):
            problems.append(f"{path.name}: {key} is not read by compose.yaml (a typo?)")
    for profile in filter(None, values.get("COMPOSE_PROFILES", "").split(",")):
        if profile not in PROFILES:
            problems.append(f"{path.name}: COMPOSE_PROFILES names unknown profile {profile!r}")
    return problems


def cluster_problems(files: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The node files of one cluster agree: cluster-wide values equal, one head node, distinct
    node names, train ranks 0..NNODES-1, every rollout node's engines listed on the head."""
    problems = []
    nodes = sorted(files)
    common = {k: v for k, v in files[nodes[0]].items() if k not in PER_NODE_KEYS}
    for node in nodes:
        values = files[node]
        for key in sorted(set(common) | {k for k in values if k not in PER_NODE_KEYS}):
            if values.get(key) != common.get(key):
                problems.append(f"{node}: {key} differs from {nodes[0]} (a cluster-wide value)")
    roles = {n: set(files[n].get("COMPOSE_PROFILES", "").split(",")) for n in nodes}
    heads = [n for n in nodes if "head" in roles[n]]
    if len(heads) != 1:
        problems.append(f"exactly one node runs the head profile, found {heads}")
    names = [files[n].get("NODE_NAME") for n in nodes]
    if len(set(names)) != len(names):
        problems.append(f"NODE_NAME must differ between nodes: {names}")
    problems += [f"{n}: no sandbox profile (a worker runs on every node)" for n in nodes
                 if "sandbox" not in roles[n]]  # fmt: skip
    ranks = sorted(int(files[n].get("NODE_RANK", -1)) for n in nodes if "train" in roles[n])
    nnodes = int(common.get("NNODES", 0))
    if ranks != list(range(nnodes)):
        problems.append(f"train nodes' NODE_RANK {ranks} must be 0..NNODES-1 (NNODES={nnodes})")
    if heads:
        problems += _engine_problems(files, roles, heads[0])
    return problems


def _engine_problems(
    files: Mapping[str, Mapping[str, str]], roles: Mapping[str, set[str]], head: str
) -> list[str]:
    listed = set(yaml.safe_load(files[head].get("SWERL_ENGINES", "[]")) or [])
    expected = set()
    for node, profiles in roles.items():
        if "rollout" in profiles:
            addr = files[node].get("NODE_ADDR", node)
            expected |= {f"http://{addr}:{files[node][f'SGLANG_PORT_{g}']}" for g in range(4)}
    if listed != expected:
        return [
            f"{head}: SWERL_ENGINES must list every rollout engine: missing "
            f"{sorted(expected - listed)}, extra {sorted(listed - expected)}"
        ]
    return []


PROMETHEUS_FILE = REPO / "deploy" / "prometheus" / "prometheus.yml"


def prometheus_problems(
    files: Mapping[str, Mapping[str, str]], path: Path = PROMETHEUS_FILE
) -> list[str]:
    """The scrape config covers the cluster the node files describe: the API and the adapter
    on the head node, every engine the head's adapter is given, and every node's exporters."""
    jobs = {j["job_name"]: j for j in yaml.safe_load(path.read_text())["scrape_configs"]}

    def targets(job: str) -> set[str]:
        return {t for sc in jobs.get(job, {}).get("static_configs", []) for t in sc["targets"]}

    head = next(n for n, v in files.items() if "head" in v.get("COMPOSE_PROFILES", ""))
    addr = files[head]["NODE_ADDR"]
    engines = yaml.safe_load(files[head].get("SWERL_ENGINES", "[]")) or []
    expected = {
        "swerl-api": {f"{addr}:{files[head].get('SWERL_API_PORT', '8300')}"},
        "swerl-adapter": {f"{addr}:{files[head].get('SWERL_ADAPTER_PORT', '8100')}"},
        "sglang": {e.removeprefix("http://") for e in engines},
        "node": {f"{v['NODE_ADDR']}:9100" for v in files.values()},
        "gpu": {f"{v['NODE_ADDR']}:9400" for v in files.values()},
    }
    return [
        f"{path.name}: job {job} scrapes {sorted(targets(job))}, the node files say {sorted(want)}"
        for job, want in expected.items()
        if targets(job) != want
    ]


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerfile_problems(path: Path, repo: Path = REPO) -> list[str]:
    """A Dockerfile of deploy/ builds from pinned inputs: every base image has an explicit tag
    (not ``latest``), every ``pip install`` takes its versions from constraints.txt or from
    pyproject.toml's pins (``requirements_from_pyproject.py``), every COPY source exists."""
    problems, args, stages = [], {}, set()
    for word, rest in _instructions(path.read_text()):
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key.strip()] = value.strip()
        elif word == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], ""), parts[0])
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.add(parts[2])
            if image not in stages and (":" not in image or image.endswith(":latest")):
                problems.append(f"{path.name}: FROM {parts[0]}: pin the base image's tag")
        elif word == "RUN":
            for segment in re.split(r"&&|;", rest):
                pinned = "constraints.txt" in segment or "requirements_from_pyproject" in segment
                if re.search(r"\bpip install\b", segment) and not pinned:
                    problems.append(
                        f"{path.name}: '{segment.strip()[:60]}': pip install without "
                        "constraints.txt or pyproject.toml's pins"
                    )
        elif word == "COPY" and not rest.startswith("--from"):
            for source in rest.split()[:-1]:
                if source != "." and not (repo / source).exists():
                    problems.append(f"{path.name}: COPY {source}: no such file in the repo")
    return problems


def docker_compose_config(
    env_file: Path, profile: str, compose: Path = COMPOSE_FILE
) -> dict[str, Any]:
    """``docker-compose --env-file ENV --profile P config``, parsed; ValueError with its
    stderr when it rejects the file."""
    cmd = ["docker-compose", "-f", str(compose), "--env-file", str(env_file)]
    res = subprocess.run([*cmd, "--profile", profile, "config"], capture_output=True, text=True)
    if res.returncode != 0:
        raise ValueError(f"docker-compose config ({env_file.name}, {profile}): {res.stderr}")
    return yaml.safe_load(res.stdout)


def active_services(config: Mapping[str, Any], profiles: Iterable[str]) -> list[str]:
    wanted = set(profiles)
    return sorted(
        name
        for name, service in config["services"].items()
        if wanted & set(service.get("profiles", []))
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python deploy/compose_lint.py",
        description="Check compose.yaml and node env files against the v1.29/v2 subset.",
    )
    parser.add_argument("--compose", type=Path, default=COMPOSE_FILE, help="the compose file")
    parser.add_argument(
        "--env-file", type=Path, action="append", default=None,
        help="node env file to check (repeatable; default deploy/nodes/*.env)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    data = load_compose(args.compose)
    envs = args.env_file or sorted(NODES_DIR.glob("*.env"))
    problems = compose_problems(data)
    for env in envs:
        problems += env_file_problems(env, data)
    cluster = {p.stem: read_env_file(p) for p in envs if re.fullmatch(r"node\d+", p.stem)}
    if cluster:
        problems += cluster_problems(cluster) + prometheus_problems(cluster)
    for dockerfile in sorted((REPO / "deploy").glob("Dockerfile.*")):
        problems += dockerfile_problems(dockerfile)
    print("\n".join(problems) or f"ok: {args.compose.name} and {len(envs)} env file(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
