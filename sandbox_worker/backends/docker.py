"""Docker sandbox backend (the docker SDK against a local engine, never pulling).

One sandbox = one container started from the instance image; every command is a ``docker
exec``. Ownership is in labels (``swerl.owner=swerl``, ``swerl.node``, ``swerl.sandbox``) so
that a restarted worker finds and removes what a crashed run of the same node left behind.

Layout of a container (docs/sandboxes.md has the rationale):

* read-only root filesystem; network mode ``none`` (loopback only);
* its main process (PID 1, whose end is the container's end) is ``sleep infinity`` with
  ``SIGCHLD`` ignored (so the kernel reaps the orphans of exec'd commands, no init needed),
  running as uid 65534: a PID 1 drops every signal from inside its pid namespace that it has
  no handler for (``kill -9 1``, ``kill -TERM 1``; ``kill -9 -1`` spares it), and another uid
  puts it out of ``ptrace``'s and ``/proc/1/mem``'s reach of the commands, which run as the
  image's user (root) -- nothing in the sandbox can end it (``tini`` as PID 1 exited when its
  child was killed, and forwarded ``SIGTERM``);
* ``spec.workdir`` (``/testbed``) is an anonymous volume of the ``local`` driver bound to
  ``<state>/testbed``, which docker initialises with the image's content (as any empty
  volume), so the agent edits a private copy and the archive API (copy in/out) works;
* ``/tmp`` is a bind mount of ``<state>/tmp``, where ``<state>`` is the per-sandbox host dir
  ``<state_root>/<node>.<sandbox_id>/``;
* ``<state>`` is a tmpfs of ``disk_mb`` / ``inodes`` (``_hostdir.mount_disk_quota``): the
  writable places share that quota and nothing a sandbox writes reaches the host disk;
* cpu (``nano_cpus``), memory (no swap) and pids limits from ``spec.limits``.

The relays (the LLM relay, ``expose``) run in a second container, ``<name>.relay``, that shares
only the sandbox's network namespace (``network_mode=container:<sandbox>``): its own pid and
mount namespaces, its own cgroup, ``<state>/ctl`` mounted at ``/swerl/ctl``, all capabilities
dropped. The sandbox's processes cannot see, signal or starve it, nor touch its sockets.
"""

from __future__ import annotations

import contextlib
import io
import logging
import select
import socket
import struct
import tarfile
import time
from collections.abc import Iterator
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
# Marks a sandbox's relay container (not a sandbox of its own in ``list_sandboxes``).
ROLE_LABEL = "swerl.role"
RELAY_ROLE = "relay"
# PID 1 of a sandbox: ignoring SIGCHLD makes the kernel reap every child it adopts (bash keeps
# an ignored disposition across exec; dash does not). It runs as this uid, not the commands'.
INIT_COMMAND = ["/bin/bash", "-c", "trap '' CHLD; exec sleep infinity"]
INIT_USER = "65534:65534"
# The relay container's own bounds (a few python relays with 32 connections each at most).
RELAY_MEMORY = "256m"
RELAY_PIDS = 64
# Host-side grace after an exec's own timeout before the stream is abandoned.
HOST_DEADLINE_GRACE_S = 15.0


class DockerBackendConfig(StrictModel):
    docker_host: str = Field(default_factory=docker_host)
    # Per-sandbox host dirs (/tmp and the control dir): keep unix socket paths short (< 108).
    state_root: Path = Path("/var/lib/swerl/sandboxes")
    relay_python: str = "python3"  # interpreter inside the sandbox that runs the relay
    # PID 1 reaps the orphans of exec'd commands (SIGCHLD ignored); False: a plain sleep.
    use_init: bool = True
    max_output_bytes: int = common.DEFAULT_MAX_OUTPUT_BYTES
    api_timeout_s: float = 120.0
    ready_timeout_s: float = 20.0


def _container_name(node: str, sandbox_id: str) -> str:
    return f"swerl.{node}.{sandbox_id}"


def _relay_container_name(node: str, sandbox_id: str) -> str:
    return f"{_container_name(node, sandbox_id)}.relay"


class DockerProcess(BackgroundProcess):
    def __init__(
        self, sandbox: DockerSandbox, container_id: str, exec_id: str, pid: int | None
    ) -> None:
        self._sandbox = sandbox
        self._container_id = container_id
        self._exec_id = exec_id
        self._pid = pid

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
        if self._pid is not None and self.is_running():
            argv = ["kill", "-KILL", "--", f"-{self._pid}"]
            self._sandbox._run(self._container_id, argv, None, 10, None)


