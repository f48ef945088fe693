"""The sandbox backend contract shared by the docker and bwrap backends.

A *sandbox* is an isolated root filesystem built from a task image, with the instance's
repository at ``spec.workdir`` (``/testbed``, as in SWE-bench images). Everything the worker,
the OpenHands runner and the reward evaluation do inside a sandbox goes through this interface,
so both backends pass one contract test suite (``tests/integration/sandboxes``).

Filesystem policy (both backends): the root filesystem is read-only; ``spec.workdir`` (a private
copy of the image's ``/testbed``) and ``/tmp`` (also ``$HOME``) are the only writable places;
``spec.ro_mounts`` add read-only host directories. The writable places share one size- and
inode-limited tmpfs per sandbox (``SandboxLimits.disk_mb`` and ``inodes``): a write beyond it
fails inside the sandbox with ``ENOSPC``, the host disk is never touched, and the file helpers
raise :class:`DiskQuotaError` (an ``OSError`` with ``ENOSPC``).

Attribution (both backends): what the sandbox's processes -- the agent, code under test, all
running as root inside -- can do must never end as an infrastructure failure. So the relays
(the LLM relay and :meth:`Sandbox.expose`) run in the sandbox's network namespace but out of
its pid and mount namespaces and its cgroups, with :data:`CONTROL_DIR` (their script and unix
sockets) mounted for them only: no process of the sandbox can signal, trace, starve or unlink
them; an LLM call through the relay fails only when the adapter does. And the sandbox itself
survives whatever its processes do: ``kill -9 -1``, any signal to PID 1, ``ptrace`` of PID 1
(docker: PID 1 runs as another uid and drops every signal from inside; bwrap: every command has
a pid namespace of its own) -- they may end their own processes, never the sandbox's ability
to run the next ``exec`` (the patch extraction, the evaluation).

Errors: anything that means *the infrastructure failed* (image missing, daemon down, sandbox
could not be created) raises :class:`SandboxInfraError`; the worker turns it into an ``aborted``
outcome, never a reward of 0. A command that runs and exits non-zero is *not* an error: it is an
:class:`ExecResult` with that exit code. File helpers raise ``FileNotFoundError`` for a missing
sandbox path and ``PermissionError`` for a write outside the writable places; a bad argument
(an invalid id, a relative sandbox path) is a ``ValueError``.
"""

from __future__ import annotations

import abc
import errno
import re
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from sandbox_worker.relay.http_filter import RelayBinding

# Where a sandbox's relay processes see its per-sandbox host control directory (the relay
# script and the relays' unix sockets); the sandbox's own processes never have it mounted.
CONTROL_DIR = "/swerl/ctl"
# $HOME inside sandboxes: the root filesystem is read-only, /tmp is writable.
SANDBOX_HOME = "/tmp"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Extra environment variables of one command (``exec``/``spawn``'s ``env``).
type EnvVars = dict[str, str]

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class SandboxInfraError(RuntimeError):
    """The sandbox infrastructure failed (not the agent, not the tests)."""


class DiskQuotaError(OSError):
    """A file helper's write exceeded the sandbox's disk or inode quota (``errno.ENOSPC``).

    Not a :class:`SandboxInfraError`: the quota is a limit of the sandbox, like its memory, and
    whoever filled it (an agent, a patch under evaluation) owns the failure.
    """

    def __init__(self, message: str) -> None:
        super().__init__(errno.ENOSPC, message)


class ImageNotFoundError(SandboxInfraError):
    """The task image is not present on this node (images are never pulled at run time)."""


class NetworkPolicy(StrEnum):
    NONE = "none"  # no network at all (reward evaluation)
    LLM_RELAY_ONLY = "llm_relay_only"  # only the relay to the LLM adapter (agent rollouts)


def validate_name(kind: str, value: str) -> str:
    """Node names and sandbox ids become parts of container, netns, cgroup and dir names.

    They are restricted to ``[a-z0-9-]`` (1-63 chars, not starting with ``-``) so that the
    backends can join them with ``.`` and still parse ownership back unambiguously.
    """
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ValueError(
            f"invalid {kind} {value!r}: use 1-63 characters of [a-z0-9-], not starting with '-'"
        )
    return value


def validate_sandbox_path(path: str) -> str:
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"sandbox paths must be absolute, got {path!r}")
    if "\x00" in path:
        raise ValueError("sandbox path contains a NUL byte")
    return path


def command_argv(cmd: str | list[str]) -> list[str]:
    """A string runs under ``/bin/bash -c``; a list is an argv (validated)."""
    if isinstance(cmd, str):
        if not cmd.strip():
            raise ValueError("empty command")
        return ["/bin/bash", "-c", cmd]
    if not cmd or not all(isinstance(a, str) for a in cmd):
        raise ValueError(f"command must be a non-empty string or list of strings, got {cmd!r}")
    return list(cmd)


def check_timeout(timeout_s: float | None) -> float | None:
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    return timeout_s


