"""What the docker and bwrap sandboxes share: a per-sandbox host dir and the relays behind it.

Both backends give every sandbox a host *state dir* ``<state_root>/<node>.<sandbox_id>/`` with
``owner.json`` (ownership marker), ``ctl/`` (the relay script and the relays' unix sockets:
mounted at :data:`CONTROL_DIR` for the relay processes only, never for the sandbox's own
processes), ``tmp/`` (mounted at ``/tmp``) and ``testbed/`` (the writable ``spec.workdir``).
The state dir is the mount point of a tmpfs of its own, limited to ``spec.limits.disk_mb``
bytes and ``spec.limits.inodes`` inodes (:func:`mount_disk_quota`), so what a sandbox writes
can never fill the host disk. Everything that only goes through that dir is backend-independent
and lives here, once: the relays (:meth:`HostDirSandbox.expose`, the LLM relay), the
writable-place rule of the file helpers, the bookkeeping of background processes and the
idempotent start of ``destroy``.

The relays run in the sandbox's network namespace but in a pid and mount namespace of their
own (:meth:`HostDirSandbox._spawn_relay`: docker, a relay container sharing only the sandbox's
network namespace; bwrap, a bwrap run of its own): whatever the sandbox's processes do --
``kill -9 -1``, deleting files, filling their disk, memory or pids -- they cannot see, signal
or unlink the relays or their sockets.

A backend keeps what really differs: how a command or background process is started
(``_exec_argv``, ``spawn``, ``_spawn_relay``), how files are copied, and how the sandbox is
created and released (:meth:`HostDirSandbox._release`).
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from sandbox_worker.backends import _common as common
from sandbox_worker.backends.base import (
    CONTROL_DIR,
    BackgroundProcess,
    DiskQuotaError,
    NetworkPolicy,
    Sandbox,
    SandboxBackend,
    SandboxInfraError,
    SandboxSpec,
    validate_sandbox_path,
)
from sandbox_worker.relay.host_relay import RelayError, RelayHandle, RelayHub, default_hub

# The longest unix socket a state dir must hold; sun_path allows 107 bytes plus a NUL.
_LONGEST_SOCKET = "port-65535.sock"
_MAX_SOCKET_PATH = 107


def claim_state_dir(state: Path, spec: SandboxSpec) -> None:
    """Create ``state`` exclusively: an existing dir means the sandbox id is already taken.

    Checked first because the relays' unix sockets live in ``state/ctl`` and a path too long
    for a socket would only fail later, inside the sandbox.
    """
    if len(os.fsencode(state / "ctl" / _LONGEST_SOCKET)) > _MAX_SOCKET_PATH:
        raise SandboxInfraError(f"state dir path too long for unix sockets: {state}")
    try:
        state.mkdir(parents=True)
    except FileExistsError:
        raise SandboxInfraError(f"sandbox {spec.sandbox_id} already exists ({state})") from None


# The tmpfs source name of a sandbox's disk (shows in /proc/mounts; cleanup checks it).
QUOTA_FS_NAME = "swerl-sandbox"
_HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def mount_disk_quota(state: Path, spec: SandboxSpec) -> None:
    """Mount a tmpfs of ``disk_mb`` bytes and ``inodes`` inodes on the (empty) state dir.

    Needs root (CAP_SYS_ADMIN), as the backends do anyway. A tmpfs rather than a host-disk
    quota: the host's ext4 has no project quotas, and docker's ``--storage-opt size`` needs them.
    Its pages are charged to the memory cgroup of the process that writes them (docs).
    """
    limits = spec.limits
    options = f"size={limits.disk_mb}m,nr_inodes={limits.inodes},mode=0755"
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, QUOTA_FS_NAME, str(state)],
        capture_output=True,
        text=True,
        env=_HOST_ENV,
    )
    if res.returncode != 0:
        raise SandboxInfraError(
            f"cannot mount the disk quota of sandbox {spec.sandbox_id} on {state} "
            f"(root needed): {res.stderr.strip()[-300:]}"
        )


def release_state_dir(state: Path) -> None:
    """Remove a state dir: detach its tmpfs (lazily: a dying process may still hold it; the
    memory is freed with the last reference) and delete the mount point. Idempotent."""
    if os.path.ismount(state):
        subprocess.run(
            ["umount", "--lazy", str(state)], capture_output=True, text=True, env=_HOST_ENV
        )
    shutil.rmtree(state, ignore_errors=True)


def out_of_space(text: str) -> bool:
    """Whether an error text says the sandbox's disk or inode quota is exhausted."""
    return "No space left on device" in text or "ENOSPC" in text or "no space left" in text


def raise_if_out_of_space(text: str, path: str) -> None:
    if out_of_space(text):
        raise DiskQuotaError(f"{path}: the sandbox's disk quota is exhausted: {text[-300:]}")


def fill_state_dir(state: Path, spec: SandboxSpec) -> None:
    """Write the ownership marker and make ``ctl/`` (with the relay script) and ``tmp/``.

    ``tmp/`` is world-writable and sticky like a real ``/tmp``: the image's user may not be root.
    First the state dir gets its disk quota (:func:`mount_disk_quota`): all of this lives in it.
    """
    mount_disk_quota(state, spec)
    (state / "owner.json").write_text(
        json.dumps({"node": spec.node, "sandbox_id": spec.sandbox_id, "image": spec.image})
    )
    common.prepare_control_dir(state / "ctl")
    (state / "tmp").mkdir()
    os.chmod(state / "tmp", 0o1777)


