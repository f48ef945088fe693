"""TEST MACHINERY: the Redis record of simulated runs (see :mod:`sandbox_worker.testing`).

Stands for nothing in production: scheduling tests and benchmarks read it to see what the
simulated runner did (how many runs a node had at once, which attempts started and ended),
independently of the queue's own bookkeeping.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis

from services.protocol.tasks import RolloutTask
from services.protocol.trajectory import Outcome
from services.queue.connection import retry_forever

_log = logging.getLogger("swerl.worker.simulated")

_PROBE_START = """
local r = redis.call('INCR', KEYS[1])
if r > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], r) end
redis.call('RPUSH', KEYS[3], ARGV[1])
return r
"""


class SimulatedProbe:
    """Records simulated runs in Redis, independently of the queue's own bookkeeping.

    Keys (under ``<prefix>sim:``): ``running:<node>`` runs in progress, ``max:<node>`` the
    highest value it reached, ``starts`` and ``runs`` JSON lines of every start and every end.
    A run killed with its worker has a start and no end.
    """

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.base = f"{prefix}sim:"
        self._start = client.register_script(_PROBE_START)

    def started(self, node: str, task: RolloutTask) -> float:
        t0 = time.time()
        rec = {"task_id": task.task_id, "attempt": task.attempt, "node": node, "t0": t0}
        keys = [f"{self.base}running:{node}", f"{self.base}max:{node}", f"{self.base}starts"]
        # Retried across Redis outages: a measurement must not turn into a failed run.
        retry_forever(
            lambda: self._start(keys=keys, args=[json.dumps(rec)]), what="probe", log=_log
        )
        return t0

    def ended(self, node: str, task: RolloutTask, t0: float, outcome: Outcome) -> None:
        rec = {
            "task_id": task.task_id,
            "attempt": task.attempt,
            "node": node,
            "t0": t0,
            "t1": time.time(),
            "status": str(outcome.status),
            "reason": outcome.abort_reason,
        }

        def write() -> None:
            pipe = self.client.pipeline(transaction=True)
            pipe.decr(f"{self.base}running:{node}")
            pipe.rpush(f"{self.base}runs", json.dumps(rec))
            pipe.execute()

        retry_forever(write, what="probe", log=_log)

    def max_concurrent(self, node: str) -> int:
        return int(self.client.get(f"{self.base}max:{node}") or 0)

    def starts(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.client.lrange(f"{self.base}starts", 0, -1)]

    def runs(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.client.lrange(f"{self.base}runs", 0, -1)]
