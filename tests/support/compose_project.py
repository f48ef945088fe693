"""One docker-compose project of compose.yaml under the private dockerd, for the e2e tests.

A project has a unique name (``-p``), its own env file (deploy/nodes/cpu.env with this run's
image, ports, node name and sandbox state dir) and its own state dir, made a shared mount point
so that the tmpfs quotas the containerised sandbox worker mounts there propagate to the host's
engine. :meth:`ComposeProject.down` removes everything and :meth:`leftovers` lists what is left
of it (containers, networks, volumes, sandboxes, mounts).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sandbox_worker.images import docker_host
from services.processes import free_port
from tests.support.paths import REPO_ROOT

COMPOSE_FILE = REPO_ROOT / "compose.yaml"
STATE_PARENT = Path("/var/lib/swerl")  # short: relay socket paths stay < 108 bytes


class ComposeError(RuntimeError):
    pass


def _run(cmd: list[str], timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DOCKER_HOST": docker_host()}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)


@dataclass
class ComposeProject:
    name: str
    env_file: Path
    state_dir: Path
    node: str
    api_url: str
    values: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, work: Path, image_env: dict[str, str], write_env) -> ComposeProject:
        """A fresh project: names, ports and a shared-mount state dir of its own."""
        tag = f"{os.getpid() % 100000}{uuid.uuid4().hex[:6]}"
        name, node = f"swerle2e{tag}", f"cpu-e2e-{tag}"
        state = STATE_PARENT / f"c{tag}"
        state.mkdir(parents=True)
        _check(_run(["mount", "--bind", str(state), str(state)]), "mount --bind")
        _check(_run(["mount", "--make-shared", str(state)]), "mount --make-shared")
        ports = {key: str(free_port()) for key in ("API", "REDIS", "ADAPTER")}
        socket = docker_host().removeprefix("unix://")
        data = {
            "SWERL_CHECKPOINT_DIR": str(work / "checkpoints"),
            "SWERL_WEIGHTS_DIR": str(work / "weights"),
            "SWERL_RUNS_DIR": str(work / "runs"),
            "SWERL_EVAL_RUNS_DIR": str(work / "eval-runs"),
            "SWERL_EVAL_INPUTS_DIR": str(work / "eval-inputs"),
        }
        for path in data.values():
            Path(path).mkdir()
        values = {
            **image_env,
            **data,
            "COMPOSE_PROJECT_NAME": name,
            "NODE_NAME": node,
            "SWERL_SANDBOX_STATE": str(state),
            "SWERL_DOCKER_SOCKET": socket,
            "SWERL_REFERENCE_SCRIPTED": "1",
            **{f"SWERL_{key}_PORT": port for key, port in ports.items()},
        }
        env_file = work / f"{name}.env"
        write_env(env_file, values)
        api = f"http://127.0.0.1:{ports['API']}"
        return cls(name, env_file, state, node, api, values)

    def compose(self, *args: str, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
        cmd = ["docker-compose", "-f", str(COMPOSE_FILE), "-p", self.name]
        return _run([*cmd, "--env-file", str(self.env_file), *args], timeout_s)

    def up(self) -> None:
        _check(self.compose("up", "-d"), "docker-compose up")

    def containers(self) -> dict[str, str]:
        """Service name -> health status ("healthy", "starting", "none", or the run state)."""
        label = f"label=com.docker.compose.project={self.name}"
        res = _run(["docker", "ps", "-aq", "--filter", label])
        ids = res.stdout.split()
        if not ids:
            return {}
        info = json.loads(_run(["docker", "inspect", *ids]).stdout)
        out = {}
        for c in info:
            service = c["Config"]["Labels"]["com.docker.compose.service"]
            state = c["State"]
            health = state.get("Health", {}).get("Status", "none")
            out[service] = health if state["Running"] else state["Status"]
        return out

    def wait_healthy(self, services: set[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.containers()
            if set(status) >= services and all(status[s] == "healthy" for s in services):
                return
            if any(v in ("exited", "dead", "unhealthy") for v in status.values()):
                break
            time.sleep(3)
        raise ComposeError(f"services not healthy: {self.containers()}\n{self.logs()}")

    def logs(self, tail: int = 40) -> str:
        res = self.compose("logs", "--no-color", f"--tail={tail}", timeout_s=60)
        return res.stdout[-20000:] + res.stderr[-2000:]

    def down(self) -> subprocess.CompletedProcess[str]:
        return self.compose("down", "-v", "--remove-orphans", "--timeout", "30")

    def leftovers(self) -> list[str]:
        """What is left of the project on the engine and the host after :meth:`down`."""
        label = f"label=com.docker.compose.project={self.name}"
        left = []
        for kind in ("ps -a", "network ls", "volume ls"):
            ids = _run(["docker", *kind.split(), "-q", "--filter", label]).stdout.split()
            left += [f"{kind.split()[0]}: {i}" for i in ids]
        return left + self.sandbox_leftovers()

    def sandbox_leftovers(self) -> list[str]:
        """Sandbox containers of this project's node and tmpfs quotas under its state dir."""
        left = []
        sandboxes = _run(["docker", "ps", "-aq", "--filter", f"label=swerl.node={self.node}"])
        left += [f"sandbox container: {i}" for i in sandboxes.stdout.split()]
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
        points = [m.split()[4] for m in mounts]
        left += [f"mount: {p}" for p in points if p.startswith(f"{self.state_dir}/")]
        return left

    def remove_state_dir(self) -> None:
        _run(["umount", "--lazy", str(self.state_dir)])
        try:
            self.state_dir.rmdir()
        except OSError as exc:
            raise ComposeError(f"state dir {self.state_dir} not empty after down: {exc}") from exc


def _check(res: subprocess.CompletedProcess[str], what: str) -> None:
    if res.returncode != 0:
        out = f"{res.stdout[-4000:]}{res.stderr[-4000:]}"
        raise ComposeError(f"{what} failed ({res.returncode}):\n{out}")
