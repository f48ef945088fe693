"""The weights directory of the disk transport: atomic versions, checksums, retention."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.support.engines import tiny_model_for_session
from trainer.backends.torch_backend import TorchBackend
from trainer.config import TrainerConfig
from trainer.publish import PublishConfig, PublishError, load_publish_config
from trainer.publish.versions import (
    export_version,
    exported_versions,
    prune_versions,
    read_manifest,
)


@pytest.fixture(scope="module")
def backend() -> Iterator[TorchBackend]:
    with tiny_model_for_session() as path:
        yield TorchBackend(TrainerConfig(model=str(path)))


def test_export_is_idempotent_for_the_same_weights_and_refuses_others(
    backend: TorchBackend, tmp_path: Path
) -> None:
    first = export_version(backend, tmp_path, 4)
    manifest = read_manifest(first)
    assert first == export_version(backend, tmp_path, 4)  # same weights again: no error
    assert read_manifest(first) == manifest
    param = next(backend.actor.parameters())
    saved = param.detach().clone()
    with torch.no_grad():
        param.add_(1.0)
    try:
        with pytest.raises(PublishError, match="exists with other weights"):
            export_version(backend, tmp_path, 4)
    finally:
        with torch.no_grad():
            param.copy_(saved)
    assert [p.name for p in tmp_path.iterdir()] == ["v4"]  # no staging left behind


def test_a_corrupted_file_fails_the_manifest_check(backend: TorchBackend, tmp_path: Path) -> None:
    directory = export_version(backend, tmp_path, 1)
    shard = next(directory.glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-8] + b"\0" * 8)
    with pytest.raises(PublishError, match="does not match its checksum"):
        read_manifest(directory)


def test_prune_keeps_the_newest_and_every_served_version(tmp_path: Path) -> None:
    for n in (1, 2, 3, 4, 5):
        (tmp_path / f"v{n}").mkdir()
    (tmp_path / ".v6.tmp-abc").mkdir()  # a killed export
    (tmp_path / "notes").mkdir()
    doomed = prune_versions(tmp_path, keep=2, protect={2})
    assert sorted(p.name for p in doomed) == ["v1", "v3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", "v2", "v4", "v5"]


def test_publish_config_is_validated() -> None:
    with pytest.raises(ValueError, match="weights_dir is required"):
        PublishConfig(adapter_url="http://a", admin_token="t")
    with pytest.raises(ValueError, match="must start with http"):
        PublishConfig(adapter_url="a:1", admin_token="t", weights_dir="/w")
    cfg = load_publish_config(
        environ={
            "SWERL_PUBLISH__ADAPTER_URL": "http://127.0.0.1:8100/",
            "SWERL_PUBLISH__ADMIN_TOKEN": "t",
            "SWERL_PUBLISH__TRANSPORT": "distributed",
            "SWERL_PUBLISH__DISTRIBUTED__BUCKET_MB": "0.5",
            "SWERL_PUBLISH__WEIGHTS_DIR": "/w",
        }
    )
    assert cfg.adapter_url == "http://127.0.0.1:8100"
    assert cfg.distributed.bucket_mb == 0.5
    assert cfg.distributed.export_to_disk  # the recovery path is on by default
    # The broadcast transport exports to disk too unless told not to: it needs weights_dir.
    with pytest.raises(ValueError, match="weights_dir is required"):
        PublishConfig(adapter_url="http://a", admin_token="t", transport="distributed")
    bare = PublishConfig(
        adapter_url="http://a",
        admin_token="t",
        transport="distributed",
        distributed={"export_to_disk": False},
    )
    assert bare.weights_dir == ""
    from services.config import ConfigError

    with pytest.raises(ConfigError, match=r"publish\.transport"):
        load_publish_config(
            environ={
                "SWERL_PUBLISH__ADAPTER_URL": "http://a",
                "SWERL_PUBLISH__ADMIN_TOKEN": "t",
                "SWERL_PUBLISH__TRANSPORT": "carrier-pigeon",
            }
        )


def test_exported_versions_lists_only_version_directories(tmp_path: Path) -> None:
    assert exported_versions(tmp_path / "absent") == []
    for name in ("v10", "v2", "v3x", ".v11.tmp-ab"):
        (tmp_path / name).mkdir()
    (tmp_path / "v12").write_text("a file, not a version")
    assert exported_versions(tmp_path) == [2, 10]
