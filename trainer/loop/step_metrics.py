"""The metrics of one loop step, from what the step saw (pure functions, no I/O).

Names (docs/training.md "Metrics"): ``reward/*`` (mean, and ``reward/mean_<phase>``),
``response/*`` (generated tokens and turns per trajectory), ``lag/*`` (mean and max policy lag
of the trained trajectories, the off-policy token ratio of LI2SAO_SPEC "Staleness"),
``rollouts/*`` (cumulative counts: submitted, landed, trained, aborted, missing_record,
over_lag, future_version, discarded, cancelled_tasks, ...), ``loop/*`` (phase index, group size,
trajectories), ``gate/*`` (the readiness gate's EMAs, counter, switch), ``time/*`` (seconds
waiting for rollouts, building, training, publishing), plus every metric the backend returned
(actor/critic losses, clip fraction, DIS masks, ``mismatch/*`` train-rollout logprob gap,
``readiness/*``), ``publish/*`` timings (``publish/gate_closed``: the refresh pause), and
``engine/<host:port>/*`` (what each engine generated for the step's trajectories).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import Any
from urllib.parse import urlsplit

from services.protocol import TrajectoryRecord
from trainer.algorithms import ReadinessGate, off_policy_token_ratio
from trainer.data import TrainBatch
from trainer.loop.pool import Selection

PHASE_INDEX = {"groups": 0, "bootstrap": 0, "draining": 1, "single": 2}


def rollout_metrics(selection: Selection, batch: TrainBatch, version: int) -> dict[str, float]:
    """Reward, response length and lag of the batch's trajectories."""
    members = selection.members
    rewards = [float(m.result.outcome.reward or 0.0) for m in members]
    lengths = [m.record.n_generated_tokens for m in members]
    turns = [m.record.n_turns for m in members]
    return {
        "reward/mean": fmean(rewards),
        "response/tokens_mean": fmean(lengths),
        "response/tokens_max": float(max(lengths)),
        "response/turns_mean": fmean(turns),
        "lag/mean": fmean(selection.lags),
        "lag/max": float(max(selection.lags)),
        "lag/off_policy_token_ratio": float(
            off_policy_token_ratio(version, batch.token_versions, batch.action_mask)
        ),  # LI2SAO_SPEC "Staleness": v_l - v_t > 1 on action tokens
        "loop/trajectories": float(len(members)),
        "loop/group_size": float(max(selection.group_sizes)),
        "loop/groups": float(len(selection.group_sizes)),
    }


def engine_name(url: str) -> str:
    """``host:port`` of an engine URL (the metric names' engine part); the URL itself if it
    has no host."""
    parts = urlsplit(url)
    return parts.netloc or url or "unknown"


def engine_metrics(records: Iterable[TrajectoryRecord]) -> dict[str, float]:
    """Per engine, over the turns of ``records``: ``engine/<name>/tokens`` generated,
    ``/turns``, and ``/tokens_per_s``: those tokens over the wall-clock span of those turns
    (first start to last end), a lower bound of the engine's throughput (other trajectories
    it served meanwhile are not counted)."""
    tokens: dict[str, int] = {}
    turns: dict[str, int] = {}
    span: dict[str, tuple[float, float]] = {}
    for record in records:
        for segment in record.segments:
            for turn in segment.turns:
                name = engine_name(turn.engine)
                tokens[name] = tokens.get(name, 0) + len(turn.output_ids)
                turns[name] = turns.get(name, 0) + 1
                start, end = turn.started_at, turn.started_at + turn.latency_s
                lo, hi = span.get(name, (start, end))
                span[name] = (min(lo, start), max(hi, end))
    out: dict[str, float] = {}
    for name in sorted(tokens):
        lo, hi = span[name]
        out[f"engine/{name}/tokens"] = float(tokens[name])
        out[f"engine/{name}/turns"] = float(turns[name])
        out[f"engine/{name}/tokens_per_s"] = tokens[name] / (hi - lo) if hi > lo else float("nan")
    return out


def gate_metrics(gate: ReadinessGate | None) -> dict[str, float]:
    if gate is None:
        return {}
    out = {"gate/counter": float(gate.counter), "gate/switched": float(gate.switched)}
    if gate.e_bar is not None:
        out["gate/e_bar"] = gate.e_bar
    if gate.a_bar is not None:
        out["gate/a_bar"] = gate.a_bar
    if gate.switch_step is not None:
        out["gate/switch_step"] = float(gate.switch_step)
    return out


def step_record(
    *,
    phase: str,
    rollouts: Mapping[str, float],
    backend: Mapping[str, float],
    counts: Mapping[str, int],
    timings: Mapping[str, float],
    gate: ReadinessGate | None,
    publish: Mapping[str, float] | None,
) -> dict[str, Any]:
    """One JSON line: the step's phase (as text and index) and every metric group."""
    row: dict[str, Any] = {"phase": phase, "loop/phase": float(PHASE_INDEX[phase])}
    row.update(rollouts)
    row[f"reward/mean_{phase}"] = rollouts["reward/mean"]
    row.update(backend)
    row.update({f"rollouts/{k}": float(v) for k, v in sorted(counts.items())})
    row.update({f"time/{k}": float(v) for k, v in timings.items()})
    row.update(gate_metrics(gate))
    if publish:
        row.update({f"publish/{k}": float(v) for k, v in publish.items()})
    return row
