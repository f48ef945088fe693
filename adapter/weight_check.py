"""The spot check after a weight update: the engine's own values of a few tensors against the
publisher's.

An engine that reports the new ``weight_version`` has not necessarily loaded the right weights
(a broadcast that delivered other bytes, a load from a directory changed underneath). A refresh
may carry ``probes``: for a few one-dimensional tensors (the trainer picks norm weights, which
SGLang holds whole on every tensor-parallel worker) the first values the publisher sent. After
an engine reports the version, the adapter reads the same entries back with SGLang's
``/get_weights_by_name`` and compares them within ``PROBE_RTOL`` / ``PROBE_ATOL``: an engine may
serve in bfloat16 (8 bits of mantissa), so the tolerance is a bfloat16 rounding's, far below
what a wrong or stale tensor differs by. A mismatch fails that engine's load: it leaves rotation
and the readmission reloads the current version (checked the same way) before it serves again.

What it proves: the engine holds, under those names, the values the publisher sent (a stale or
foreign tensor, a load from the wrong directory). What it does not: SGLang answers
``/get_weights_by_name`` for a few model classes only (llama, granite, opt, exaone4, gemma); for
every other model (Qwen3, Qwen3-MoE, ...) it answers 400 and the check is *unverifiable*: the
load then stands on the ``weight_version`` the engine reports, and the engine stays in rotation
(docs/weights.md, "What a refresh verifies").

The logprob probe works on every engine. A refresh may carry ``logprob_probe``: a fixed token
sequence and the trainer's teacher-forced logprobs of its tokens 1..L-1 under the version it
publishes. After an engine reports the version, the adapter asks it for its input-token logprobs
of the same sequence (``/generate`` with ``max_new_tokens`` 0) and takes the mean absolute
difference (``logprob_probe_gap``, always reported). A gap above ``LOGPROB_PROBE_FAIL`` fails
the load like a probe mismatch. What it proves: the engine computes, within that tolerance, what
the trainer's weights compute on the sequence -- every layer takes part -- so a wrong model, a
failed or partial load, corrupted tensors are caught. What it does not: it cannot tell two
consecutive RL versions apart (one update moves these logprobs far less than bfloat16 rounding
does); only the reported version and the probes above do that. An engine that refuses the
request (a 4xx) is *unverifiable* for this check, never failed; a 5xx or an unreachable engine
fails it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from adapter.engines.sglang import EngineRequestError

# Mean |engine - trainer| logprob over the probe's tokens above which the load fails. A bfloat16
# engine against a float32 trainer differs by a few hundredths of a nat on ordinary text and by
# a few tenths at worst on the probe's unlikely tokens; another model, random or corrupted
# weights, a layer left unloaded differ by nats.
LOGPROB_PROBE_FAIL = 1.0
MIN_LOGPROB_PROBE_TOKENS = 2
MAX_LOGPROB_PROBE_TOKENS = 64
PROBE_RTOL = 1e-2  # a bfloat16 rounding is < 2**-8 relative
PROBE_ATOL = 1e-3
MAX_PROBE_VALUES = 64


class WeightProbe(BaseModel):
    """The first values of one one-dimensional tensor, as the publisher sent them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    values: tuple[float, ...] = Field(min_length=1, max_length=MAX_PROBE_VALUES)


def probe_mismatch(probe: WeightProbe, served: list[Any]) -> str | None:
    """Why ``served`` (the engine's answer for ``probe.name``) is not ``probe.values``, or
    None if they agree within the tolerances."""
    if len(served) != len(probe.values) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in served
    ):
        return (
            f"{probe.name}: the engine answered {str(served)[:120]} for the first "
            f"{len(probe.values)} values of a one-dimensional tensor"
        )
    for index, (want, got) in enumerate(zip(probe.values, served, strict=True)):
        if not math.isfinite(got) or abs(got - want) > PROBE_ATOL + PROBE_RTOL * abs(want):
            return f"{probe.name}[{index}] is {got!r} on the engine, the publisher sent {want!r}"
    return None


@dataclass(frozen=True)
class ProbeOutcome:
    """What the spot check found: ``problem`` (a mismatch: the load failed), or the probes
    ``checked``, or ``unverifiable`` (why the engine could not be asked)."""

    problem: str | None = None
    checked: int = 0
    unverifiable: str | None = None


