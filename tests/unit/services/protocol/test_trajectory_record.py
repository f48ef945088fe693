"""Round trips and validation of the trajectory record's binary wire format."""

from __future__ import annotations

import json
import math
import random
import struct

import pytest
from pydantic import ValidationError

from services.protocol import (
    Outcome,
    OutcomeStatus,
    ProtocolError,
    Segment,
    SegmentReason,
    TrajectoryMeta,
    TrajectoryRecord,
    Turn,
)
from services.protocol.packing import float_array, int_array


def random_turn(rng: random.Random, version: int) -> Turn:
    n_obs, n_out = rng.randint(0, 40), rng.randint(1, 60)
    return Turn(
        observation_ids=int_array(rng.randint(0, 150_000) for _ in range(n_obs)),
        output_ids=int_array(rng.randint(0, 150_000) for _ in range(n_out)),
        output_logprobs=float_array(-rng.random() * 20 for _ in range(n_out)),
        weight_version=version,
        finish_reason=rng.choice(["stop", "length"]),
        engine="http://127.0.0.1:1234",
        started_at=1_700_000_000.123456,
        latency_s=0.25,
        prompt_tokens=123,
        cached_tokens=100,
    )


def random_record(seed: int) -> TrajectoryRecord:
    rng = random.Random(seed)
    rec = TrajectoryRecord(meta=TrajectoryMeta(trajectory_id=f"t-{seed}", group_id="g:1"))
    for s in range(rng.randint(1, 3)):
        seg = Segment(
            prompt_ids=int_array(rng.randint(0, 1000) for _ in range(rng.randint(1, 30))),
            reason=SegmentReason.INITIAL if s == 0 else SegmentReason.HISTORY_MISMATCH,
        )
        seg.turns = [random_turn(rng, v) for v in range(rng.randint(1, 5))]
        rec.segments.append(seg)
    return rec


@pytest.mark.parametrize("seed", range(5))
def test_record_round_trips_through_binary_entries(seed: int) -> None:
    rec = random_record(seed)
    back = TrajectoryRecord.from_entries(rec.meta, rec.to_entries())
    assert back.to_json() == rec.to_json()
    assert back.n_turns == rec.n_turns
    assert back.n_tokens == rec.n_tokens


def test_logprobs_survive_as_float32() -> None:
    turn = Turn(output_ids=int_array([1, 2]), output_logprobs=float_array([-0.1234567, -7.5]))
    back = Turn.from_bytes(turn.to_bytes())
    assert back.output_logprobs[1] == -7.5
    assert math.isclose(back.output_logprobs[0], -0.1234567, rel_tol=1e-6)


def test_token_payload_is_compact() -> None:
    """A generated token costs 8 bytes (id + logprob), an observation token 4, plus a header."""
    turn = Turn(
        observation_ids=int_array(range(100)),
        output_ids=int_array(range(1000)),
        output_logprobs=float_array([-1.0] * 1000),
    )
    header = len(turn.to_bytes()) - (100 * 4 + 1000 * 8)
    assert 0 < header < 200


def test_flatten_masks_exactly_the_generated_tokens() -> None:
    seg = Segment(prompt_ids=int_array([9, 9, 9]))
    seg.turns = [
        Turn(output_ids=int_array([1, 2]), output_logprobs=float_array([-0.5, -0.25]),
             weight_version=3),
        Turn(observation_ids=int_array([7, 8, 9]), output_ids=int_array([4]),
             output_logprobs=float_array([-2.0]), weight_version=4),
    ]  # fmt: skip
    flat = seg.flatten()
    assert flat["tokens"] == [1, 2, 7, 8, 9, 4]
    assert flat["action_mask"] == [1, 1, 0, 0, 0, 1]
    assert flat["logprobs"] == [-0.5, -0.25, 0.0, 0.0, 0.0, -2.0]
    assert flat["versions"] == [3, 3, -1, -1, -1, 4]
    assert seg.token_ids() == [9, 9, 9, 1, 2, 7, 8, 9, 4]


def test_turn_rejects_mismatched_logprobs() -> None:
    with pytest.raises(ProtocolError, match="2 output ids but 1 logprobs"):
        Turn(output_ids=int_array([1, 2]), output_logprobs=float_array([-1.0]))


@pytest.mark.parametrize(
    "mangle",
    [
        lambda b: b"XXXX" + b[4:],  # bad magic
        lambda b: b[:-4],  # truncated payload
        lambda b: b + b"\0\0\0\0",  # trailing bytes
        lambda b: b[:4] + struct.pack("<I", 3) + b"{x}",  # bad header JSON
    ],
)
def test_corrupt_turn_bytes_raise_protocol_error(mangle) -> None:
    turn = Turn(output_ids=int_array([1, 2]), output_logprobs=float_array([-1.0, -2.0]))
    with pytest.raises(ProtocolError):
        Turn.from_bytes(mangle(turn.to_bytes()))


def test_turn_before_segment_is_rejected() -> None:
    turn = Turn(output_ids=int_array([1]), output_logprobs=float_array([-1.0]))
    with pytest.raises(ProtocolError, match="before any segment"):
        TrajectoryRecord.from_entries(TrajectoryMeta(trajectory_id="x"), [turn.to_bytes()])


def test_aborted_outcome_never_carries_a_reward() -> None:
    with pytest.raises(ValidationError, match="never a 0"):
        Outcome(status=OutcomeStatus.ABORTED, reward=0.0, abort_reason="sandbox failed")
    with pytest.raises(ValidationError, match="abort_reason"):
        Outcome(status=OutcomeStatus.ABORTED)
    with pytest.raises(ValidationError, match="needs a reward"):
        Outcome(status=OutcomeStatus.COMPLETED)
    ok = Outcome(status=OutcomeStatus.ABORTED, abort_reason="image missing")
    assert not ok.trainable
    assert Outcome(status=OutcomeStatus.TIMEOUT, reward=0.0).trainable


