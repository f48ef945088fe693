"""The sandbox backend contract shared by the docker and bwrap backends.

A *sandbox* is an isolated root filesystem built from a task image, with the instance's
repository at ``spec.workdir`` (``/testbed``, as in SWE-bench images). Everything the worker,
the OpenHands runner and the reward evaluation do inside a sandbox goes through this interface,
so both backends pass one contract test suite.

Errors: anything that means *the infrastructure failed* (image missing, daemon down, sandbox
could not be created) raises :class:`SandboxInfraError`; the worker turns it into an ``aborted``
outcome, never a reward of 0. A command that runs and exits non-zero is *not* an error: it is an
:class:`ExecResult` with that exit code.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


class SandboxInfraError(RuntimeError):
    """The sandbox infrastructure failed (not the agent, not the tests)."""


class ImageNotFoundError(SandboxInfraError):
    """The task image is not present on this node (images are never pulled at run time)."""


class NetworkPolicy(StrEnum):
    NONE = "none"  # no network at all (reward evaluation)
    LLM_RELAY_ONLY = "llm_relay_only"  # only the relay to the LLM adapter (agent rollouts)


@dataclass(frozen=True)
class SandboxLimits:
    cpus: float = 1.0
    memory_mb: int = 4096
    pids: int = 512


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


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    output: str  # stdout and stderr interleaved
    timed_out: bool = False
    duration_s: float = 0.0


class Sandbox(abc.ABC):
    """One live sandbox. Use as a context manager to guarantee ``destroy()``."""

    spec: SandboxSpec

    @abc.abstractmethod
    def exec(
        self,
        cmd: str | list[str],
        *,
        workdir: str | None = None,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        """Run a command (a string runs under ``/bin/bash -lc``); never raises on non-zero exit."""

    @abc.abstractmethod
    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None: ...

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes: ...

    @abc.abstractmethod
    def copy_in(self, host_path: Path, sandbox_path: str) -> None: ...

    @abc.abstractmethod
    def copy_out(self, sandbox_path: str, host_path: Path) -> None: ...

    def diff(self, base_commit: str, repo_dir: str | None = None) -> str:
        """The patch of the working tree (tracked + new files) against ``base_commit``."""
        repo = repo_dir or self.spec.workdir
        res = self.exec(
            f"git -c core.fileMode=false add -A >/dev/null && "
            f"git -c core.fileMode=false diff --cached --no-color --binary {base_commit}",
            workdir=repo,
            timeout_s=120,
        )
        if res.exit_code != 0:
            raise SandboxInfraError(f"git diff failed ({res.exit_code}): {res.output[-500:]}")
        return res.output

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

    @abc.abstractmethod
    def cleanup_node(self, node: str) -> int:
        """Remove every sandbox this node owns (left by a crashed run); return how many."""