class DockerSandbox(hostdir.HostDirSandbox):
    def __init__(
        self,
        backend: DockerBackend,
        spec: SandboxSpec,
        container: Any,
        state_dir: Path,
        image_env: dict[str, str],
        user: str = "0",
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
        self._user = user  # the image's USER: commands run as it, PID 1 does not
        self._relay_container: Any = None  # made by the first relay (``_spawn_relay``)

    # -- commands -------------------------------------------------------------------------

    def _exec_create(
        self,
        container_id: str,
        argv: list[str],
        workdir: str | None,
        env: dict[str, str] | None,
        user: str,
    ) -> str:
        wd = self._workdir(workdir)
        try:
            res = self._api.exec_create(
                container_id,
                argv,
                stdout=True,
                stderr=True,
                stdin=False,
                tty=False,
                environment=common.exec_env(self.spec, self._image_env, env),
                workdir=wd,
                user=user,
            )
        except docker.errors.NotFound as exc:
            raise SandboxInfraError(f"sandbox {self.spec.sandbox_id} is gone: {exc}") from exc
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker exec failed: {exc}") from exc
        return res["Id"]

    def _user_of(self, container_id: str) -> str:
        """Commands of the sandbox run as the image's user; relays as root (no capabilities)."""
        return self._user if container_id == self._container.id else "0"

    def _exec_argv(
        self, argv: list[str], workdir: str | None, timeout_s: float | None, env: EnvVars | None
    ) -> ExecResult:
        return self._run(self._container.id, argv, workdir, timeout_s, env)

    def _run(
        self,
        container_id: str,
        argv: list[str],
        workdir: str | None,
        timeout_s: float | None,
        env: EnvVars | None,
    ) -> ExecResult:
        """Run ``argv`` in ``container_id`` (the sandbox or its relay container)."""
        # One pipe for stdout and stderr (as in the bwrap backend): docker's separate streams
        # would not keep their relative order.
        argv = ["/bin/sh", "-c", 'exec "$@" 2>&1', "swerl-exec", *argv]
        if timeout_s is not None:
            # coreutils timeout leads its own process group and signals all of it.
            argv = ["timeout", "-s", "TERM", "-k", str(common.KILL_GRACE_S), f"{timeout_s}s", *argv]
        exec_id = self._exec_create(container_id, argv, workdir, env, self._user_of(container_id))
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
        return self._track(self._start_background(self._container.id, argv, workdir, env, log_path))

    def _spawn_relay(self, argv: list[str], log_path: str) -> BackgroundProcess:
        if self._relay_container is None:
            self._relay_container = self._backend._create_relay_container(
                self.spec, self._state, self._container.id
            )
        return self._start_background(self._relay_container.id, argv, "/", None, log_path)

    def _start_background(
        self,
        container_id: str,
        argv: list[str],
        workdir: str | None,
        env: EnvVars | None,
        log_path: str,
    ) -> DockerProcess:
        """Start ``argv`` detached from the exec's stream, once it has told its pid on it."""
        wrapped = common.background_argv(argv, log_path)
        user = self._user_of(container_id)
        exec_id = self._exec_create(container_id, wrapped, workdir, env, user)
        try:
            sock = self._api.exec_start(exec_id, socket=True)
        except docker.errors.APIError as exc:
            raise SandboxInfraError(f"docker exec start failed: {exc}") from exc
        deadline = time.monotonic() + self._backend.config.api_timeout_s
        try:
            first = _read_first_line(getattr(sock, "_sock", sock), deadline)
        except OSError as exc:
            raise SandboxInfraError(f"docker exec stream broke: {exc}") from exc
        finally:
            sock.close()  # the process keeps running: docker does not end an exec on detach
        # No pid line: the command could not start (a missing workdir, say); exit_code tells.
        pid = int(first) if first.strip().isdigit() else None
        return DockerProcess(self, container_id, exec_id, pid)

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
        """Remove the relay container, the container (which ends every process in them) and
        the state dir."""
        errors: list[str] = []
        for container in (self._relay_container, self._container):
            if container is None:
                continue
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:
                errors.append(str(exc))
        hostdir.release_state_dir(self._state)
        if errors:
            raise SandboxInfraError(f"destroy {self.spec.sandbox_id}: {'; '.join(errors)}")


def _frames(sock: socket.socket, deadline: float | None) -> Iterator[bytes]:
    """The payloads of docker's multiplexed exec stream until EOF (``TimeoutError`` at the
    deadline). Frames are an 8-byte header (stream type, 3 zero bytes, big-endian length) +
    payload; stdout and stderr come merged in arrival order."""
    pending = b""
    need: int | None = None  # payload bytes still expected for the current frame
    while True:
        timeout = None if deadline is None else deadline - time.monotonic()
        if timeout is not None and timeout <= 0:
            raise TimeoutError("docker exec stream deadline")
        ready, _, _ = select.select([sock], [], [], timeout)
        if not ready:
            raise TimeoutError("docker exec stream deadline")
        chunk = sock.recv(65536)
        if not chunk:
            return
        pending += chunk
        while True:
            if need is None:
                if len(pending) < 8:
                    break
                _, length = struct.unpack(">BxxxL", pending[:8])
                pending = pending[8:]
                need = length
            take = pending[:need]
            if take:
                yield take
            pending = pending[len(take) :]
            need -= len(take)
            if need:
                break
            need = None


def _read_frames(sock: socket.socket, buf: common.OutputBuffer, deadline: float | None) -> bool:
    """Read an exec's whole stream into ``buf``; False if the deadline passed first."""
    try:
        for payload in _frames(sock, deadline):
            buf.add(payload)
    except TimeoutError:
        return False
    return True


def _read_first_line(sock: socket.socket, deadline: float) -> str:
    """The stream's first line (what a background wrapper prints: its pid), or all of the
    stream's text (at most 4 KiB) if it ends or the deadline passes before a newline."""
    data = b""
    with contextlib.suppress(TimeoutError):
        for payload in _frames(sock, deadline):
            data += payload
            if b"\n" in data or len(data) > 4096:
                break
    return data.split(b"\n", 1)[0].decode("utf-8", "replace")


def _labels(spec: SandboxSpec) -> dict[str, str]:
    owner = {OWNER_LABEL: OWNER, NODE_LABEL: spec.node, SANDBOX_LABEL: spec.sandbox_id}
    return {**spec.labels, **owner}


def _ro_mounts(spec: SandboxSpec) -> list[Mount]:
    mounts = []
    for host, inside in spec.ro_mounts.items():
        if not Path(host).exists():
            raise SandboxInfraError(f"ro_mounts source does not exist: {host}")
        mounts.append(Mount(target=inside, source=host, type="bind", read_only=True))
    return mounts


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
            config = image.attrs.get("Config") or {}
            sandbox = DockerSandbox(
                self,
                spec,
                container,
                state,
                common.parse_image_env(config.get("Env")),
                user=config.get("User") or "0",
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
            *_ro_mounts(spec),
        ]
        memory = f"{limits.memory_mb}m"
        try:
            container = self.client.containers.create(
                spec.image,
                command=INIT_COMMAND if self.config.use_init else ["sleep", "infinity"],
                user=INIT_USER,
                name=_container_name(spec.node, spec.sandbox_id),
                hostname="sandbox",
                labels=_labels(spec),
                network_mode="none",
                read_only=True,
                mounts=mounts,
                working_dir=spec.workdir,
                mem_limit=memory,
                memswap_limit=memory,
                nano_cpus=int(limits.cpus * 1e9),
                pids_limit=limits.pids,
                init=False,  # docker's init (tini) exits when its child is killed
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

    def _create_relay_container(self, spec: SandboxSpec, state: Path, sandbox_id: str) -> Any:
        """The container the sandbox's relays run in: the sandbox's network namespace only.

        Same image (its ``python3`` runs the relay), its own pid, mount and ipc namespaces
        and cgroup, the control dir read-write, no capabilities: the sandbox's processes
        cannot see, signal or starve it, and never see the control dir.
        """
        mounts = [Mount(target=CONTROL_DIR, source=str(state / "ctl"), type="bind")]
        try:
            container = self.client.containers.create(
                spec.image,
                command=INIT_COMMAND,
                user=INIT_USER,
                name=_relay_container_name(spec.node, spec.sandbox_id),
                labels={**_labels(spec), ROLE_LABEL: RELAY_ROLE},
                network_mode=f"container:{sandbox_id}",
                read_only=True,
                mounts=[*mounts, *_ro_mounts(spec)],
                working_dir="/",
                mem_limit=RELAY_MEMORY,
                memswap_limit=RELAY_MEMORY,
                pids_limit=RELAY_PIDS,
                init=False,
                security_opt=["no-new-privileges"],
                cap_drop=["ALL"],
            )
            container.start()
        except docker.errors.APIError as exc:
            with contextlib.suppress(docker.errors.APIError):  # created but not started
                name = _relay_container_name(spec.node, spec.sandbox_id)
                self.client.containers.get(name).remove(force=True)
            raise SandboxInfraError(f"cannot start the relay of {spec.sandbox_id}: {exc}") from exc
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
        for name in (_relay_container_name(node, sandbox_id), _container_name(node, sandbox_id)):
            with contextlib.suppress(docker.errors.NotFound):
                self.client.containers.get(name).remove(force=True, v=True)
        hostdir.release_state_dir(self._state_dir(node, sandbox_id))

    def list_sandboxes(self, node: str) -> list[str]:
        validate_name("node", node)
        return sorted(
            c.labels.get(SANDBOX_LABEL, "")
            for c in self._owned_containers(node)
            if c.labels.get(ROLE_LABEL) != RELAY_ROLE
        )

    def cleanup_node(self, node: str) -> int:
        validate_name("node", node)
        removed: set[str] = set()
        # relay containers first: each shares the network namespace of its sandbox's
        containers = self._owned_containers(node)
        containers.sort(key=lambda c: c.labels.get(ROLE_LABEL) != RELAY_ROLE)
        for container in containers:
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
