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
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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


async def check_probes(client: Any, probes: tuple[WeightProbe, ...]) -> str | None:
    """Read every probe back from the engine (``client.get_weights_by_name``); the first
    mismatch, or None."""
    for probe in probes:
        served = await client.get_weights_by_name(probe.name, len(probe.values))
        problem = probe_mismatch(probe, served)
        if problem is not None:
            return f"weights check after loading: {problem}"
    return None
