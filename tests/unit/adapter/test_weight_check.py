"""The spot check after a weight update (adapter/weight_check.py): an engine's values of a few
tensors against the publisher's, within a bfloat16 rounding."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from adapter.engines.sglang import EngineRequestError, EngineUnavailableError
from adapter.weight_check import (
    LOGPROB_PROBE_FAIL,
    PROBE_RTOL,
    LogprobOutcome,
    LogprobProbe,
    ProbeOutcome,
    WeightProbe,
    check_logprob_probe,
    check_probes,
    logprob_gap,
    probe_mismatch,
)

PROBE = WeightProbe(name="model.norm.weight", values=(1.0, -0.5, 0.25, 2.0))


def test_values_within_a_bfloat16_rounding_agree() -> None:
    bf16 = [1.0 + 2**-8, -0.5, 0.25 - 2**-10, 2.0 * (1 - 2**-8)]
    assert probe_mismatch(PROBE, bf16) is None
    assert probe_mismatch(PROBE, [1, -0.5, 0.25, 2]) is None  # ints from a JSON answer


@pytest.mark.parametrize(
    ("served", "named"),
    [
        ([1.0, -0.5, 0.25, 2.0 * (1 + 3 * PROBE_RTOL)], "model.norm.weight[3] is"),
        ([1.0, -0.5, float("nan"), 2.0], "model.norm.weight[2] is nan"),
        ([1.0, -0.5, 0.25], "for the first 4 values"),
        ([[1.0, -0.5], [0.25, 2.0]], "for the first 4 values"),
        ([True, -0.5, 0.25, 2.0], "for the first 4 values"),
    ],
)
def test_other_or_malformed_values_are_named(served: list, named: str) -> None:
    problem = probe_mismatch(PROBE, served)
    assert problem is not None and named in problem


def test_check_probes_reads_each_back_and_stops_at_the_first_mismatch() -> None:
    asked: list[tuple[str, int]] = []

    class Engine:
        async def get_weights_by_name(self, name: str, size: int) -> list[float]:
            asked.append((name, size))
            return [0.0] * size if name == "b" else list(PROBE.values)[:size]

    probes = (
        WeightProbe(name="a", values=PROBE.values),
        WeightProbe(name="b", values=(1.0,)),
        WeightProbe(name="c", values=(1.0,)),
    )
    outcome = asyncio.run(check_probes(Engine(), probes))
    assert (
        outcome.problem
        == "weights check after loading: b[0] is 0.0 on the engine, the publisher sent 1.0"
    )
    assert outcome.unverifiable is None
    assert asked == [("a", 4), ("b", 1)]
    assert asyncio.run(check_probes(Engine(), ())) == ProbeOutcome(checked=0)


def test_an_engine_that_does_not_read_weights_back_is_unverifiable_not_failed() -> None:
    """SGLang 0.5.23 answers /get_weights_by_name with 400 "Get parameter by name failed" for
    every model class but llama, granite, opt, exaone4 and gemma (Qwen3 among them)."""

    class Qwen3Engine:
        async def get_weights_by_name(self, name: str, size: int) -> list[float]:
            raise EngineRequestError(
                "http://e/get_weights_by_name", "Get parameter by name failed", 400
            )

    outcome = asyncio.run(check_probes(Qwen3Engine(), (PROBE,)))
    assert outcome.problem is None
    assert (
        outcome.unverifiable is not None and "Get parameter by name failed" in outcome.unverifiable
    )


def test_an_unreachable_engine_during_the_check_is_not_called_unverifiable() -> None:
    class Down:
        async def get_weights_by_name(self, name: str, size: int) -> list[float]:
            raise EngineUnavailableError("http://e/get_weights_by_name", "connection refused")

    with pytest.raises(EngineUnavailableError):
        asyncio.run(check_probes(Down(), (PROBE,)))


def test_a_probe_needs_a_name_and_1_to_64_values() -> None:
    bad_probes = [
        {"name": "", "values": [1.0]},
        {"name": "x", "values": []},
        {"name": "x", "values": [0.0] * 65},
        {"name": "x", "values": [1.0], "z": 1},
    ]
    for bad in bad_probes:
        with pytest.raises(ValidationError):
            WeightProbe.model_validate(bad)


LOGPROBS = LogprobProbe(input_ids=(7, 300, 11, 42), logprobs=(-1.0, -8.0, -0.5))


def served(values: list[float | None], ids: tuple[int, ...] = LOGPROBS.input_ids) -> list:
    """SGLang's input_token_logprobs: [logprob, token id, text] per input token."""
    return [[v, t, None] for v, t in zip(values, ids, strict=True)]


