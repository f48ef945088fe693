"""The sandbox worker of one node: a Redis stream consumer with a fixed number of slots.

Threads: the main thread reads tasks (never more than its free slots), one thread per slot
calls the runner, a heartbeat thread keeps the node alive in Redis (and keeps the running
entries' idle time at zero so they are never taken back from a live worker), and a listener
thread stops the runs of a cancelled batch the moment the cancel is published, and a progress
thread emits the running trajectories' progress events (turn, tokens, current tool; throttled,
:mod:`sandbox_worker.progress`) to a Redis stream per batch that the job API serves.

Life cycle: take the node name over -- at once when the previous worker of the node is provably
gone (same host, its pid dead), else after waiting (bounded, logged) for its heartbeat to
expire; refuse to start if the heartbeat is renewed meanwhile (a live worker holds the name);
clean up what a crashed previous run of this node left (``backend.cleanup_node``: its
sandboxes, at takeover) and hand back the tasks it had taken (new attempts, so new trajectory
ids; the queue closes the old attempts' open trajectory records as aborted); serve; on
SIGTERM/SIGINT stop taking work, hand back what was queued for this node, let running
trajectories finish within the grace period, then stop the rest and hand them back; remove the
heartbeat.
"""

from __future__ import annotations

import logging
import os
import queue as queue_mod
import socket
import threading
import time
import uuid
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from sandbox_worker.config import WorkerConfig
from sandbox_worker.metrics import HANDED_BACK, WorkerMetrics
from sandbox_worker.progress import TICK_S, ProgressReporter
from sandbox_worker.runner import (
    CANCELLED,
    SHUTDOWN,
    CancelToken,
    NodeCleaner,
    RunContext,
    TrajectoryRunner,
)
from services.protocol.tasks import RolloutTask, TaskResult
from services.protocol.trajectory import Outcome, OutcomeStatus
from services.queue.base import RequeueKind
from services.queue.connection import TRANSIENT_ERRORS, backoff_sleep, retry_forever
from services.queue.entries import PayloadError, decode_task_entry
from services.queue.worker import RawEntry, WorkerQueue
from services.store.progress import ProgressStore

log = logging.getLogger("swerl.worker")


class NodeConflictError(RuntimeError):
    """Another live worker already serves this node name."""


@dataclass
class _Running:
    entry: str
    task: RolloutTask
    token: CancelToken
    started: float
    done: threading.Event = field(default_factory=threading.Event)


