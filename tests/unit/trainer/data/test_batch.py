"""Records -> padded batch: one row per segment, masks on generated tokens only, drops counted."""

from __future__ import annotations

import math

import pytest
import torch

from services.protocol import OutcomeStatus, Turn
from tests.support.trajectory_records import record, turn
from trainer.config import BatchConfig
from trainer.data import BatchError, RecordError, build_batch


def two_segment_record():
    # segment 0: prompt [5, 6], turn (obs [], out [7, 8]), turn (obs [9], out [10]);
    # segment 1 (history rewritten): prompt [5, 11, 12], turn (obs [], out [13, 14, 15])
    return record(
        "t-a",
        [
            ([5, 6], [turn([], [7, 8], 2), turn([9], [10], 3)]),
            ([5, 11, 12], [turn([], [13, 14, 15], 3)]),
        ],
        reward=1.0,
    )


def test_segments_become_rows_and_masks_cover_exactly_the_generated_tokens() -> None:
    other = record("t-b", [([5, 6, 20], [turn([], [21], 3)])], reward=0.0)
    batch, report = build_batch([two_segment_record(), other], trainer_version=3, pad_id=0)
    assert batch.num_rows == 3 and batch.num_trajectories == 2
    assert batch.trajectory_ids == ("t-a", "t-b")
    assert batch.trajectory_index.tolist() == [0, 0, 1]
    assert batch.segment_index.tolist() == [0, 1, 0]
    assert batch.group_ids.tolist() == [0, 0, 0]
    assert batch.rewards.tolist() == [1.0, 1.0, 0.0]  # a trajectory's segments share its reward
    # full sequences: prompt + post-prompt, right-padded with pad_id
    assert batch.input_ids.tolist() == [
        [5, 6, 7, 8, 9, 10],
        [5, 11, 12, 13, 14, 15],
        [5, 6, 20, 21, 0, 0],
    ]
    assert batch.prompt_lengths.tolist() == [2, 3, 3]
    assert batch.seq_lengths.tolist() == [6, 6, 4]
    assert batch.attention_mask.tolist() == [[True] * 6, [True] * 6, [True] * 4 + [False] * 2]
    # post-prompt view of trainer.algorithms
    assert batch.tokens.tolist() == [[7, 8, 9, 10], [13, 14, 15, -1], [21, -1, -1, -1]]
    assert batch.action_mask.tolist() == [
        [True, True, False, True],
        [True, True, True, False],
        [True, False, False, False],
    ]
    assert batch.token_versions.tolist() == [[2, 2, -1, 3], [3, 3, 3, -1], [3, -1, -1, -1]]
    # behaviour logprobs line up with their tokens (turn(): -0.1 * (i + 1) - 0.01 * version)
    expected = [[-0.12, -0.22, 0.0, -0.13], [-0.13, -0.23, -0.33, 0.0], [-0.13, 0.0, 0.0, 0.0]]
    assert torch.allclose(batch.behavior_logp, torch.tensor(expected), atol=1e-6)
    assert report.rows == 3 and report.trajectories == 2 and report.aborted == 0
    assert math.isclose(report.mean_lag, 0.5)  # t-a's oldest token is version 2


def test_aborted_trajectories_never_enter_and_are_counted() -> None:
    aborted = record("t-x", [([1, 2], [turn([], [3, 4], 0)])], status=OutcomeStatus.ABORTED)
    kept = record("t-y", [([1, 2], [turn([], [3], 0)])], reward=0.0)
    batch, report = build_batch([aborted, kept], trainer_version=0)
    assert batch.trajectory_ids == ("t-y",)
    assert (report.aborted, report.trajectories_in, report.trajectories) == (1, 2, 1)
    with pytest.raises(BatchError, match="1 aborted"):
        build_batch([aborted], trainer_version=0)


