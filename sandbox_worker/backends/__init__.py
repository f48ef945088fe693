"""Sandbox backends behind one interface (:mod:`sandbox_worker.backends.base`).

``make_backend("docker" | "bwrap", **kwargs)`` builds a backend; ``kwargs`` are the fields of
its config model (:class:`~sandbox_worker.backends.docker.DockerBackendConfig` or
:class:`~sandbox_worker.backends.bwrap.BwrapBackendConfig`) plus an optional ``hub`` (a shared
:class:`~sandbox_worker.relay.host_relay.RelayHub`). Backend modules are imported lazily so a
bwrap-only node does not need the docker SDK and vice versa.
"""

from __future__ import annotations

from typing import Any

from sandbox_worker.backends.base import (
    BackgroundProcess,
    DiskQuotaError,
    ExecResult,
    ImageNotFoundError,
    LlmRelay,
    NetworkPolicy,
    Sandbox,
    SandboxBackend,
    SandboxInfraError,
    SandboxLimits,
    SandboxSpec,
)

BACKENDS = ("docker", "bwrap")

__all__ = [
    "BACKENDS",
    "BackgroundProcess",
    "DiskQuotaError",
    "ExecResult",
    "ImageNotFoundError",
    "LlmRelay",
    "NetworkPolicy",
    "Sandbox",
    "SandboxBackend",
    "SandboxInfraError",
    "SandboxLimits",
    "SandboxSpec",
    "make_backend",
]


def make_backend(name: str, **kwargs: Any) -> SandboxBackend:
    """The backend called ``name`` (``docker`` or ``bwrap``), configured by ``kwargs``."""
    hub = kwargs.pop("hub", None)
    if name == "docker":
        from sandbox_worker.backends.docker import DockerBackend, DockerBackendConfig

        return DockerBackend(DockerBackendConfig(**kwargs), hub=hub)
    if name == "bwrap":
        from sandbox_worker.backends.bwrap import BwrapBackend, BwrapBackendConfig

        return BwrapBackend(BwrapBackendConfig(**kwargs), hub=hub)
    raise ValueError(f"unknown sandbox backend {name!r}; choose one of {', '.join(BACKENDS)}")
