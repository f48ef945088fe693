"""What ``python -m services.demo`` prints and writes about a finished rollout batch.

One row per trajectory names the instance, the sample and the engine's role (scripted or
sampling), never a port; a per-instance table gives resolved counts and pass@k (k = the samples
of the instance); ``summary`` is the ``--json`` document the end-to-end test reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from services.protocol import TaskResult
from services.protocol.trajectory import TrajectoryRecord


@dataclass(frozen=True)
class TrajectoryRow:
    """One finished trajectory as the demo reports it."""

    trajectory_id: str
    instance_id: str
    sample_index: int
    group_id: str | None
    engines: list[str]
    status: str
    reward: float | None
    turns: int
    generated_tokens: int
    abort_reason: str | None = None
    durations: dict[str, float] = field(default_factory=dict)


def trajectory_row(
    result: TaskResult,
    record: TrajectoryRecord | None,
    task: tuple[str, int],
    roles: dict[str, str],
) -> TrajectoryRow:
    """The row of ``result``; ``task`` is its (instance id, sample index), ``roles`` maps an
    engine URL to its role."""
    o = result.outcome
    engines = sorted({t.engine for s in record.segments for t in s.turns}) if record else []
    return TrajectoryRow(
        trajectory_id=result.trajectory_id,
        instance_id=task[0],
        sample_index=task[1],
        group_id=record.meta.group_id if record else None,
        engines=[roles.get(e, e) for e in engines],
        status=str(o.status),
        reward=o.reward,
        turns=record.n_turns if record else 0,
        generated_tokens=record.n_generated_tokens if record else 0,
        abort_reason=o.abort_reason or None,
        durations=dict(o.durations),
    )


def trajectory_table(rows: list[TrajectoryRow]) -> list[str]:
    """Printable lines: one per trajectory, sorted by instance and sample."""
    lines = [f"{'instance':<28} {'sample':>6} {'engine':<9} {'status':<10} {'reward':>6} "
             f"{'turns':>5} {'gen tok':>7}"]  # fmt: skip
    for r in sorted(rows, key=lambda r: (r.instance_id, r.sample_index)):
        reward = "-" if r.reward is None else f"{r.reward:.0f}"
        line = (f"{r.instance_id:<28} {r.sample_index:>6} {','.join(r.engines) or '-':<9} "
                f"{r.status:<10} {reward:>6} {r.turns:>5} {r.generated_tokens:>7}")  # fmt: skip
        lines.append(line + (f"  ({r.abort_reason})" if r.abort_reason else ""))
    return lines


@dataclass(frozen=True)
class InstanceScore:
    """Per instance: samples, how many resolved (reward 1), how many aborted, pass@k."""

    instance_id: str
    samples: int
    resolved: int
    aborted: int

    @property
    def pass_at_k(self) -> float:
        """1 if any sample resolved it (k = all its samples), else 0."""
        return 1.0 if self.resolved else 0.0


def instance_scores(rows: list[TrajectoryRow]) -> list[InstanceScore]:
    by_instance: dict[str, list[TrajectoryRow]] = {}
    for r in rows:
        by_instance.setdefault(r.instance_id, []).append(r)
    return [
        InstanceScore(
            instance_id=iid,
            samples=len(rs),
            resolved=sum(1 for r in rs if r.reward == 1.0),
            aborted=sum(1 for r in rs if r.status == "aborted"),
        )
        for iid, rs in sorted(by_instance.items())
    ]


def instance_table(scores: list[InstanceScore]) -> list[str]:
    """Printable lines: resolved / samples and pass@k per instance, then the totals."""
    lines = [f"{'instance':<28} {'resolved':>8} {'aborted':>7} {'pass@k':>6}"]
    for s in scores:
        lines.append(f"{s.instance_id:<28} {s.resolved:>4}/{s.samples:<3} {s.aborted:>7} "
                     f"{s.pass_at_k:>6.0f}")  # fmt: skip
    if scores:
        solved = sum(s.pass_at_k for s in scores)
        total = sum(s.samples for s in scores)
        resolved = sum(s.resolved for s in scores)
        lines.append(f"{'all':<28} {resolved:>4}/{total:<3} {sum(s.aborted for s in scores):>7} "
                     f"{solved / len(scores):>6.2f}")  # fmt: skip
    return lines


def summary(rows: list[TrajectoryRow], objective: dict[str, Any] | None) -> dict[str, Any]:
    """``--json``: the trajectories, each group's rewards, the instances' scores, the objective."""
    groups: dict[str, list[float | None]] = {}
    for row in sorted(rows, key=lambda r: (r.instance_id, r.sample_index)):
        groups.setdefault(str(row.group_id), []).append(row.reward)
    mixed = [g for g, rewards in groups.items() if len(set(rewards) - {None}) > 1]
    scores = instance_scores(rows)
    return {
        "trajectories": [asdict(r) for r in rows],
        "groups": groups,
        "mixed_groups": sorted(mixed),
        "instances": [{**asdict(s), "pass_at_k": s.pass_at_k} for s in scores],
        "objective": objective,
    }


def progress_line(done: int, total: int, elapsed_s: float, detail: str) -> str:
    """``3/8 done, 1m20s elapsed, ETA 2m10s (...)``; the ETA extrapolates the finished share."""
    eta = "ETA --" if done == 0 else f"ETA {_clock(elapsed_s / done * (total - done))}"
    return f"{done}/{total} done, {_clock(elapsed_s)} elapsed, {eta} ({detail})"


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
