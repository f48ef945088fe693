"""How the CLI shows jobs: a table, a detail view, a one-line progress bar, and one line per
trajectory's progress event (``GET /v1/jobs/{id}/progress``)."""

from __future__ import annotations

import time
from typing import Any

BAR_WIDTH = 30


def progress_bar(job: dict[str, Any]) -> str:
    prog = job.get("progress") or {}
    done, total = int(prog.get("done") or 0), int(prog.get("total") or 0)
    if job["kind"] == "train" and prog.get("current_step") is not None:
        done, total = int(prog["current_step"]), int(job["spec"].get("steps") or 0)
    frac = done / total if total else 0.0
    filled = round(frac * BAR_WIDTH)
    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
    phase = f" {prog['phase']}" if prog.get("phase") else ""
    reward = (job.get("metrics") or {}).get("reward/mean")
    shown = f" reward {reward:.3f}" if isinstance(reward, (int, float)) else ""
    return f"[{bar}] {done}/{total or '?'} {job['state']}{phase}{shown}"


def trajectory_line(job: dict[str, Any]) -> str:
    """How a rollout job's trajectories ended ("" for jobs without counts): graded ones (a
    reward, 0 included) and aborted ones (infrastructure failures, the failed trajectories)."""
    counts = job.get("trajectories") or {}
    if not counts:
        return ""
    total, graded = int(counts.get("total") or 0), int(counts.get("graded") or 0)
    resolved, aborted = int(counts.get("resolved") or 0), int(counts.get("aborted") or 0)
    return (
        f"trajectories: {total} total, {graded} graded ({resolved} resolved), "
        f"{aborted} failed (aborted by infrastructure)"
    )


def duration(seconds: float) -> str:
    """``7m30s``, ``1h02m``, ``45s``."""
    secs = max(0, int(seconds))
    if secs >= 3600:
        return f"{secs // 3600}h{secs % 3600 // 60:02d}m"
    if secs >= 60:
        return f"{secs // 60}m{secs % 60:02d}s"
    return f"{secs}s"


def progress_line(event: dict[str, Any]) -> str:
    """One trajectory's progress event: which sample of which instance, its phase, turn,
    tokens, elapsed time and the tool running now (or how it ended)."""
    who = f"{event['instance_id']} #{event.get('sample_index', 0)}"
    if int(event.get("attempt") or 1) > 1:
        who += f" (attempt {event['attempt']})"
    parts = [
        who,
        str(event["phase"]),
        f"turn {event.get('turn', 0)}",
        f"{int(event.get('tokens') or 0):,} tokens",
        duration(float(event.get("elapsed_s") or 0.0)),
    ]
    if event.get("status"):
        parts.append(str(event["status"]))
    elif event.get("current_tool"):
        parts.append(f"running {event['current_tool']}")
    return "  ".join(parts)


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    secs = max(0, int(time.time() - ts))
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if secs >= size:
            return f"{secs // size}{unit} ago"
    return f"{secs}s ago"


def table(jobs: list[dict[str, Any]]) -> str:
    if not jobs:
        return "no jobs"
    header = ("JOB", "KIND", "STATE", "PROGRESS", "BY", "SUBMITTED")
    rows = [header]
    for job in jobs:
        prog = job.get("progress") or {}
        done, total = prog.get("done") or 0, prog.get("total") or 0
        rows.append(
            (
                job["id"],
                job["kind"],
                job["state"],
                f"{done}/{total}" if total else "-",
                job["submitted_by"],
                _age(job.get("created_at")),
            )
        )
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def detail(job: dict[str, Any]) -> str:
    lines = [
        f"job        {job['id']}",
        f"kind       {job['kind']}",
        f"state      {job['state']}",
        f"submitted  {_age(job.get('created_at'))} by {job['submitted_by']}",
        f"attempt    {job.get('attempt', 0)}",
        f"progress   {progress_bar(job)}",
    ]
    prog = job.get("progress") or {}
    if prog.get("current_step") is not None:
        lines.append(f"step       {prog['current_step']}")
    if line := trajectory_line(job):
        lines.append(line.replace("trajectories: ", "trajectories ", 1))
    if job.get("metrics"):
        mets = ", ".join(f"{k}={v:.4g}" for k, v in sorted(job["metrics"].items()))
        lines.append(f"metrics    {mets}")
    if job.get("message"):
        lines.append(f"message    {job['message']}")
    return "\n".join(lines)
