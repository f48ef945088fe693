"""A training run over a two-file mixture (JSONL + parquet) sends the worker requests it can
resolve: the trainer's collector submits through the real rollout manager and Redis queue, the
tasks reach a node's stream, and the worker's own resolution (sandbox_worker.factory: the task
sets of ``worker.rollout.datasets`` and the image rule) maps each ``<dataset>/<instance_id>``
key to its row and to its dataset's image, including an id both datasets hold."""

from __future__ import annotations

from pathlib import Path

import redis

from sandbox_worker import images
from sandbox_worker.config import TrajectoryRunnerConfig
from sandbox_worker.factory import _image_naming, worker_task_instances
from services.manager.client import RolloutManager
from services.manager.config import ManagerConfig
from services.queue.entries import decode_task_entry
from tests.support.mixtures import SHARED_ID, write_two_file_mixture
from tests.support.queue_sides import NODE, SIDES_CFG, QueueSides, beat
from tests.support.queue_sides import q as q  # the fixture
from trainer.loop.collector import Collector
from trainer.loop.config import TrainConfig
from trainer.loop.phases import BatchShape
from trainer.loop.prompts import make_cursor


def test_mixture_requests_resolve_to_rows_and_images(
    tmp_path: Path, redis_url: str, q: QueueSides
) -> None:
    mix = write_two_file_mixture(tmp_path)
    train = TrainConfig(run_dir=str(tmp_path / "run"), run_id="mix", steps=1,
                        dataset={"mixture": mix.spec, "seed": 5})  # fmt: skip
    manager = RolloutManager(redis_url, ManagerConfig(redis_url=redis_url, queue=SIDES_CFG))
    store = redis.Redis.from_url(redis_url, decode_responses=False)
    collector = Collector(manager, store, make_cursor(train.dataset), train)
    shape = BatchShape(prompts=10, group_size=1, budget=20)
    try:
        collector.submit(shape, 0)
        beat(q, NODE, slots=10)
        q.dispatcher.dispatch(NODE, 10, 10)
        tasks = [decode_task_entry(eid, f).task for eid, f in q.worker.read_tasks(NODE, 10, 1)]
    finally:
        collector.feed.join()
        manager.close()
        store.close()
    keys = [task.instance_id for task in tasks]
    assert len(keys) == 10 and all(key in mix.rows for key in keys), keys
    assert {key.split("/")[0] for key in keys} == {"gym", "smith"}

    rc = TrajectoryRunnerConfig(datasets=mix.spec, task_sets_dir=str(tmp_path / "no-sets"),
                                dataset_images={"smith": "swebench"})  # fmt: skip
    instances = worker_task_instances(rc)
    image_for = _image_naming(rc, instances)
    for key in keys:
        row = instances[key]
        assert row.to_swebench_dict()["patch"] == mix.rows[key]["patch"]
        assert row.instance_id == mix.rows[key]["instance_id"]  # the row keeps its own id
    # the id both datasets hold: two rows, two images, never confused
    gym, smith = f"gym/{SHARED_ID}", f"smith/{SHARED_ID}"
    assert image_for(gym) == images.local_image("gym", SHARED_ID)
    assert image_for(gym).startswith("swerl/gym/sweb.eval.x86_64.")
    assert image_for(smith) == images.swebench_image(SHARED_ID)
    assert instances[gym].instance_id == instances[smith].instance_id == SHARED_ID
