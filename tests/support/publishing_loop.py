"""A training loop's parts publishing for real: a reference engine (in a thread), the adapter
in front of it, a disk publisher and the adapter's admin client; for the loop's integration
tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis

from services.manager.client import RolloutManager
from tests.integration.adapter.conftest import ADMIN_TOKEN, AdapterFactory
from tests.support.engines import reference_server_in_thread
from trainer.backends import create_backend
from trainer.config import TrainerConfig
from trainer.loop.driver import LoopParts
from trainer.publish import PublishConfig, make_publisher


@dataclass(frozen=True)
class PublishingStack:
    engine_url: str
    parts: Callable[[], LoopParts]  # fresh parts (a new backend) for each loop


@contextmanager
def publishing_stack(
    adapter: AdapterFactory, model_dir: Path, weights_dir: Path, trainer: TrainerConfig,
    manager: RolloutManager, redis_url: str,
) -> Iterator[PublishingStack]:  # fmt: skip
    """Engine, adapter, publisher and store for loops of ``trainer``; everything closed after."""
    from trainer.publish.base import AdminClient

    store = redis.Redis.from_url(redis_url, decode_responses=False)
    with (
        reference_server_in_thread(model_dir, weight_version="0") as engine,
        adapter(engines=[engine.url]) as a,
    ):
        publish = PublishConfig(
            adapter_url=a.url, admin_token=ADMIN_TOKEN, weights_dir=str(weights_dir)
        )
        publisher, admin = make_publisher(publish), AdminClient(a.url, ADMIN_TOKEN, 120)

        def parts() -> LoopParts:
            served = lambda: max(admin.served_versions())  # noqa: E731
            return LoopParts(create_backend(trainer), manager, store, publisher, served)

        try:
            yield PublishingStack(engine.url, parts)
        finally:
            publisher.close()
            admin.close()
            store.close()