def test_policy_lag_filter_drops_whole_trajectories_by_their_oldest_token() -> None:
    # t-old's second segment is fresh but its first holds a version-1 token: lag 6 > 4
    old = record("t-old", [([1], [turn([], [2], 1)]), ([1, 3], [turn([], [4], 7)])])
    fresh = record("t-new", [([1], [turn([], [2], 3)])], reward=0.0)
    batch, report = build_batch([old, fresh], trainer_version=7, config=BatchConfig())
    assert batch.trajectory_ids == ("t-new",) and batch.num_rows == 1
    assert report.over_lag == 1 and report.mean_lag == 4.0
    batch, report = build_batch([old, fresh], 7, BatchConfig(max_policy_lag=6))
    assert batch.num_rows == 3 and report.over_lag == 0


def test_a_turn_switched_mid_generation_carries_both_versions_and_lags_by_the_old() -> None:
    """A token-mode refresh interrupted the turn after 2 tokens: versions 4 then 5 per token;
    the trajectory's lag is that of the tokens before the switch."""
    switched = turn([3], [7, 8, 9, 10], 4)
    switched.version_runs = [(0, 4), (2, 5)]
    rec = record("t-s", [([1], [turn([], [2], 5), turn([3], [7, 8, 9, 10], 4)])])
    rec.segments[0].turns[1] = switched
    batch, report = build_batch([rec], trainer_version=6, pad_id=0)
    assert batch.token_versions.tolist() == [[5, -1, 4, 4, 5, 5]]
    assert report.mean_lag == 2.0  # 6 - 4: the pre-switch tokens decide
    with pytest.raises(BatchError, match="lags more than max_policy_lag=1"):
        build_batch([rec], 6, BatchConfig(max_policy_lag=1))  # most of its tokens lag only 1


def test_a_token_from_a_future_policy_is_an_error() -> None:
    rec = record("t-f", [([1], [turn([], [2], 5)])])
    with pytest.raises(BatchError, match="future policy"):
        build_batch([rec], trainer_version=4)


def test_truncated_trajectories_are_flagged() -> None:
    timeout = record("t-1", [([1], [turn([], [2], 0)])], status=OutcomeStatus.TIMEOUT, reward=0.0)
    length = record("t-2", [([1], [turn([], [2, 3], 0, finish="length")])], reward=0.0)
    done = record("t-3", [([1], [turn([], [2], 0)])])
    batch, report = build_batch([timeout, length, done], trainer_version=0)
    assert batch.truncated.tolist() == [True, True, False] and report.truncated == 2


def test_overlong_segments_are_dropped_or_rejected() -> None:
    long = record("t-l", [([1] * 8, [turn([], [2, 3], 0)]), ([1], [turn([], [2], 0)])])
    batch, report = build_batch([long], 0, BatchConfig(max_seq_len=9))
    assert batch.num_rows == 1 and batch.segment_index.tolist() == [1]
    assert report.overlong_rows == 1
    with pytest.raises(RecordError, match="t-l segment 0: 10 tokens exceed max_seq_len=9"):
        build_batch([long], 0, BatchConfig(max_seq_len=9, overlong="error"))


def test_segments_without_generated_tokens_give_no_row() -> None:
    rec = record("t-e", [([1, 2], [turn([3], [], 0)]), ([1], [turn([], [4], 0)])])
    batch, report = build_batch([rec], 0)
    assert batch.segment_index.tolist() == [1] and report.empty_rows == 1


