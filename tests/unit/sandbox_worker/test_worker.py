"""The worker's progress events around one task, on a stub queue: the task's start, what its
runner tells ``ctx.progress``, and its end (how it ended, a hand-back included)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sandbox_worker.config import WorkerConfig
from sandbox_worker.metrics import HANDED_BACK
from sandbox_worker.progress import ProgressReporter
from sandbox_worker.runner import SHUTDOWN, RunContext
from sandbox_worker.worker import Worker
from services.protocol.progress import ProgressPhase, TrajectoryProgress
from services.protocol.tasks import RolloutTask, TaskResult
from services.protocol.trajectory import Outcome, OutcomeStatus
from services.queue.entries import task_payload


@dataclass
class StubQueue:
    """The WorkerQueue calls one task makes."""

    def start(self, task_id: str, entry: str, node: str) -> str:
        return "running"

    def complete(self, result: TaskResult, entry: str) -> str:
        return "final"

    def requeue(self, task_id: str, entry: str, node: str, reason: str, kind: str) -> str:
        return "requeued"


@dataclass
class RecordingStore:
    emitted: list[TrajectoryProgress] = field(default_factory=list)

    def emit(self, *events: TrajectoryProgress) -> None:
        self.emitted.extend(events)

    def record_counts(self, trajectory_ids: list[str]) -> dict[str, tuple[int, int]]:
        return {t: (2, 300) for t in trajectory_ids}


@dataclass
class AgentRunner:
    """Tells its phases, like the real runners, while the worker's progress thread ticks
    (``tick``); ``shutdown``: stopped by a shutdown."""

    shutdown: bool = False
    tick: Callable[[], object] = lambda: None

    def run(self, task: RolloutTask, ctx: RunContext) -> Outcome:
        self.tick()
        ctx.progress.phase(ProgressPhase.AGENT)
        ctx.progress.tool("terminal")
        self.tick()
        if self.shutdown:
            ctx.cancel.cancel(SHUTDOWN)
            return Outcome(status=OutcomeStatus.ABORTED, abort_reason=SHUTDOWN)
        return Outcome(status=OutcomeStatus.COMPLETED, reward=1.0)


def run_one(runner: AgentRunner) -> tuple[RolloutTask, list[TrajectoryProgress]]:
    store = RecordingStore()
    cfg = WorkerConfig(node="n1", slots=1, backend="simulated")
    progress = ProgressReporter(store, cfg.node)  # type: ignore[arg-type]
    worker = Worker(cfg, runner, queue=StubQueue(), progress=progress)  # type: ignore[arg-type]
    runner.tick = progress.tick
    task = RolloutTask(task_id="rollout-1:0:0", batch_id="rollout-1", job_id="rollout-1",
                       group_id="rollout-1:0", instance_id="swerl__spanlib-1")  # fmt: skip
    fields = {b"task_id": task.task_id.encode(), b"attempt": b"1",
              b"payload": task_payload(task).encode()}  # fmt: skip
    worker._handle("1-1", fields)
    worker._run_task(worker._jobs.get())
    progress.tick()
    return task, store.emitted


def test_a_task_goes_out_from_start_to_its_outcome() -> None:
    task, events = run_one(AgentRunner())
    assert [e.phase for e in events] == ["starting", "agent", "done"]
    assert events[1].current_tool == "terminal"
    assert {e.trajectory_id for e in events} == {task.trajectory_id}
    assert {e.batch_id for e in events} == {task.batch_id}
    done = events[-1]
    assert (done.status, done.turn, done.tokens, done.node) == ("completed", 2, 300, "n1")
    assert done.elapsed_s >= 0 and done.started_at == events[0].started_at


def test_a_handed_back_task_says_so() -> None:
    _, events = run_one(AgentRunner(shutdown=True))
    assert events[-1].phase == "done" and events[-1].status == HANDED_BACK


def test_a_worker_on_a_stand_in_queue_reports_nothing() -> None:
    cfg = WorkerConfig(node="n1", slots=1, backend="simulated")
    worker = Worker(cfg, AgentRunner(), queue=StubQueue())  # type: ignore[arg-type]
    assert worker.progress.store is None
