"""Publishing the trainer's weights to the engines (issue 11): disk and distributed transports.

``make_publisher(config)`` returns the transport the ``publish`` config names; ``publish(backend)``
publishes ``backend.version`` and returns a :class:`PublishResult` with timings, or raises
:class:`PublishError` (the engines keep serving the previous version). See docs/weights.md.
"""

from __future__ import annotations

from trainer.publish.base import Publisher, PublishError, PublishResult, publish_metrics
from trainer.publish.config import PublishConfig, load_publish_config
from trainer.publish.disk import DiskPublisher
from trainer.publish.distributed import DistributedPublisher


def make_publisher(config: PublishConfig, rank: int = 0, device: str = "cpu") -> Publisher:
    if config.transport == "disk":
        return DiskPublisher(config, rank)
    return DistributedPublisher(config, rank, device)


__all__ = [
    "DiskPublisher",
    "DistributedPublisher",
    "PublishConfig",
    "PublishError",
    "PublishResult",
    "Publisher",
    "load_publish_config",
    "make_publisher",
    "publish_metrics",
]