class HostDirSandbox(Sandbox):
    """A sandbox whose control dir is the host dir ``state/ctl`` (see the module docstring)."""

    def __init__(
        self,
        spec: SandboxSpec,
        state: Path,
        image_env: dict[str, str],
        *,
        relay_python: str,
        ready_timeout_s: float,
    ) -> None:
        self.spec = spec
        self._state = state
        self._ctl = state / "ctl"
        self._image_env = image_env
        self._relay_python = relay_python
        self._ready_timeout_s = ready_timeout_s
        self._relays: list[RelayHandle] = []
        self._procs: list[BackgroundProcess] = []
        self._lock = threading.Lock()
        self._destroyed = False

    def _workdir(self, workdir: str | None) -> str:
        """The directory a command starts in: ``workdir`` (validated) or ``spec.workdir``."""
        return validate_sandbox_path(workdir) if workdir else self.spec.workdir

    def _track[P: BackgroundProcess](self, proc: P) -> P:
        """Remember a background process so that :meth:`_release` can reach it."""
        with self._lock:
            self._procs.append(proc)
        return proc

    # -- relays ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _spawn_relay(self, argv: list[str], log_path: str) -> BackgroundProcess:
        """Start a relay process in the sandbox's network namespace, out of its processes' reach.

        It sees the control dir at :data:`CONTROL_DIR` (read-write) and shares only the network
        namespace with the sandbox: not its pid namespace (no signal, no ``/proc`` entry), not
        its mount namespace (the sandbox has no control dir), not its cgroup limits.
        """

    def _start_relay(self, argv: list[str], ready: str) -> BackgroundProcess:
        """Start a relay (:meth:`_spawn_relay`) and wait until it has written ``ctl/<ready>``."""
        proc = self._track(self._spawn_relay(argv, f"{CONTROL_DIR}/{ready}.log"))
        common.wait_for_file(
            self._ctl / ready,
            self._ready_timeout_s,
            f"in-sandbox relay ({ready})",
            alive=lambda: proc.is_running() or (self._ctl / ready).exists(),
        )
        return proc

    def expose(self, sandbox_port: int) -> Path:
        if not 0 < sandbox_port < 65536:
            raise ValueError(f"invalid port {sandbox_port}")
        ready = f"port-{sandbox_port}.ready"
        argv, sock = common.expose_command(
            self._relay_python, sandbox_port, f"{CONTROL_DIR}/{ready}"
        )
        if not (self._ctl / sock).exists():
            self._start_relay(argv, ready)
        return self._ctl / sock

    def _start_llm_relay(self, hub: RelayHub) -> None:
        relay = self.spec.llm_relay
        assert relay is not None
        self._relays.append(
            hub.llm_relay(
                self._ctl / common.LLM_SOCKET, relay.target_host, relay.target_port, relay.binding
            )
        )
        argv = common.relay_command(
            self._relay_python, relay.sandbox_port, f"{CONTROL_DIR}/llm.ready"
        )
        self._start_relay(argv, "llm.ready")

    def open_network(self, hub: Callable[[], RelayHub]) -> None:
        """Last step of ``create``: start the LLM relay if the spec's network policy wants it.

        ``hub`` is called only then, so a sandbox without network never builds the default hub.
        On any failure the sandbox is destroyed; relay and infra failures become one
        :class:`SandboxInfraError` naming the sandbox.
        """
        try:
            if NetworkPolicy(self.spec.network) is NetworkPolicy.LLM_RELAY_ONLY:
                self._start_llm_relay(hub())
        except (RelayError, SandboxInfraError) as exc:
            self.destroy()
            raise SandboxInfraError(f"LLM relay of {self.spec.sandbox_id} failed: {exc}") from exc
        except BaseException:
            self.destroy()
            raise

    # -- files ----------------------------------------------------------------------------

    def _writable_root(self, path: str) -> str:
        """The writable place (a mount point) that holds ``path``; the file helpers' policy.

        A mount point itself is not a file (``IsADirectoryError``); anything outside the
        writable places is a ``PermissionError`` (base.py, "Filesystem policy").
        """
        p = PurePosixPath(validate_sandbox_path(path))
        for root in (self.spec.workdir, "/tmp"):
            if p == PurePosixPath(root):
                raise IsADirectoryError(f"{path} is a mount point, not a file")
            if PurePosixPath(root) in p.parents:
                return root
        raise PermissionError(f"{path} is outside the sandbox's writable places")

    # -- lifecycle ------------------------------------------------------------------------

    def destroy(self) -> None:
        with self._lock:
            if self._destroyed:
                return
            self._destroyed = True
            procs = list(self._procs)
        for handle in self._relays:
            handle.close()
        self._release(procs)

    @abc.abstractmethod
    def _release(self, procs: list[BackgroundProcess]) -> None:
        """Remove the sandbox's host resources (``destroy`` after the relays are closed)."""


class HostDirBackend(SandboxBackend):
    """A backend whose sandboxes reach the LLM adapter through a (shared) relay hub."""

    def __init__(self, hub: RelayHub | None) -> None:
        self._hub = hub

    @property
    def hub(self) -> RelayHub:
        """The hub given at construction, else the process-wide one (made on first use)."""
        if self._hub is None:
            self._hub = default_hub()
        return self._hub