async def check_probes(client: Any, probes: tuple[WeightProbe, ...]) -> ProbeOutcome:
    """Read every probe back from the engine (``client.get_weights_by_name``).

    An engine that refuses the read itself (a 4xx: SGLang 0.5.23 implements
    ``/get_weights_by_name`` for llama, granite, opt, exaone4 and gemma only, and answers 400
    for Qwen3 and the rest) is *unverifiable*, never *failed*: its load stands on the version it
    reports, and it stays in rotation. A value that differs is a failed load."""
    for index, probe in enumerate(probes):
        try:
            served = await client.get_weights_by_name(probe.name, len(probe.values))
        except EngineRequestError as exc:
            return ProbeOutcome(
                checked=index,
                unverifiable=f"the engine does not read weights back by name: {exc.detail}",
            )
        problem = probe_mismatch(probe, served)
        if problem is not None:
            return ProbeOutcome(problem=f"weights check after loading: {problem}", checked=index)
    return ProbeOutcome(checked=len(probes))


class LogprobProbe(BaseModel):
    """A fixed token sequence and the trainer's logprobs of its tokens 1..L-1 (each given the
    tokens before it) under the published version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_ids: tuple[int, ...] = Field(
        min_length=MIN_LOGPROB_PROBE_TOKENS, max_length=MAX_LOGPROB_PROBE_TOKENS
    )
    logprobs: tuple[float, ...] = Field(max_length=MAX_LOGPROB_PROBE_TOKENS - 1)

    @model_validator(mode="after")
    def _consistent(self) -> LogprobProbe:
        if any(isinstance(i, bool) or i < 0 for i in self.input_ids):
            raise ValueError("input_ids must be non-negative token ids")
        if len(self.logprobs) != len(self.input_ids) - 1:
            raise ValueError(
                f"logprobs must have len(input_ids) - 1 = {len(self.input_ids) - 1} entries "
                f"(tokens 1.. given their prefix), got {len(self.logprobs)}"
            )
        if not all(math.isfinite(v) and v <= 0.0 for v in self.logprobs):
            raise ValueError("logprobs must be finite and <= 0")
        return self


def logprob_gap(probe: LogprobProbe, served: list[Any]) -> float | str:
    """The mean absolute difference between the engine's input-token logprobs ``served``
    (SGLang's ``input_token_logprobs``: ``[logprob | None, token_id, text | None]`` per input
    token, the first one's logprob None) and the probe's; a string when ``served`` is not an
    answer for the probe's tokens."""
    if len(served) != len(probe.input_ids):
        return (
            f"the engine answered {len(served)} input-token logprobs for "
            f"{len(probe.input_ids)} tokens"
        )
    total = 0.0
    for position, (entry, token) in enumerate(zip(served, probe.input_ids, strict=True)):
        if not isinstance(entry, (list, tuple)) or len(entry) < 2 or entry[1] != token:
            return f"input token {position}: the engine answered {str(entry)[:80]} for {token}"
        if position == 0:
            continue
        value = entry[0]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"input token {position}: logprob {value!r} is not a number"
        if not math.isfinite(value):
            return f"input token {position}: logprob {value!r} is not finite"
        total += abs(float(value) - probe.logprobs[position - 1])
    return total / len(probe.logprobs)


@dataclass(frozen=True)
class LogprobOutcome:
    """What the logprob probe found: ``problem`` (the load failed), ``gap`` (the mean absolute
    logprob difference, when measured), or ``unverifiable`` (why the engine could not be
    asked)."""

    problem: str | None = None
    gap: float | None = None
    unverifiable: str | None = None


async def check_logprob_probe(client: Any, probe: LogprobProbe) -> LogprobOutcome:
    """Ask the engine for its logprobs of ``probe.input_ids`` (``client.input_logprobs``) and
    compare them with the trainer's. A 4xx is *unverifiable* (never failed); a 5xx or a
    connection error propagates (the caller fails the load, as for any unreachable engine)."""
    try:
        served = await client.input_logprobs(list(probe.input_ids))
    except EngineRequestError as exc:
        return LogprobOutcome(
            unverifiable=f"the engine does not score the logprob probe: {exc.detail}"
        )
    gap = logprob_gap(probe, served)
    if isinstance(gap, str):
        return LogprobOutcome(problem=f"logprob check after loading: {gap}")
    if gap > LOGPROB_PROBE_FAIL:
        return LogprobOutcome(
            problem=(
                f"logprob check after loading: the engine's logprobs of the probe sequence "
                f"differ from the trainer's by {gap:.3f} nats on average (more than "
                f"{LOGPROB_PROBE_FAIL}): it does not compute what the published weights do"
            ),
            gap=gap,
        )
    return LogprobOutcome(gap=gap)