class _TaskLog(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        return f"[{self.extra['trajectory'] if self.extra else '?'}] {msg}", kwargs


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _progress_reporter(queue: WorkerQueue, node: str) -> ProgressReporter:
    """Progress events on the queue's Redis, under its prefix (a stand-in queue: none)."""
    if not isinstance(queue, WorkerQueue):
        return ProgressReporter(None, node)
    return ProgressReporter(ProgressStore(queue.redis, queue.cfg.prefix), node)


class Worker:
    def __init__(
        self,
        cfg: WorkerConfig,
        runner: TrajectoryRunner,
        *,
        backend: NodeCleaner | None = None,
        queue: WorkerQueue | None = None,
        metrics: WorkerMetrics | None = None,
        progress: ProgressReporter | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics or WorkerMetrics()
        self.metrics.set_slots(cfg.slots)
        self.node = cfg.node
        self.runner = runner
        self.backend = backend
        self.queue = queue or WorkerQueue(cfg.redis_url, cfg.queue)
        self.progress = progress or _progress_reporter(self.queue, cfg.node)
        self.instance = uuid.uuid4().hex[:12]
        self.host = socket.gethostname()
        self.started_at = time.time()
        self._running: dict[str, _Running] = {}
        self._lock = threading.Lock()
        self._slot_freed = threading.Event()
        self._stopping = threading.Event()  # stop taking work (first signal)
        self._abandon = threading.Event()  # skip the grace period (second signal)
        self._threads_stop = threading.Event()  # stop heartbeat and listener threads
        self._draining = False
        self._jobs: queue_mod.SimpleQueue[_Running | None] = queue_mod.SimpleQueue()
        self.completed = 0

    # ------------------------------------------------------------------ control
    def request_stop(self, immediate: bool = False) -> None:
        """Begin a graceful shutdown; ``immediate`` skips the grace period (second signal)."""
        if immediate or self._stopping.is_set():
            self._abandon.set()
        self._stopping.set()
        self._slot_freed.set()

    @property
    def busy(self) -> int:
        with self._lock:
            return len(self._running)

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        """Serve until stopped; returns the process exit status."""
        failures = 0
        while True:  # every start-up step is idempotent: retry them all after an outage
            if not self._wait_for_redis():
                return 0
            try:
                if not self._start_up():
                    log.info("stop requested while waiting to take node %s over", self.node)
                    return 0
                break
            except TRANSIENT_ERRORS as exc:
                failures += 1
                log.warning("start-up interrupted (%s); retrying", exc)
                backoff_sleep(failures, self._stopping, self.cfg.queue.backoff_cap_s)
        threads = [
            threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True),
            threading.Thread(target=self._cancel_listener, name="cancel-listener", daemon=True),
            threading.Thread(target=self._progress_loop, name="progress", daemon=True),
        ]
        # One thread per slot, daemons: a runner that never returns cannot block the exit.
        slot_threads = [
            threading.Thread(target=self._slot_loop, name=f"slot-{i}", daemon=True)
            for i in range(self.cfg.slots)
        ]
        for t in threads + slot_threads:
            t.start()
        log.info(
            "worker %s serving: node=%s slots=%d backend=%s",
            self.instance,
            self.node,
            self.cfg.slots,
            self.cfg.backend,
        )
        try:
            self._serve()
        finally:
            self._shutdown()
            self._threads_stop.set()
            for _ in slot_threads:
                self._jobs.put(None)
            for t in threads:
                t.join(timeout=5)
        log.info("worker %s stopped after %d task(s)", self.instance, self.completed)
        return 0

    def _start_up(self) -> bool:
        """Claim the node, reap and recover what a previous run left; False if stopped."""
        if not self._claim_node():
            return False
        if self.backend is not None:
            removed = self.backend.cleanup_node(self.node)
            log.info("cleanup_node(%s): removed %d leftover sandbox(es)", self.node, removed)
        self.queue.ensure_group(self.node)
        self._recover_previous_run()
        self._beat()
        return True

    def _wait_for_redis(self) -> bool:
        failures = 0
        while not self._stopping.is_set():
            try:
                self.queue.redis.ping()
                return True
            except TRANSIENT_ERRORS as exc:
                failures += 1
                if failures == 1 or failures % 20 == 0:
                    log.warning("waiting for Redis at %s: %s", self.cfg.redis_url, exc)
                backoff_sleep(failures, self._stopping, self.cfg.queue.backoff_cap_s)
        return False

    def _claim_node(self) -> bool:
        """Make sure no other live worker serves the node; False if a stop came meanwhile.

        A previous worker killed without shutting down leaves its heartbeat for up to
        ``heartbeat_ttl_s``. On the same host with its pid gone (or reused by this very
        process, as a supervisor restarting a container's pid 1 does) it is taken over at
        once; otherwise (another host or container, a pid now used by someone else) the
        heartbeat is watched: expired -> take over; renewed -> a live worker holds the name.
        """
        hb = self.queue.node_heartbeat(self.node)
        if not hb or hb.get("instance") == self.instance:
            return True
        pid = int(hb["pid"]) if hb.get("pid", "").isdigit() else 0
        if hb.get("host") == self.host and (pid == os.getpid() or not _pid_alive(pid)):
            log.warning(
                "node %s: previous worker (pid %d) is gone without shutting down; taking over",
                self.node,
                pid,
            )
            return True
        return self._await_heartbeat_expiry(hb)

    def _await_heartbeat_expiry(self, seen: dict[str, str]) -> bool:
        """Wait (bounded) for the heartbeat ``seen`` to expire: True to take over, False if a
        stop was requested; :class:`NodeConflictError` when it is renewed (or outlives the
        bound: TTL plus two heartbeat intervals and a second of slack)."""
        ttl = self.cfg.queue.heartbeat_ttl_s
        interval = self.cfg.heartbeat_interval_s
        bound = ttl + 2 * interval + 1.0
        who = f"host {seen.get('host')}, pid {seen.get('pid')}, instance {seen.get('instance')}"
        log.warning(
            "node %s has the heartbeat of another worker (%s); waiting up to %.1f s for it to "
            "expire (then this worker takes the node over) or be renewed (then it refuses)",
            self.node,
            who,
            bound,
        )
        started = time.monotonic()
        while not self._stopping.wait(min(0.2, interval / 2)):
            hb = self.queue.node_heartbeat(self.node)
            waited = time.monotonic() - started
            if not hb:
                log.warning(
                    "node %s: the heartbeat of the previous worker (%s) expired after %.1f s of "
                    "waiting; taking over",
                    self.node,
                    who,
                    waited,
                )
                return True
            renewed = hb.get("instance") != seen.get("instance") or hb.get("ts") != seen.get("ts")
            if renewed or waited > bound:
                raise NodeConflictError(
                    f"node {self.node!r} is already served by a live worker (host "
                    f"{hb.get('host')}, pid {hb.get('pid')}): its heartbeat was "
                    f"{'renewed' if renewed else f'not expired after {waited:.1f} s'}; use "
                    "another --node name or stop that worker first"
                )
        return False

    def _recover_previous_run(self) -> None:
        """Entries a previous run of this node took and never acknowledged: hand them back."""
        for eid, fields in self.queue.own_pending(self.node):
            reason = (
                f"worker of node {self.node} restarted; the previous run ended without a result"
            )
            status = self._hand_back_entry(eid, fields, reason, "lost")
            log.warning("recovered entry %s of the previous run: %s", eid, status)

    def _hand_back_entry(
        self, eid: str, fields: dict[bytes, bytes], reason: str, kind: RequeueKind
    ) -> str:
        try:
            entry = decode_task_entry(eid, fields)
        except PayloadError as exc:
            return self.queue.dead_letter(self.node, eid, fields, f"invalid task entry: {exc}")
        return self.queue.requeue(entry.task.task_id, eid, self.node, reason, kind)

    def _serve(self) -> None:
        failures = 0
        check_orphans = False
        last_orphan_check = time.monotonic()
        while not self._stopping.is_set():
            self._slot_freed.clear()
            free = self.cfg.slots - self.busy
            if free <= 0:
                self._slot_freed.wait(0.5)
                continue
            try:
                if check_orphans or (
                    time.monotonic() - last_orphan_check > self.cfg.orphan_check_interval_s
                ):
                    orphans = self._orphans()
                    entries = orphans[:free]
                    last_orphan_check = time.monotonic()
                    check_orphans = len(orphans) > free
                else:
                    entries = self.queue.read_tasks(self.node, free, self.cfg.block_ms)
                for eid, fields in entries:
                    if self._stopping.is_set():
                        break  # left unread/un-started: handed back by _shutdown
                    self._handle(eid, fields)
                failures = 0
            except TRANSIENT_ERRORS as exc:
                failures += 1
                check_orphans = True  # a read whose reply was lost leaves entries unseen
                if failures == 1 or failures % 20 == 0:
                    log.warning("Redis unreachable (%s); retrying", exc)
                backoff_sleep(failures, self._stopping, self.cfg.queue.backoff_cap_s)

    def _orphans(self) -> list[RawEntry]:
        with self._lock:
            running = set(self._running)
        return [e for e in self.queue.own_pending(self.node) if e[0] not in running]

    def _handle(self, eid: str, fields: dict[bytes, bytes]) -> None:
        try:
            entry = decode_task_entry(eid, fields)
        except PayloadError as exc:
            status = self.queue.dead_letter(self.node, eid, fields, f"invalid task entry: {exc}")
            log.error("dead-lettered entry %s (%s): %s", eid, status, exc)
            return
        task = entry.task
        status = self.queue.start(task.task_id, eid, self.node)
        if status != "running":
            log.info("dropped entry %s of task %s: task is %s", eid, task.task_id, status)
            return
        rt = _Running(entry=eid, task=task, token=CancelToken(), started=time.time())
        with self._lock:
            self._running[eid] = rt
        self.metrics.started()
        self._jobs.put(rt)

    def _slot_loop(self) -> None:
        while (rt := self._jobs.get()) is not None:
            try:
                self._run_task(rt)
            except Exception:  # a bug must not cost the node a slot; the entry stays un-acked
                log.exception("slot failed on %s; the orphan check will retry it", rt.entry)

    # ------------------------------------------------------------------ one task
    def _run_task(self, rt: _Running) -> None:
        task = rt.task
        tlog = _TaskLog(log, {"trajectory": task.trajectory_id})
        progress = self.progress.start(task, rt.started)
        ctx = RunContext(
            node=self.node, cancel=rt.token, log=tlog, entry_id=rt.entry, progress=progress
        )
        ended, durations = OutcomeStatus.ABORTED.value, dict[str, float]()  # for the metrics
        try:
            try:
                outcome = self.runner.run(task, ctx)
                if not isinstance(outcome, Outcome):
                    raise TypeError(f"runner returned {type(outcome).__name__}, not an Outcome")
            except Exception as exc:
                tlog.exception("runner failed")
                outcome = Outcome(
                    status=OutcomeStatus.ABORTED,
                    abort_reason=f"runner failed: {type(exc).__name__}: {exc}"[:2000],
                    durations={"run": time.time() - rt.started},
                )
            ended, durations = outcome.status.value, outcome.durations
            if rt.token.reason == SHUTDOWN:
                ended = HANDED_BACK
                status = retry_forever(
                    lambda: self.queue.requeue(
                        task.task_id, rt.entry, self.node, SHUTDOWN, "handback"
                    ),
                    what=f"hand back {task.task_id}",
                    log=log,
                    give_up=self._threads_stop,
                )
                tlog.info("handed back (%s)", status)
                return
            result = TaskResult(
                task_id=task.task_id,
                batch_id=task.batch_id,
                trajectory_id=task.trajectory_id,
                node=self.node,
                attempt=task.attempt,
                outcome=outcome,
            )
            status = retry_forever(
                lambda: self.queue.complete(result, rt.entry),
                what=f"report {task.task_id}",
                log=log,
                give_up=self._threads_stop,
            )
            with self._lock:
                self.completed += 1
            tlog.info(
                "finished: %s%s -> %s",
                outcome.status,
                f" ({outcome.abort_reason})" if outcome.abort_reason else "",
                status,
            )
        finally:
            with self._lock:
                self._running.pop(rt.entry, None)
            rt.done.set()
            self._slot_freed.set()
            self.metrics.finished(ended, time.time() - rt.started, durations)
            self.progress.finish(task, ended)

    # ------------------------------------------------------------------ heartbeat / cancel
    def _beat(self) -> None:
        with self._lock:
            running = list(self._running.values())
        fields: dict[str, str | int | float] = {
            "slots": self.cfg.slots,
            "busy": len(running),
            "pid": os.getpid(),
            "host": self.host,
            "instance": self.instance,
            "backend": self.cfg.backend,
            "draining": "1" if self._draining else "0",
            "started": self.started_at,
        }
        _new, cancelled = self.queue.heartbeat(
            self.node,
            fields,
            [rt.entry for rt in running],
            [rt.task.batch_id for rt in running],
        )
        self.metrics.heartbeat()
        for batch_id in cancelled:
            self._cancel_batch(batch_id)

    def _heartbeat_loop(self) -> None:
        failures = 0
        while not self._threads_stop.wait(self.cfg.heartbeat_interval_s if not failures else 0.2):
            try:
                self._beat()
                failures = 0
            except TRANSIENT_ERRORS as exc:
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    log.warning("heartbeat failed (%s); retrying", exc)
                backoff_sleep(failures, self._threads_stop, self.cfg.queue.backoff_cap_s)

    def _progress_loop(self) -> None:
        """Emit the due progress events every tick, and the last ones (the runs' ends) when the
        worker stops. The reporter drops what Redis refuses; a bug must not end the thread."""
        stopping = False
        while not stopping:
            stopping = self._threads_stop.wait(TICK_S)
            try:
                self.progress.tick()
            except Exception:
                log.exception("progress tick failed")

    def _cancel_batch(self, batch_id: str) -> None:
        with self._lock:
            hits = [rt for rt in self._running.values() if rt.task.batch_id == batch_id]
        for rt in hits:
            if rt.token.cancel(CANCELLED):
                log.info("stopping %s: batch %s cancelled", rt.task.trajectory_id, batch_id)

    def _cancel_listener(self) -> None:
        """Fast path for cancels (pub/sub); the heartbeat's key check covers missed messages."""
        failures = 0
        channel = self.queue.keys.cancel_channel
        while not self._threads_stop.is_set():
            pubsub = self.queue.redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(channel)
                failures = 0
                while not self._threads_stop.is_set():
                    msg = pubsub.get_message(timeout=0.5)
                    if msg and msg.get("type") == "message":
                        data = msg["data"]
                        self._cancel_batch(data.decode() if isinstance(data, bytes) else data)
            except TRANSIENT_ERRORS as exc:
                failures += 1
                if failures == 1 or failures % 50 == 0:
                    log.warning("cancel listener lost Redis (%s); resubscribing", exc)
                backoff_sleep(failures, self._threads_stop, self.cfg.queue.backoff_cap_s)
            finally:
                try:
                    pubsub.close()
                except Exception:  # closing a broken connection must not kill the listener
                    log.debug("closing pubsub failed", exc_info=True)

    # ------------------------------------------------------------------ shutdown
    def _shutdown(self) -> None:
        log.info("stopping: no new tasks; %d running", self.busy)
        self._draining = True
        retry_forever(
            lambda: self.queue.set_draining(self.node),
            what="set draining",
            log=log,
            give_up=self._abandon,
        )
        self._hand_back_queued()
        deadline = time.monotonic() + self.cfg.shutdown_grace_s
        while self.busy and time.monotonic() < deadline and not self._abandon.is_set():
            self._slot_freed.wait(0.2)
            self._slot_freed.clear()
        with self._lock:
            left = list(self._running.values())
        if left:
            log.warning("stopping %d running task(s) and handing them back", len(left))
            for rt in left:
                rt.token.cancel(SHUTDOWN)
            deadline = time.monotonic() + self.cfg.cancel_stop_timeout_s
            for rt in left:
                rt.done.wait(timeout=max(0.0, deadline - time.monotonic()))
            with self._lock:
                stuck = list(self._running.values())
            for rt in stuck:
                log.error("runner of %s did not stop; handing it back", rt.task.trajectory_id)
                retry_forever(
                    lambda rt=rt: self.queue.requeue(
                        rt.task.task_id, rt.entry, self.node, SHUTDOWN, "handback"
                    ),
                    what=f"hand back {rt.task.task_id}",
                    log=log,
                    give_up=self._threads_stop,
                )
        try:
            self.queue.drop_heartbeat(self.node)
        except TRANSIENT_ERRORS as exc:
            log.warning("could not remove the heartbeat (%s); it expires by itself", exc)

    def _hand_back_queued(self) -> None:
        """Give the entries queued for this node (prefetch) back to the pending list."""
        try:
            with self._lock:
                running = set(self._running)
            entries = [e for e in self.queue.own_pending(self.node) if e[0] not in running]
            while True:
                fresh = self.queue.read_tasks(self.node, 100, 1)
                if not fresh:
                    break
                entries += fresh
            for eid, fields in entries:
                self._hand_back_entry(eid, fields, "worker shutdown before start", "handback")
            if entries:
                log.info("handed back %d queued task(s)", len(entries))
        except TRANSIENT_ERRORS as exc:
            log.warning("could not hand back queued tasks (%s); the manager will", exc)