def test_outcome_round_trips_as_json() -> None:
    out = Outcome(status=OutcomeStatus.COMPLETED, reward=1.0, patch="diff --git a b", n_turns=3)
    assert Outcome.model_validate_json(out.model_dump_json()) == out


@pytest.mark.parametrize("bad", ["", "has space", "a/b", "x" * 201])
def test_trajectory_ids_are_validated(bad: str) -> None:
    with pytest.raises(ValidationError):
        TrajectoryMeta(trajectory_id=bad)


def switched_turn(runs: list[tuple[int, int]], n_out: int = 6, version: int = 3) -> Turn:
    return Turn(
        output_ids=int_array(range(n_out)),
        output_logprobs=float_array([-1.0] * n_out),
        weight_version=version,
        version_runs=runs,
    )


def test_version_runs_round_trip_and_flatten_per_token() -> None:
    """A turn a token-mode refresh interrupted: versions switch exactly at the run start."""
    turn = switched_turn([(0, 3), (4, 4)])
    back = Turn.from_bytes(turn.to_bytes())
    assert back.version_runs == [(0, 3), (4, 4)]
    assert back.token_versions() == [3, 3, 3, 3, 4, 4]
    assert back.to_json()["version_runs"] == [[0, 3], [4, 4]]
    seg = Segment(prompt_ids=int_array([9]))
    seg.turns = [Turn(observation_ids=int_array([7]), output_ids=int_array([5]),
                      output_logprobs=float_array([-0.5]), weight_version=3), back]  # fmt: skip
    assert seg.flatten()["versions"] == [-1, 3, 3, 3, 3, 3, 4, 4]


def test_a_turn_without_runs_is_one_run_and_old_records_load() -> None:
    """Records written before version runs existed carry no ``vr``: one version per turn."""
    turn = Turn(output_ids=int_array([1, 2]), output_logprobs=float_array([-1.0, -2.0]),
                weight_version=5)  # fmt: skip
    raw = turn.to_bytes()
    assert b'"vr"' not in raw  # the header of a one-version turn is what it always was
    back = Turn.from_bytes(raw)
    assert back.version_runs == [] and back.token_versions() == [5, 5]
    # A single run equal to the turn's version is normalised away.
    assert switched_turn([(0, 3)]).version_runs == []


@pytest.mark.parametrize(
    ("runs", "needle"),
    [
        ([(1, 3), (4, 4)], "start with"),
        ([(0, 2), (4, 4)], "start with"),
        ([(0, 3), (6, 4)], "not increasing"),
        ([(0, 3), (4, 4), (4, 5)], "not increasing"),
        ([(0, 3), (2, 3)], "same version"),
        ([(0, 4)], "single version run"),
    ],
)
def test_bad_version_runs_are_refused(runs: list[tuple[int, int]], needle: str) -> None:
    with pytest.raises(ProtocolError, match=needle):
        switched_turn(runs)


def _with_header(turn: Turn, **changes: object) -> bytes:
    """``turn``'s bytes with header fields changed (the payload untouched)."""
    head = {**turn.header(), **changes}
    raw = turn.to_bytes()
    (hlen,) = struct.unpack_from("<I", raw, 4)
    new = json.dumps(head).encode()
    return raw[:4] + struct.pack("<I", len(new)) + new + raw[8 + hlen :]


def test_the_scripted_flag_round_trips_and_only_a_boolean_is_accepted() -> None:
    plain = Turn(output_ids=int_array([1]), output_logprobs=float_array([-1.0]))
    assert b'"sc"' not in plain.to_bytes() and not Turn.from_bytes(plain.to_bytes()).scripted
    replayed = Turn(output_ids=int_array([1]), output_logprobs=float_array([-1.0]),
                    scripted=True)  # fmt: skip
    back = Turn.from_bytes(replayed.to_bytes())
    assert back.scripted and back.to_json()["scripted"] is True
    with pytest.raises(ProtocolError, match="sc must be a boolean"):
        Turn.from_bytes(_with_header(plain, sc=1))


def test_text_turns_round_trip_and_make_a_text_only_record() -> None:
    from services.protocol import TextTurn

    turns = [
        TextTurn(messages=[{"role": "user", "content": "fix the bug ✓"}],
                 response={"role": "assistant", "content": None, "tool_calls": []},
                 finish_reason="tool_calls", model="gpt-x", engine="http://u/v1",
                 started_at=1.5, latency_s=0.25, usage={"prompt_tokens": 9}),
        TextTurn(messages=[], response={"role": "assistant", "content": "done"},
                 history_reset=True),
    ]  # fmt: skip
    record = TrajectoryRecord(meta=TrajectoryMeta(trajectory_id="t"), text_turns=turns)
    back = TrajectoryRecord.from_entries(record.meta, record.to_entries())
    assert back.text_turns == turns and back.text_only and back.n_turns == 2
    assert back.to_json()["text_turns"][1]["history_reset"] is True
    token_record = TrajectoryRecord(meta=TrajectoryMeta(trajectory_id="u"))
    assert not token_record.text_only and "text_turns" not in token_record.to_json()
    for bad in (b"SWX1not json", b'SWX1{"messages": "x", "response": {}}',
                b'SWX1{"messages": [1], "response": {}}', b'SWX1{"response": {}}'):  # fmt: skip
        with pytest.raises(ProtocolError, match="bad text turn"):
            TrajectoryRecord.from_entries(record.meta, [bad])
