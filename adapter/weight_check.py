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
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from adapter.engines.sglang import EngineRequestError

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
