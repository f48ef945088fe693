"""The toy task's pure rules: instance ids, prompt and observation shape, code draw, reward."""

from __future__ import annotations

import collections

import pytest

from services.protocol.toy import (
    CODE_REPEATS,
    CODES,
    LOOKUP_TOOL,
    SYSTEM_PROMPT,
    ToyTaskError,
    draw_code,
    instance_number,
    is_held_out,
    observation,
    prompt_messages,
    reward_for_answer,
    toy_instance_ids,
    toy_prompt_ids,
)


@pytest.mark.parametrize(("instance_id", "n"), [("toy-lookup-0", 0), ("toy-lookup-17", 17),
                                                ("toy-lookup-999999999", 999_999_999)])  # fmt: skip
def test_toy_instance_ids_carry_their_number(instance_id: str, n: int) -> None:
    assert instance_number(instance_id) == n


@pytest.mark.parametrize(
    "bad",
    ["toy-lookup-", "toy-lookup-01", "toy-lookup--1", "toy-lookup-x", "toy-lookup-1 ",
     "toy-lookup-1000000000", "swerl__spanlib-1", "TOY-LOOKUP-1", ""],
)  # fmt: skip
def test_anything_else_is_refused_with_the_expected_form(bad: str) -> None:
    with pytest.raises(ToyTaskError, match=r"is not a toy instance id: expected toy-lookup-<n>"):
        instance_number(bad)


def test_toy_instance_ids_are_consecutive_and_bounded() -> None:
    assert toy_instance_ids(3, start=5) == ["toy-lookup-5", "toy-lookup-6", "toy-lookup-7"]
    for bad in ((0, 0), (1, -1), (2, 10**9 - 1)):
        with pytest.raises(ToyTaskError):
            toy_instance_ids(*bad)


def test_the_prompt_asks_for_the_lookup_tool_and_names_the_request() -> None:
    system, user = prompt_messages("toy-lookup-12")
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert "lookup tool" in system["content"] and "secret code" in system["content"]
    assert user["role"] == "user" and "Request 12" in user["content"]
    assert prompt_messages("toy-lookup-13")[1] != user  # another id, another prompt
    assert LOOKUP_TOOL["function"]["name"] == "lookup"
    assert LOOKUP_TOOL["function"]["parameters"] == {"type": "object", "properties": {}}


def test_the_observation_repeats_the_code_on_eight_lines() -> None:
    assert CODE_REPEATS == 32 and len(set(CODES)) == 4
    for code in CODES:
        lines = observation(code).split("\n")
        assert lines == [code] * 32
    with pytest.raises(ToyTaskError, match="unknown code 'blue'"):
        observation("blue")


def test_the_code_is_reproducible_per_task_and_attempt_and_uniform() -> None:
    assert draw_code("b1:0:3", 1) == draw_code("b1:0:3", 1)
    tasks = [f"batch-{b}:{p}:{s}" for b in range(10) for p in range(25) for s in range(16)]
    counts = collections.Counter(draw_code(t, 1) for t in tasks)
    assert set(counts) == set(CODES)
    for code in CODES:  # 4000 draws: each share within 0.25 +- 0.03 (> 4 standard deviations)
        assert abs(counts[code] / len(tasks) - 0.25) < 0.03, counts
    # A retried attempt is a fresh draw: over many tasks, attempt 2 often differs from attempt 1.
    changed = sum(draw_code(t, 1) != draw_code(t, 2) for t in tasks[:400]) / 400
    assert 0.6 < changed < 0.9  # 0.75 expected for independent draws
    with pytest.raises(ToyTaskError, match="attempt must be >= 1"):
        draw_code("t", 0)


@pytest.mark.parametrize(
    ("answer", "reward"),
    [("cat", 1.0), (" cat\n", 1.0), ("red", 0.0), ("Cat", 0.0), ("cat cat", 0.0),
     ("The code is cat", 0.0), ("", 0.0), (None, 0.0), ("red cat key pear", 0.0)],
)  # fmt: skip
def test_the_answer_must_be_exactly_the_code(answer: str | None, reward: float) -> None:
    assert reward_for_answer(answer, "cat") == reward


def test_grading_against_an_unknown_code_is_an_error() -> None:
    with pytest.raises(ToyTaskError, match="unknown code"):
        reward_for_answer("x", "x")


def test_the_held_out_split_is_an_eighth_without_a_digit_pattern() -> None:
    held = [n for n in range(8000) if is_held_out(n)]
    assert 800 < len(held) < 1200  # one in HELD_OUT_EVERY = 8, by hash
    # every last digit occurs among the held-out numbers (n % 8 or n % 10 would not do that)
    assert {n % 10 for n in held} == set(range(10)) and {n % 8 for n in held} == set(range(8))
    assert is_held_out(4) and not is_held_out(0)  # fixed: a split never moves between runs


def test_toy_prompt_ids_split_a_range_into_disjoint_parts() -> None:
    train, held = toy_prompt_ids(0, 1000, "train"), toy_prompt_ids(0, 1000, "held_out")
    assert not set(train) & set(held)
    assert sorted(train + held, key=instance_number) == toy_prompt_ids(0, 1000)
    assert toy_prompt_ids(1000, 1003) == ["toy-lookup-1000", "toy-lookup-1001", "toy-lookup-1002"]
    for bad in [(5, 5), (-1, 3), (0, 10**9 + 1)]:
        with pytest.raises(ToyTaskError, match="start < stop"):
            toy_prompt_ids(*bad)
    with pytest.raises(ToyTaskError, match="part must be"):
        toy_prompt_ids(0, 3, "test")  # type: ignore[arg-type]