def test_a_logprob_probe_is_2_to_64_ids_and_one_finite_logprob_per_later_token() -> None:
    LogprobProbe.model_validate({"input_ids": [0, 1], "logprobs": [0.0]})
    bad_probes = [
        {"input_ids": [3], "logprobs": []},
        {"input_ids": list(range(65)), "logprobs": [-1.0] * 64},
        {"input_ids": [1, 2, 3], "logprobs": [-1.0]},  # one per token after the first
        {"input_ids": [1, 2], "logprobs": [-1.0, -1.0]},
        {"input_ids": [1, -2], "logprobs": [-1.0]},
        {"input_ids": [1, 2], "logprobs": [0.5]},  # a logprob is <= 0
        {"input_ids": [1, 2], "logprobs": [float("-inf")]},
        {"input_ids": [1, 2], "logprobs": [float("nan")]},
        {"input_ids": [1, 2], "logprobs": [-1.0], "temperature": 1.0},
    ]
    for bad in bad_probes:
        with pytest.raises(ValidationError):
            LogprobProbe.model_validate(bad)


def test_the_gap_is_the_mean_absolute_difference_over_the_scored_tokens() -> None:
    assert logprob_gap(LOGPROBS, served([None, -1.0, -8.0, -0.5])) == 0.0
    assert logprob_gap(LOGPROBS, served([None, -1.1, -7.7, -0.5])) == pytest.approx(0.4 / 3)
    malformed = [
        (served([None, -1.0, -8.0], (7, 300, 11)), "answered 3 input-token logprobs for 4"),
        (served([None, -1.0, -8.0, -0.5], (7, 300, 12, 42)), "input token 2"),
        (served([None, -1.0, None, -0.5]), "is not a number"),
        (served([None, -1.0, float("-inf"), -0.5]), "not finite"),
        ([[None, 7], "x", [-8.0, 11], [-0.5, 42]], "input token 1"),
    ]
    for answer, named in malformed:
        problem = logprob_gap(LOGPROBS, answer)
        assert isinstance(problem, str) and named in problem


def test_check_logprob_probe_fails_another_model_and_reports_bf16_drift() -> None:
    class Engine:
        def __init__(self, shift: float) -> None:
            self.shift = shift
            self.asked: list[list[int]] = []

        async def input_logprobs(self, input_ids: list[int]) -> list:
            self.asked.append(input_ids)
            return served([None, *(v - self.shift for v in LOGPROBS.logprobs)])

    drift = Engine(0.05)
    assert asyncio.run(check_logprob_probe(drift, LOGPROBS)) == LogprobOutcome(
        gap=pytest.approx(0.05)
    )
    assert drift.asked == [list(LOGPROBS.input_ids)]
    other = asyncio.run(check_logprob_probe(Engine(LOGPROB_PROBE_FAIL + 0.5), LOGPROBS))
    assert other.gap == pytest.approx(1.5) and other.problem is not None
    assert "1.500 nats" in other.problem


def test_an_engine_that_refuses_to_score_is_unverifiable_an_unreachable_one_raises() -> None:
    class Refuses:
        async def input_logprobs(self, input_ids: list[int]) -> list:
            raise EngineRequestError("http://e/generate", "logprob_start_len too large", 400)

    class Down:
        async def input_logprobs(self, input_ids: list[int]) -> list:
            raise EngineUnavailableError("http://e/generate", "connection refused")

    outcome = asyncio.run(check_logprob_probe(Refuses(), LOGPROBS))
    assert outcome.problem is None and outcome.gap is None
    assert outcome.unverifiable is not None and "too large" in outcome.unverifiable
    with pytest.raises(EngineUnavailableError):
        asyncio.run(check_logprob_probe(Down(), LOGPROBS))