# Smallest disk quota and inode count a sandbox may get: the relay script, a patch file and a
# small checkout must fit (a quota below the image's /testbed fails at create, naming it).
MIN_DISK_MB = 16
MIN_INODES = 1024


@dataclass(frozen=True)
class SandboxLimits:
    """Per-sandbox bounds. ``disk_mb`` and ``inodes`` bound the writable places together
    (``/testbed`` with the image's checkout, ``/tmp``, the control dir): a tmpfs, so the bytes a
    sandbox writes there also count against ``memory_mb`` (docs/sandboxes.md, "Disk quota")."""

    cpus: float = 1.0
    memory_mb: int = 4096
    pids: int = 512
    disk_mb: int = 2048
    inodes: int = 100_000

    def __post_init__(self) -> None:
        for name in ("memory_mb", "pids", "disk_mb", "inodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ValueError(f"SandboxLimits.{name} must be an integer, got {value!r}")
        if not self.cpus > 0:
            raise ValueError(f"SandboxLimits.cpus must be > 0, got {self.cpus}")
        if self.memory_mb < 16:
            raise ValueError(f"SandboxLimits.memory_mb must be >= 16, got {self.memory_mb}")
        if self.pids < 8:
            raise ValueError(f"SandboxLimits.pids must be >= 8, got {self.pids}")
        if self.disk_mb < MIN_DISK_MB:
            raise ValueError(f"SandboxLimits.disk_mb must be >= {MIN_DISK_MB}, got {self.disk_mb}")
        if self.inodes < MIN_INODES:
            raise ValueError(f"SandboxLimits.inodes must be >= {MIN_INODES}, got {self.inodes}")


@dataclass(frozen=True)
class LlmRelay:
    """Where the in-sandbox relay forwards to: the LLM adapter as seen from the host, and the
    one trajectory whose calls it relays.

    Inside the sandbox the adapter is reachable at ``http://127.0.0.1:<sandbox_port>``, but only
    ``/t/<trajectory_id>/v1/chat/completions`` and ``/t/<trajectory_id>/v1/models``; nothing else
    is reachable at all (see docs/sandboxes.md, "Relay"). ``token`` is the trajectory's bearer
    token, added by the host side of the relay: it never enters the sandbox.
    """

    target_host: str
    target_port: int
    sandbox_port: int = 18080
    trajectory_id: str = field(kw_only=True)
    token: str | None = field(default=None, kw_only=True, repr=False)

    @property
    def binding(self) -> RelayBinding:
        return RelayBinding(self.trajectory_id, self.token)

    def __post_init__(self) -> None:
        self.binding  # noqa: B018 -- raises ValueError for a bad trajectory id or token
        for name in ("target_port", "sandbox_port"):
            port = getattr(self, name)
            if not 0 < port < 65536:
                raise ValueError(f"LlmRelay.{name} must be a TCP port, got {port}")
        if not self.target_host:
            raise ValueError("LlmRelay.target_host must not be empty")


@dataclass(frozen=True)
class SandboxSpec:
    image: str  # docker image reference; the bwrap backend maps it to a root filesystem dir
    node: str  # owning node name (used to clean up a crashed run's leftovers)
    sandbox_id: str  # unique, [a-z0-9-] only; becomes part of container / dir names
    workdir: str = "/testbed"
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    network: NetworkPolicy = NetworkPolicy.NONE
    env: dict[str, str] = field(default_factory=dict)
    # Host directories bind-mounted read-only into the sandbox: {host_path: sandbox_path}.
    ro_mounts: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    # Required when network is LLM_RELAY_ONLY, forbidden otherwise.
    llm_relay: LlmRelay | None = None

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError("SandboxSpec.image must not be empty")
        validate_name("node", self.node)
        validate_name("sandbox_id", self.sandbox_id)
        validate_sandbox_path(self.workdir)
        if self.workdir in ("/", "/tmp", CONTROL_DIR) or self.workdir.startswith("/proc"):
            raise ValueError(f"SandboxSpec.workdir cannot be {self.workdir!r}")
        for host, inside in self.ro_mounts.items():
            if not Path(host).is_absolute():
                raise ValueError(f"ro_mounts host path must be absolute, got {host!r}")
            validate_sandbox_path(inside)
            if inside == "/":
                raise ValueError("ro_mounts cannot mount over /")
        network = NetworkPolicy(self.network)
        if network is NetworkPolicy.LLM_RELAY_ONLY and self.llm_relay is None:
            raise ValueError("network=llm_relay_only needs SandboxSpec.llm_relay")
        if network is NetworkPolicy.NONE and self.llm_relay is not None:
            raise ValueError("SandboxSpec.llm_relay is set but network is 'none'")


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    output: str  # stdout and stderr interleaved
    timed_out: bool = False
    duration_s: float = 0.0


class BackgroundProcess(abc.ABC):
    """A long-running process started with :meth:`Sandbox.spawn` (e.g. the agent server)."""

    @abc.abstractmethod
    def is_running(self) -> bool: ...

    @abc.abstractmethod
    def exit_code(self) -> int | None:
        """The exit status once it has ended, else ``None``."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill the process and its process group; idempotent."""


class Sandbox(abc.ABC):
    """One live sandbox. Use as a context manager to guarantee ``destroy()``."""

    spec: SandboxSpec

    def exec(
        self,
        cmd: str | list[str],
        *,
        workdir: str | None = None,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run a command; never raises on non-zero exit.

        A string runs under ``/bin/bash -c`` (not a login shell: Debian's /etc/profile would
        reset the image's ``PATH``); a list is executed directly. The environment is the image's
        ``ENV`` + ``HOME=/tmp`` + ``spec.env`` + ``env``. On timeout the command's process group
        is killed and ``timed_out`` is set. Processes a command leaves running in the background
        do not outlive it portably (bwrap tears down the command's pid namespace; docker keeps
        them): use :meth:`spawn` for long-running processes.

        The command and timeout rules are checked here, once for every backend, which then runs
        the resulting argv in :meth:`_exec_argv`.
        """
        argv = command_argv(cmd)
        return self._exec_argv(argv, workdir, check_timeout(timeout_s), env)

    def _exec_argv(
        self, argv: list[str], workdir: str | None, timeout_s: float | None, env: EnvVars | None
    ) -> ExecResult:
        """Run a validated argv (the backend's half of :meth:`exec`).

        Not abstract so that a test double may override :meth:`exec` as a whole instead.
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither exec nor _exec_argv")

    def spawn(
        self,
        cmd: str | list[str],
        *,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        log_path: str = "/dev/null",
    ) -> BackgroundProcess:
        """Start a background process (output to ``log_path`` inside the sandbox).

        ``cmd`` follows the rules of :meth:`exec`; they and ``log_path`` are checked here, once
        for every backend, which then starts the resulting argv in :meth:`_spawn_argv`.
        """
        argv = command_argv(cmd)
        return self._spawn_argv(argv, workdir, env, validate_sandbox_path(log_path))

    def _spawn_argv(
        self, argv: list[str], workdir: str | None, env: EnvVars | None, log_path: str
    ) -> BackgroundProcess:
        """Start a validated argv in the background (the backend's half of :meth:`spawn`).

        Not abstract so that a test double may override :meth:`spawn` as a whole instead.
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither spawn nor _spawn_argv")

    @abc.abstractmethod
    def expose(self, sandbox_port: int) -> Path:
        """A host unix socket that connects to ``127.0.0.1:<sandbox_port>`` inside the sandbox.

        How the host reaches a server running in a sandbox that has no network (the OpenHands
        agent server); wrap it in :class:`sandbox_worker.relay.host_relay.RelayHub` to get a
        loopback TCP port on the host.
        """

    @property
    def llm_base_url(self) -> str | None:
        """The adapter's URL as seen inside the sandbox (``None`` without the LLM relay)."""
        relay = self.spec.llm_relay
        return None if relay is None else f"http://127.0.0.1:{relay.sandbox_port}"

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes: ...

    @abc.abstractmethod
    def copy_in(self, host_path: Path, sandbox_path: str) -> None:
        """Copy a host file or directory to exactly ``sandbox_path`` (parents are created)."""

    @abc.abstractmethod
    def copy_out(self, sandbox_path: str, host_path: Path) -> None:
        """Copy a sandbox file or directory to exactly ``host_path`` (parents are created)."""

    def diff(self, base_commit: str, repo_dir: str | None = None) -> str:
        """The patch of the working tree (tracked + new files) against ``base_commit`` (a full
        commit id), taken on the host from a copy of the tree by a git that none of the
        sandbox's configuration reaches (:func:`sandbox_worker.patch_extract.extract_patch`):
        never by git inside the sandbox, whose config, attributes and hooks are the agent's.
        A repository it cannot diff raises :class:`SandboxInfraError` ("git diff failed").
        """
        from sandbox_worker import patch_extract  # imports this module

        repo = repo_dir or self.spec.workdir
        try:
            return patch_extract.extract_patch(self, base_commit, repo)
        except patch_extract.PatchRefusedError as exc:
            raise SandboxInfraError(f"git diff failed: {exc}") from exc

    @abc.abstractmethod
    def destroy(self) -> None:
        """Remove the sandbox and everything it created on the host. Idempotent."""

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class SandboxBackend(abc.ABC):
    name: str

    @abc.abstractmethod
    def create(self, spec: SandboxSpec) -> Sandbox:
        """Create and start a sandbox; raise :class:`ImageNotFoundError` for a missing image."""

    @abc.abstractmethod
    def image_available(self, image: str) -> bool: ...

    def image_labels(self, image: str) -> dict[str, str] | None:
        """The image's labels, or None when this backend does not know them (or the image is
        missing: ``create`` reports that)."""
        return None

    @abc.abstractmethod
    def cleanup_node(self, node: str) -> int:
        """Remove every sandbox this node owns (left by a crashed run); return how many."""

    @abc.abstractmethod
    def list_sandboxes(self, node: str) -> list[str]:
        """Ids of the sandboxes this node currently owns (for leak checks and monitoring)."""
