"""Settings of weight publishing (section ``publish`` of the swerl configuration).

Loaded with :func:`load_publish_config` (:func:`services.config.load_config`, section
``publish``): defaults < YAML < ``SWERL_PUBLISH__*`` environment < explicit overrides. See
docs/weights.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from services.config import StrictModel, load_config, register_section

SECTION = "publish"


class DistributedPublishConfig(StrictModel):
    """SGLang's broadcast protocol: the trainer's rank 0 is rank 0 of the group."""

    master_address: str = Field(
        default="127.0.0.1", min_length=1, description="address the engines reach rank 0 at"
    )
    master_port: int = Field(
        default=0, ge=0, le=65535, description="rendezvous port on rank 0 (0 = any free port)"
    )
    group_name: str = Field(default="swerl_weights", min_length=1)
    backend: Literal["gloo", "nccl"] = Field(
        default="gloo", description="gloo (CPU, tests) or nccl (GPU trainer and engines)"
    )
    bucket_mb: float = Field(
        default=512.0, gt=0, description="tensors per update_weights_from_distributed call"
    )
    timeout_s: float = Field(
        default=600.0, gt=0, description="group rendezvous and per-broadcast timeout"
    )
    export_to_disk: bool = Field(
        default=True,
        description="also export every version to weights_dir: the recovery path of an engine "
        "that failed mid-broadcast or restarted (false: such an engine stays out of rotation "
        "until a version with a disk copy is published)",
    )


class PublishConfig(StrictModel):
    """Where and how the trainer publishes each policy version."""

    transport: Literal["disk", "distributed"] = "disk"
    adapter_url: str = Field(min_length=1, description="base URL of the adapter")
    admin_token: str = Field(min_length=1, description="the adapter's admin bearer token")
    weights_dir: str = Field(
        default="", description="root of the v<version>/ directories (disk transport)"
    )
    keep_last: int = Field(
        default=3, ge=1, description="published versions kept on disk (served ones always)"
    )
    timeout_s: float = Field(
        default=1800.0, gt=0, description="longest wait for the adapter's refresh answer"
    )
    distributed: DistributedPublishConfig = DistributedPublishConfig()

    @field_validator("adapter_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"adapter_url must start with http:// or https://, got {url!r}")
        return url

    @model_validator(mode="after")
    def _disk_needs_a_directory(self) -> PublishConfig:
        needs_dir = self.transport == "disk" or self.distributed.export_to_disk
        if needs_dir and not self.weights_dir:
            raise ValueError("weights_dir is required for the disk transport / export_to_disk")
        return self


register_section(SECTION, PublishConfig)


def load_publish_config(
    path: str | Path | None = None,
    *,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> PublishConfig:
    """The ``publish`` section from YAML / ``SWERL_PUBLISH__*`` / overrides, validated."""
    return load_config(
        PublishConfig, section=SECTION, path=path, overrides=overrides, environ=environ
    )
