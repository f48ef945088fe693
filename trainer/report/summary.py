"""The run's summary numbers from its metrics rows (pure functions, no I/O).

* reward: the mean of ``reward/mean`` over the first and the last ``edge`` steps (5);
* the switch step: ``gate/switch_step`` of the last row that has it (the gate switched after
  that step), or None;
* policy lag: the mean of ``lag/mean`` (and the largest ``lag/max``) over the steps up to and
  including the switch step, and over the steps after it (the first of which trains the
  prefetched bootstrap batch); without a switch, over the whole run;
* step time: the mean of ``time/step`` and of each part of it (``time/wait_rollouts``,
  ``/build``, ``/train``, ``/publish``), and the steps per minute it makes;
* the held-out evaluations (``eval.jsonl`` rows, ``train.eval_interval``): step, reward mean
  and pass@n of each.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean
from typing import Any, NamedTuple

TIME_PARTS = ("wait_rollouts", "build", "train", "publish")


def values(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    """The finite values of ``key`` (rows without it, or with null, are skipped)."""
    out = []
    for row in rows:
        v = row.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out.append(float(v))
    return out


def mean_of(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = values(rows, key)
    return fmean(vals) if vals else None


def max_of(rows: Sequence[dict[str, Any]], key: str) -> float | None:
    vals = values(rows, key)
    return max(vals) if vals else None


def switch_step(rows: Sequence[dict[str, Any]]) -> int | None:
    found = values(rows, "gate/switch_step")
    return int(found[-1]) if found else None


def rolling_mean(xs: Sequence[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start)."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    out, total = [], 0.0
    for i, x in enumerate(xs):
        total += x
        if i >= window:
            total -= xs[i - window]
        out.append(total / min(i + 1, window))
    return out


@dataclass(frozen=True)
class LagStats:
    mean: float | None
    max: float | None
    steps: int


def lag_stats(rows: Sequence[dict[str, Any]]) -> LagStats:
    return LagStats(mean_of(rows, "lag/mean"), max_of(rows, "lag/max"), len(rows))


@dataclass(frozen=True)
class Summary:
    steps: int
    first_step: int
    last_step: int
    edge: int
    reward_first: float
    reward_last: float
    switch_step: int | None
    lag_before: LagStats  # the whole run when there is no switch
    lag_after: LagStats | None
    step_time_mean: float | None
    time_parts: dict[str, float] = field(default_factory=dict)
    phases: dict[str, int] = field(default_factory=dict)
    # one per held-out evaluation (eval.jsonl)
    evals: list[EvalPoint] = field(default_factory=list)


class EvalPoint(NamedTuple):
    """One held-out evaluation: its step, ``eval/reward_mean``, ``eval/pass_at_n``,
    ``eval/reward_se`` and the shifted set's ``eval/shifted/reward_mean`` (None: no score)."""

    step: int
    reward: float | None
    pass_at_n: float | None
    se: float | None = None
    shifted: float | None = None


def _finite(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def summarize(
    rows: Sequence[dict[str, Any]], edge: int = 5, evals: Sequence[dict[str, Any]] = ()
) -> Summary:
    if not rows:
        raise ValueError("no metrics rows")
    if edge < 1:
        raise ValueError(f"edge must be >= 1, got {edge}")
    switch = switch_step(rows)
    if switch is None:
        before, after = list(rows), None
    else:
        before = [r for r in rows if r["step"] <= switch]
        after = [r for r in rows if r["step"] > switch]
    parts = {p: m for p in TIME_PARTS if (m := mean_of(rows, f"time/{p}")) is not None}
    return Summary(
        steps=len(rows),
        first_step=int(rows[0]["step"]),
        last_step=int(rows[-1]["step"]),
        edge=edge,
        reward_first=fmean(values(rows[:edge], "reward/mean")),
        reward_last=fmean(values(rows[-edge:], "reward/mean")),
        switch_step=switch,
        lag_before=lag_stats(before),
        lag_after=None if after is None else lag_stats(after),
        step_time_mean=mean_of(rows, "time/step"),
        time_parts=parts,
        phases=dict(Counter(str(r.get("phase", "?")) for r in rows)),
        evals=[
            EvalPoint(
                int(e["step"]),
                _finite(e.get("eval/reward_mean")),
                _finite(e.get("eval/pass_at_n")),
                _finite(e.get("eval/reward_se")),
                _finite(e.get("eval/shifted/reward_mean")),
            )
            for e in evals
            if isinstance(e.get("step"), int)
        ],
    )


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "n/a" if x is None else format(x, fmt)


def _lag(stats: LagStats) -> str:
    return f"mean {_num(stats.mean, '.2f')}, max {_num(stats.max, '.0f')} ({stats.steps} steps)"


def render_text(s: Summary, source: str = "") -> str:
    """The summary as the lines ``python -m trainer report`` prints and writes."""
    phases = ", ".join(f"{k} {v}" for k, v in s.phases.items())
    lines = [f"run report{f' ({source})' if source else ''}"]
    lines.append(f"steps: {s.steps} (steps {s.first_step}-{s.last_step}; phases: {phases})")
    lines.append(
        f"reward: first {s.edge} steps {s.reward_first:.3f}, last {s.edge} steps "
        f"{s.reward_last:.3f}"
    )
    if s.switch_step is None:
        lines.append("switch: no switch")
        lines.append(f"policy lag: {_lag(s.lag_before)}")
    else:
        lines.append(f"switch: after step {s.switch_step}")
        k = s.switch_step
        assert s.lag_after is not None
        lines.append(f"policy lag before the switch (steps <= {k}): {_lag(s.lag_before)}")
        lines.append(f"policy lag after the switch (steps > {k}): {_lag(s.lag_after)}")
    parts = ", ".join(f"{k} {v:.3f}" for k, v in s.time_parts.items())
    rate = f"; {60.0 / s.step_time_mean:.1f} steps/minute" if s.step_time_mean else ""
    lines.append(f"step time: mean {_num(s.step_time_mean)} s ({parts or 'no split'}){rate}")
    if s.evals:
        scores = ", ".join(
            f"step {e.step} {_num(e.reward)}"
            + (f" +- {_num(e.se)}" if e.se is not None else "")
            + f" (pass@n {_num(e.pass_at_n)})"
            + (f" shifted {_num(e.shifted)}" if e.shifted is not None else "")
            for e in s.evals
        )
        lines.append(f"held-out eval (reward mean): {scores}")
    return "\n".join(lines) + "\n"
