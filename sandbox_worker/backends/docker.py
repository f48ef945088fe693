"""Docker sandbox backend (the docker SDK against a local engine, never pulling).

One sandbox = one container started from the instance image with ``tini`` + ``sleep infinity``
as its main process; every command is a ``docker exec``. Ownership is in labels
(``swerl.owner=swerl``, ``swerl.node``, ``swerl.sandbox``) so that a restarted worker finds and
removes what a crashed run of the same node left behind.

Layout of a container (docs/sandboxes.md has the rationale):

* read-only root filesystem; network mode ``none`` (loopback only);
* ``spec.workdir`` (``/testbed``) is an anonymous volume of the ``local`` driver bound to
  ``<state>/testbed``, which docker initialises with the image's content (as any empty
  volume), so the agent edits a private copy and the archive API (copy in/out) works;
* ``/tmp`` and ``/swerl/ctl`` are bind mounts of ``<state>/tmp`` and ``<state>/ctl``, where
  ``<state>`` is the per-sandbox host dir ``<state_root>/<node>.<sandbox_id>/``; ``ctl``
  carries the relay's unix socket;
* ``<state>`` is a tmpfs of ``disk_mb`` / ``inodes`` (``_hostdir.mount_disk_quota``): the
  three writable places share that quota and nothing a sandbox writes reaches the host disk;
* cpu (``nano_cpus``), memory (no swap) and pids limits from ``spec.limits``.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import select
import socket
import struct
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors
from docker.types import DriverConfig, Mount
from pydantic import Field

from sandbox_worker.backends import _common as common
from sandbox_worker.backends import _hostdir as hostdir
from sandbox_worker.backends.base import (
    CONTROL_DIR,
    BackgroundProcess,
    EnvVars,
    ExecResult,
    ImageNotFoundError,
    SandboxInfraError,
    SandboxSpec,
    validate_name,
    validate_sandbox_path,
)
from sandbox_worker.images import docker_host
from sandbox_worker.relay.host_relay import RelayHub
from services.config import StrictModel

log = logging.getLogger(__name__)

OWNER_LABEL = "swerl.owner"
NODE_LABEL = "swerl.node"
SANDBOX_LABEL = "swerl.sandbox"
OWNER = "swerl"
# Host-side grace after an exec's own timeout before the stream is abandoned.
HOST_DEADLINE_GRACE_S = 15.0


class DockerBackendConfig(StrictModel):
    docker_host: str = Field(default_factory=docker_host)
    # Per-sandbox host dirs (/tmp and the control dir): keep unix socket paths short (< 108).
    state_root: Path = Path("/var/lib/swerl/sandboxes")
    relay_python: str = "python3"  # interpreter inside the sandbox that runs the relay
    use_init: bool = True  # tini as pid 1 reaps the orphans of exec'd commands
    max_output_bytes: int = common.DEFAULT_MAX_OUTPUT_BYTES
    api_timeout_s: float = 120.0
    ready_timeout_s: float = 20.0


def _container_name(node: str, sandbox_id: str) -> str:
    return f"swerl.{node}.{sandbox_id}"


class DockerProcess(BackgroundProcess):
    def __init__(self, sandbox: DockerSandbox, exec_id: str, pid_file: Path) -> None:
        self._sandbox = sandbox
        self._exec_id = exec_id
        self._pid_file = pid_file

    def _inspect(self) -> dict[str, Any]:
        try:
            return self._sandbox._api.exec_inspect(self._exec_id)
        except docker.errors.NotFound:
            return {"Running": False, "ExitCode": None}

    def is_running(self) -> bool:
        return bool(self._inspect().get("Running"))

    def exit_code(self) -> int | None:
        info = self._inspect()
        return None if info.get("Running") else info.get("ExitCode")

    def kill(self) -> None:
        try:
            pid = int(self._pid_file.read_text().strip())
        except (OSError, ValueError):
            return
        if self.is_running():
            self._sandbox.exec(["kill", "-KILL", "--", f"-{pid}"], timeout_s=10)


class DockerSandbox(hostdir.HostDirSandbox):
    def __init__(
        self,
        backend: DockerBackend,
        spec: SandboxSpec,
        container: Any,
        state_dir: Path,
        image_env: dict[str, str],
    ) -> None:
        super().__init__(
            spec,
            state_dir,
            image_env,
            relay_python=backend.config.relay_python,
            ready_timeout_s=backend.config.ready_timeout_s,
        )
        self._backend = backend
        self._api = backend.client.api
        self._container = container
        self._counter = itertools.count()  # names the pid files of background processes

    # -- commands -------------------------------------------------------------------------

    def _exec_create(self, argv: list[str], workdir: str | None, env: dict[str, str] | None) -> str:
        wd = self._workdir(workdir)
        try:
            res = self._api.exec_create(
                self._container.id,
                argv,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                environment=common.exec_env(self.spec, self._image_env, env),
                workdir=wd,
            )
        except docker.errors.NotFound as exc:
            raise SandboxInfraError(f"sandbox {self.spec.sandbox_id} is gone: {exc}") from exc
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker exec failed: {exc}") from exc
        return res["Id"]

    def _exec_argv(
        self, argv: list[str], workdir: str | None, timeout_s: float | None, env: EnvVars | None
    ) -> ExecResult:
        # One pipe for stdout and stderr (as in the bwrap backend): docker's separate streams
        # would not keep their relative order.
        argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "swerl-exec", *argv]
        if timeout_s is not None:
            # coreutils timeout leads its own process group and signals all of it.
            argv = ["timeout", "-s", "TERM", "-k", str(common.KILL_GRACE_S), f"{timeout_s}s", *argv]
        exec_id = self._exec_create(argv, workdir, env)
        buf = common.OutputBuffer(self._backend.config.max_output_bytes)
        started = time.monotonic()
        deadline = None if timeout_s is None else started + timeout_s + HOST_DEADLINE_GRACE_S
        try:
            sock = self._api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker exec start failed: {exc}") from exc
        try:
            finished = _read_frames(getattr(sock, "_sock", sock), buf, deadline)
        except OSError as exc:
            raise SandboxInfraError(f"docker exec stream broke: {exc}") from exc
        finally:
            sock.close()
        duration = time.monotonic() - started
        try:
            info = self._api.exec_inspect(exec_id)
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker exec inspect failed: {exc}") from exc
        code = info.get("ExitCode")
        if not finished or code is None or info.get("Running"):
            return ExecResult(124, buf.text(), timed_out=True, duration_s=duration)
        timed_out = timeout_s is not None and code in (124, 137) and duration >= timeout_s * 0.95
        output = buf.text()
        if output.startswith("OCI runtime exec failed"):
            # the command could not start: report it as a shell would (127 = not found)
            code = 127 if "executable file not found" in output else 126
        return ExecResult(int(code), output, timed_out=timed_out, duration_s=duration)

    def _spawn_argv(
        self, argv: list[str], workdir: str | None, env: EnvVars | None, log_path: str
    ) -> BackgroundProcess:
        n = next(self._counter)
        pid_name = f"bg-{n}.pid"
        wrapped = common.background_argv(argv, log_path, f"{CONTROL_DIR}/{pid_name}")
        exec_id = self._exec_create(wrapped, workdir, env)
        try:
            self._api.exec_start(exec_id, detach=True)
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker exec start failed: {exc}") from exc
        return self._track(DockerProcess(self, exec_id, self._ctl / pid_name))

    # -- files ----------------------------------------------------------------------------

    def _put(self, path: str, tar_bytes_for: Any) -> None:
        root = self._writable_root(path)
        rel = str(PurePosixPath(path).relative_to(root))
        try:
            ok = self._api.put_archive(self._container.id, root, tar_bytes_for(rel))
        except docker.errors.NotFound as exc:
            raise FileNotFoundError(f"{root} missing in sandbox: {exc}") from exc
        except docker.errors.APIError as exc:
            if "read-only" in str(exc):
                raise PermissionError(f"{path}: {exc.explanation}") from exc
            hostdir.raise_if_out_of_space(str(exc), path)
            raise SandboxInfraError(f"put_archive failed: {exc}") from exc
        if not ok:
            raise SandboxInfraError(f"put_archive to {path} failed")

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._put(path, lambda rel: common.tar_single_file(rel, data, mode))

    def copy_in(self, host_path: Path, sandbox_path: str) -> None:
        host_path = Path(host_path)
        self._put(sandbox_path, lambda rel: common.tar_host_path(host_path, rel))

    def _get(self, path: str, follow: bool = False) -> tarfile.TarFile:
        validate_sandbox_path(path)
        for _ in range(16):
            try:
                bits, stat = self._api.get_archive(self._container.id, path)
            except docker.errors.NotFound as exc:
                raise FileNotFoundError(f"{path} not found in sandbox") from exc
            except docker.errors.APIError as exc:
                raise SandboxInfraError(f"get_archive failed: {exc}") from exc
            # docker reports the fully resolved target of a symlink (in the container's scope)
            target = stat.get("linkTarget") if follow else None
            if not target or target == path:
                return tarfile.open(fileobj=io.BytesIO(b"".join(bits)), mode="r:")
            path = target
        raise OSError(f"too many levels of symbolic links: {path}")

    def read_file(self, path: str) -> bytes:
        with self._get(path, follow=True) as tar:
            member = tar.next()
            if member is None:
                raise FileNotFoundError(path)
            if member.isdir():
                raise IsADirectoryError(path)
            fh = tar.extractfile(member)
            if fh is None:
                raise FileNotFoundError(f"{path} is not a regular file")
            return fh.read()

    def copy_out(self, sandbox_path: str, host_path: Path) -> None:
        with self._get(sandbox_path) as tar:
            common.extract_single_tree(tar, Path(host_path))

    # -- lifecycle ------------------------------------------------------------------------

    def _release(self, procs: list[BackgroundProcess]) -> None:
        """Remove the container (which ends every process in it) and the state dir."""
        errors: list[str] = []
        try:
            self._container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            errors.append(str(exc))
        hostdir.release_state_dir(self._state)
        if errors:
            raise SandboxInfraError(f"destroy {self.spec.sandbox_id}: {'; '.join(errors)}")


def _read_frames(sock: socket.socket, buf: common.OutputBuffer, deadline: float | None) -> bool:
    """Read docker's multiplexed exec stream into ``buf``; False if the deadline passed.

    Frames are an 8-byte header (stream type, 3 zero bytes, big-endian length) + payload;
    stdout and stderr are merged in arrival order.
    """
    pending = b""
    need: int | None = None  # payload bytes still expected for the current frame
    while True:
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            return False
        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            return False
        chunk = sock.recv(65536)
        if not chunk:
            return True
        pending += chunk
        while True:
            if need is None:
                if len(pending) < 8:
                    break
                _, length = struct.unpack(">BxxxL", pending[:8])
                pending = pending[8:]
                need = length
            take = pending[:need]
            buf.add(take)
            pending = pending[len(take) :]
            need -= len(take)
            if need:
                break
            need = None


class DockerBackend(hostdir.HostDirBackend):
    name = "docker"

    def __init__(
        self, config: DockerBackendConfig | None = None, hub: RelayHub | None = None
    ) -> None:
        super().__init__(hub)
        self.config = config or DockerBackendConfig()
        try:
            self.client = docker.DockerClient(
                base_url=self.config.docker_host,
                timeout=int(self.config.api_timeout_s),
                max_pool_size=64,
            )
        except docker.errors.DockerException as exc:
            raise SandboxInfraError(
                f"cannot connect to docker at {self.config.docker_host}: {exc}"
            ) from exc

    def image_available(self, image: str) -> bool:
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound:
            return False
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker image lookup failed: {exc}") from exc
        return True

    def image_labels(self, image: str) -> dict[str, str] | None:
        try:
            return dict(self.client.images.get(image).labels or {})
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker image lookup failed: {exc}") from exc

    def _state_dir(self, node: str, sandbox_id: str) -> Path:
        return self.config.state_root / f"{node}.{sandbox_id}"

    def create(self, spec: SandboxSpec) -> DockerSandbox:
        try:
            image = self.client.images.get(spec.image)
        except docker.errors.ImageNotFound:
            raise ImageNotFoundError(
                f"image {spec.image!r} is not present on this node (images are never pulled)"
            ) from None
        except docker.errors.DockerException as exc:
            raise SandboxInfraError(f"docker image lookup failed: {exc}") from exc
        state = self._state_dir(spec.node, spec.sandbox_id)
        hostdir.claim_state_dir(state, spec)
        try:
            hostdir.fill_state_dir(state, spec)
            container = self._create_container(spec, state)
            sandbox = DockerSandbox(
                self,
                spec,
                container,
                state,
                common.parse_image_env((image.attrs.get("Config") or {}).get("Env")),
            )
        except BaseException:
            self._remove(spec.node, spec.sandbox_id)
            raise
        sandbox.open_network(lambda: self.hub)
        return sandbox

    def _create_container(self, spec: SandboxSpec, state: Path) -> Any:
        limits = spec.limits
        # An anonymous volume (removed with the container) whose data lives in the quota'd
        # state dir; docker copies the image's /testbed into it because it starts empty.
        (state / "testbed").mkdir()
        testbed = DriverConfig(
            "local", options={"type": "none", "o": "bind", "device": str(state / "testbed")}
        )
        mounts = [
            Mount(target=spec.workdir, source=None, type="volume", driver_config=testbed),
            Mount(target="/tmp", source=str(state / "tmp"), type="bind"),
            Mount(target=CONTROL_DIR, source=str(state / "ctl"), type="bind"),
        ]
        for host, inside in spec.ro_mounts.items():
            if not Path(host).exists():
                raise SandboxInfraError(f"ro_mounts source does not exist: {host}")
            mounts.append(Mount(target=inside, source=host, type="bind", read_only=True))
        labels = {
            **spec.labels,
            OWNER_LABEL: OWNER,
            NODE_LABEL: spec.node,
            SANDBOX_LABEL: spec.sandbox_id,
        }
        memory = f"{limits.memory_mb}m"
        try:
            container = self.client.containers.create(
                spec.image,
                command=["sleep", "infinity"],
                name=_container_name(spec.node, spec.sandbox_id),
                hostname="sandbox",
                labels=labels,
                network_mode="none",
                read_only=True,
                mounts=mounts,
                working_dir=spec.workdir,
                mem_limit=memory,
                memswap_limit=memory,
                nano_cpus=int(limits.cpus * 1e9),
                pids_limit=limits.pids,
                init=self.config.use_init,
                security_opt=["no-new-privileges"],
                cap_drop=["NET_RAW", "MKNOD", "AUDIT_WRITE", "SYS_CHROOT"],
            )
            container.start()
        except docker.errors.ImageNotFound as exc:
            raise ImageNotFoundError(str(exc)) from exc
        except docker.errors.APIError as exc:
            hint = (
                f" (the image's {spec.workdir} does not fit disk_mb={limits.disk_mb} / "
                f"inodes={limits.inodes})"
                if hostdir.out_of_space(str(exc))
                else ""
            )
            raise SandboxInfraError(f"cannot start sandbox {spec.sandbox_id}{hint}: {exc}") from exc
        return container

    def _owned_containers(self, node: str | None = None) -> list[Any]:
        filters = [f"{OWNER_LABEL}={OWNER}"]
        if node is not None:
            filters.append(f"{NODE_LABEL}={node}")
        try:
            # ignore_removed: a container removed between the list and its inspect (a
            # concurrent cleanup or cancel) is skipped instead of failing the whole listing.
            return self.client.containers.list(
                all=True, filters={"label": filters}, ignore_removed=True
            )
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker list failed: {exc}") from exc

    def _remove(self, node: str, sandbox_id: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            self.client.containers.get(_container_name(node, sandbox_id)).remove(force=True, v=True)
        hostdir.release_state_dir(self._state_dir(node, sandbox_id))

    def list_sandboxes(self, node: str) -> list[str]:
        validate_name("node", node)
        return sorted(c.labels.get(SANDBOX_LABEL, "") for c in self._owned_containers(node))

    def cleanup_node(self, node: str) -> int:
        validate_name("node", node)
        removed: set[str] = set()
        for container in self._owned_containers(node):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True, v=True)
            removed.add(container.labels.get(SANDBOX_LABEL, container.name))
        root = self.config.state_root
        if root.is_dir():
            for state in root.glob(f"{node}.*"):
                sandbox_id = state.name[len(node) + 1 :]
                hostdir.release_state_dir(state)
                removed.add(sandbox_id)
        if removed:
            log.info("cleanup_node %s: removed %d sandboxes", node, len(removed))
        return len(removed)
