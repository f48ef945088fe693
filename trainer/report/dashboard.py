"""The dashboard PNG: six panels over the step axis, the Li2SAO switch step as a dashed vertical
line on each (docs/training.md "How to read the dashboard").

1. reward: ``reward/mean`` per step, coloured by phase, and its rolling mean;
2. policy lag: ``lag/mean`` and ``lag/max``;
3. off-policy token ratio: ``lag/off_policy_token_ratio``;
4. train/rollout logprob mismatch: ``mismatch/mean_abs_logprob_diff`` and ``/max_...``;
5. critic: ``critic/explained_variance``, ``readiness/explained_variance``,
   ``readiness/ranking_accuracy`` (the panel says so when the run logged none);
6. step time split: ``time/wait_rollouts``, ``/build``, ``/train``, ``/publish`` stacked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from trainer.report.summary import TIME_PARTS, rolling_mean, switch_step

NO_VALUE = "no value in this run (not logged, or null on every step)"
PHASE_COLOURS = {
    "groups": "tab:blue",
    "bootstrap": "tab:blue",
    "draining": "tab:orange",
    "single": "tab:green",
}


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """Steps and values of ``key``; a step without a value is NaN (a gap in the line), and
    a key no step has gives empty lists."""
    if not any(isinstance(r.get(key), (int, float)) for r in rows):
        return [], []
    xs, ys = [], []
    for row in rows:
        v = row.get(key)
        xs.append(int(row["step"]))
        ys.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan)
    return xs, ys


def _no_value(ax: Axes) -> None:
    ax.text(0.5, 0.5, NO_VALUE, ha="center", va="center", transform=ax.transAxes, color="grey")


def _lines(ax: Axes, rows: Sequence[dict[str, Any]], keys: Sequence[tuple[str, str]]) -> bool:
    drawn = False
    for key, label in keys:
        xs, ys = _series(rows, key)
        if xs:
            ax.plot(xs, ys, marker=".", label=label)
            drawn = True
    if drawn:
        ax.legend(fontsize=7, loc="best")
    else:
        _no_value(ax)
    return drawn


def _reward(
    ax: Axes, rows: Sequence[dict[str, Any]], window: int, evals: Sequence[dict[str, Any]] = ()
) -> None:
    xs, ys = _series(rows, "reward/mean")
    for phase, colour in PHASE_COLOURS.items():
        pts = [(int(r["step"]), float(r["reward/mean"])) for r in rows if r.get("phase") == phase]
        if pts:
            ax.scatter(*zip(*pts, strict=True), s=10, color=colour, label=f"{phase}")
    other = [(int(r["step"]), float(r["reward/mean"])) for r in rows
             if r.get("phase") not in PHASE_COLOURS]  # fmt: skip
    if other:
        ax.scatter(*zip(*other, strict=True), s=10, color="grey", label="other phase")
    ax.plot(xs, rolling_mean(ys, window), color="black", label=f"rolling mean ({window})")
    held_out = _series(evals, "eval/reward_mean")
    if held_out[0]:
        se = _series(evals, "eval/reward_se")[1] or None  # error bars: one standard error
        ax.errorbar(*held_out, yerr=se, color="tab:purple", marker="D", capsize=3,
                    label="held-out eval (+- 1 s.e.)")  # fmt: skip
    shifted = _series(evals, "eval/shifted/reward_mean")
    if shifted[0]:
        ax.plot(*shifted, color="tab:brown", marker="s", linestyle="--",
                label="shifted held-out eval")  # fmt: skip
    ax.legend(fontsize=7, loc="best")


def _time_split(ax: Axes, rows: Sequence[dict[str, Any]]) -> None:
    steps = [int(r["step"]) for r in rows]
    bottom = [0.0] * len(rows)
    drawn = False
    for part in TIME_PARTS:
        key = f"time/{part}"
        if not any(key in r for r in rows):
            continue
        heights = [float(r.get(key) or 0.0) for r in rows]
        ax.bar(steps, heights, bottom=bottom, width=0.9, label=part)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        drawn = True
    if drawn:
        ax.legend(fontsize=7, loc="best")
    else:
        _no_value(ax)


def draw(
    rows: Sequence[dict[str, Any]],
    output: Path,
    *,
    title: str,
    window: int = 10,
    evals: Sequence[dict[str, Any]] = (),
) -> Path:
    """Write the dashboard of ``rows`` (and the held-out ``evals``) to ``output`` (PNG)."""
    fig, axes = plt.subplots(3, 2, figsize=(13, 11), sharex=True)
    (a_reward, a_lag), (a_off, a_mis), (a_critic, a_time) = axes
    _reward(a_reward, rows, window, evals)
    a_reward.set_title("reward per step (mean of the batch)")
    _lines(a_lag, rows, [("lag/mean", "mean"), ("lag/max", "max")])
    a_lag.set_title("policy lag of the trained trajectories (versions)")
    _lines(a_off, rows, [("lag/off_policy_token_ratio", "off-policy token ratio")])
    a_off.set_title("off-policy token ratio (v_l - v_t > 1)")
    a_off.set_ylim(-0.05, 1.05)
    _lines(a_mis, rows, [("mismatch/mean_abs_logprob_diff", "mean |diff|"),
                         ("mismatch/max_abs_logprob_diff", "max |diff|")])  # fmt: skip
    a_mis.set_title("train/rollout logprob mismatch (own-version tokens)")
    _lines(a_critic, rows, [
        ("critic/explained_variance", "critic explained variance"),
        ("readiness/explained_variance", "readiness EV (Eq. 12)"),
        ("readiness/ranking_accuracy", "ranking accuracy (Eq. 13)"),
    ])  # fmt: skip
    a_critic.set_title("critic")
    _time_split(a_time, rows)
    a_time.set_title("step time split (s)")
    switch = switch_step(rows)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        if switch is not None:
            ax.axvline(switch + 0.5, color="red", linestyle="--", linewidth=1)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    note = f"switch after step {switch}" if switch is not None else "no switch"
    fig.suptitle(f"{title} ({note}; red dashed line: the switch)" if switch is not None
                 else f"{title} ({note})")  # fmt: skip
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, format="png", dpi=80)
    plt.close(fig)
    return output