def test_bad_records_are_rejected_with_a_clear_error() -> None:
    unfinished = record("t-u", [([1], [turn([], [2], 0)])])
    unfinished.outcome = None
    with pytest.raises(RecordError, match="t-u: no outcome"):
        build_batch([unfinished], 0)
    mismatched = record("t-m", [([1], [turn([], [2, 3], 0)])])
    mismatched.segments[0].turns[0].output_logprobs.append(-0.5)
    with pytest.raises(RecordError, match="t-m segment 0 turn 0: 2 output ids but 3 logprobs"):
        build_batch([mismatched], 0)
    nan = record("t-n", [([1], [turn([], [2], 0)])])
    nan.segments[0].turns[0].output_logprobs[0] = float("nan")
    with pytest.raises(RecordError, match="t-n segment 0 turn 0: logprob nan"):
        build_batch([nan], 0)
    positive = record("t-p", [([1], [turn([], [2], 0)])])
    positive.segments[0].turns[0].output_logprobs[0] = 0.5
    with pytest.raises(RecordError, match=r"logprob 0\.5 is not finite and <= 0"):
        build_batch([positive], 0)
    vocab = record("t-v", [([1], [turn([], [2, 99], 0)])])
    with pytest.raises(RecordError, match=r"token id 99 outside the vocabulary \[0, 50\)"):
        build_batch([vocab], 0, vocab_size=50)
    empty_prompt = record("t-0", [([], [turn([], [2], 0)])])
    with pytest.raises(RecordError, match="t-0 segment 0: empty prompt"):
        build_batch([empty_prompt], 0)
    twice = record("t-2", [([1], [turn([], [2], 0)])])
    with pytest.raises(BatchError, match="t-2 appears twice"):
        build_batch([twice, twice], 0)


def test_select_trims_to_the_rows_own_widths() -> None:
    short = record("t-s", [([1], [turn([], [2], 0)])], group="g1")
    batch, _ = build_batch([two_segment_record(), short], trainer_version=3)
    part = batch.select([2])
    assert part.input_ids.tolist() == [[1, 2]] and part.tokens.tolist() == [[2]]
    assert part.action_mask.tolist() == [[True]] and part.group_ids.tolist() == [1]


def scripted(obs: list[int], out: list[int], version: int = 0) -> Turn:
    t = turn(obs, out, version)
    t.scripted = True
    return t


def test_scripted_turns_are_context_and_a_replayed_trajectory_gives_no_row() -> None:
    # A trajectory the scripted engine replayed (reward 1) beside a sampled one (reward 0);
    # a third mixes a scripted first turn with a sampled second one.
    replayed = record("t-s", [([1, 2], [scripted([], [3, 4]), scripted([5], [6])])], reward=1.0)
    sampled = record("t-p", [([1, 2], [turn([], [7], 0), turn([5], [8, 9], 0)])], reward=0.0)
    mixed = record("t-m", [([1, 2], [scripted([], [3, 4]), turn([5], [10], 0)])], reward=1.0)
    batch, report = build_batch([replayed, sampled, mixed], trainer_version=0)
    assert batch.trajectory_ids == ("t-p", "t-m")
    assert batch.tokens.tolist() == [[7, 5, 8, 9], [3, 4, 5, 10]]  # replayed tokens: context
    assert batch.action_mask.tolist() == [[True, False, True, True], [False, False, False, True]]
    assert batch.token_versions.tolist() == [[0, -1, 0, 0], [-1, -1, -1, 0]]
    assert batch.behavior_logp[1, :3].abs().sum() == 0
    assert batch.rewards.tolist() == [0.0, 1.0]
    assert (report.scripted_tokens, report.scripted_trajectories) == (5, 2)
    assert (report.trajectories_in, report.trajectories, report.empty_rows) == (3, 2, 1)


def test_scripted_flag_survives_the_wire_format_and_a_scripted_only_batch_is_refused() -> None:
    replayed = record("t-s", [([1, 2], [scripted([], [3, 4])])], reward=1.0)
    assert [t.scripted for t in replayed.segments[0].turns] == [True]  # record() round-trips
    with pytest.raises(BatchError, match="1 with scripted turns"):
        build_batch([replayed], trainer_version=0)


def test_a_text_only_record_of_a_relay_adapter_is_refused() -> None:
    from services.protocol import TextTurn

    relayed = record("relayed", [([3, 4], [turn([], [5, 6], 0)])], reward=1.0)
    relayed.segments.clear()  # what a relay-mode adapter records: text turns only
    text = TextTurn(messages=[{"role": "user", "content": "hi"}], response={"content": "ok"})
    relayed.text_turns.append(text)
    # a malformed record, not a skippable batch: the training run stops with the reason
    with pytest.raises(RecordError, match="trajectory relayed: text-only record"):
        build_batch([record("fine", [([3, 4], [turn([], [5, 6], 0)])]), relayed], 0)
