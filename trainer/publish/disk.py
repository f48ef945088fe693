"""Disk transport: export ``v<version>/`` then ``POST /admin/weights {model_path, version}``."""

from __future__ import annotations

import time

from trainer.backends.base import TrainerBackend
from trainer.publish.base import (
    AdminClient,
    PublishResult,
    adapter_timings,
    idempotent_result,
    logprob_probe,
    served_already,
)
from trainer.publish.config import PublishConfig
from trainer.publish.versions import (
    directory_probes,
    export_version,
    exported_versions,
    prune_versions,
    version_dir,
    weights_checksum,
)


class DiskPublisher:
    """Publishes through the shared filesystem the engines read ``model_path`` from.

    Only rank 0 talks to the adapter; other data-parallel ranks take part in the (collective)
    export and return None.
    """

    def __init__(self, config: PublishConfig, rank: int = 0) -> None:
        self.config = config
        self.rank = rank
        self.admin = AdminClient(config.adapter_url, config.admin_token, config.timeout_s)

    def close(self) -> None:
        self.admin.close()

    def newest_exported(self) -> int | None:
        found = exported_versions(self.config.weights_dir)
        return found[-1] if found else None

    def publish(self, backend: TrainerBackend) -> PublishResult | None:
        started = time.perf_counter()
        version = backend.version
        probe = logprob_probe(backend)  # collective under data / tensor / pipeline parallel
        if self.rank != 0:
            backend.export_hf(version_dir(self.config.weights_dir, version))  # collective
            return None
        path = export_version(backend, self.config.weights_dir, version)
        checksum = weights_checksum(path)
        exported = time.perf_counter()
        served = self.admin.versions()
        if served_already(served, version, checksum, str(path)):
            # The same version with the same weights (export_version checked the checksum) is
            # served already: a trainer resumed from an older checkpoint re-publishes. No-op.
            return idempotent_result(version, "disk", str(path), started, exported)
        summary = self.admin.refresh_from_disk(
            str(path), version, checksum, directory_probes(path), probe
        )
        refreshed = time.perf_counter()
        pruned = prune_versions(
            self.config.weights_dir, self.config.keep_last, self.admin.served_versions()
        )
        timings = {
            "export": exported - started,
            "transfer": 0.0,
            "refresh": refreshed - exported,
            **adapter_timings(summary),
            "total": time.perf_counter() - started,
        }
        return PublishResult(version, "disk", str(path), timings, summary, [str(p) for p in pruned])
