"""Property test of segment flattening into the trainer's batch: for any finished records,
every segment with generated tokens becomes one row whose padded tensors hold exactly that
segment's prompt, post-prompt tokens, mask, behaviour logprobs and versions, and whose
trajectory index and reward are its trajectory's."""

from __future__ import annotations

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from services.protocol import Outcome, OutcomeStatus, TrajectoryMeta, TrajectoryRecord
from tests.support.protocol_strategies import segments
from trainer.config import BatchConfig
from trainer.data import build_batch

TRAINER_VERSION = 2**40  # at least every version the strategies draw: no token is newer
CONFIG = BatchConfig(max_policy_lag=2**41)  # keep every trajectory: this test is about layout


@st.composite
def records(draw: st.DrawFn) -> list[TrajectoryRecord]:
    out = []
    for n in range(draw(st.integers(min_value=1, max_value=2))):
        parts = draw(st.lists(segments(max_turns=2, min_prompt=1), min_size=1, max_size=2))
        outcome = Outcome(status=OutcomeStatus.COMPLETED, reward=draw(st.sampled_from([0.0, 1.0])))
        meta = TrajectoryMeta(trajectory_id=f"t-{n}", group_id="g")
        out.append(TrajectoryRecord(meta=meta, segments=parts, outcome=outcome))
    return out


@settings(max_examples=30, deadline=None)
@given(records())
def test_every_segment_with_actions_is_one_row_holding_exactly_its_tokens(recs) -> None:
    assume(any(t.output_ids for r in recs for s in r.segments for t in s.turns))
    batch, report = build_batch(recs, TRAINER_VERSION, CONFIG)
    expected = [
        (r, s) for r in recs for s in r.segments if any(turn.output_ids for turn in s.turns)
    ]
    assert batch.num_rows == report.rows == len(expected)
    for n, (record, segment) in enumerate(expected):
        prompt = list(segment.prompt_ids)
        post = segment.token_ids()[len(prompt) :]
        outputs = [
            (i, lp, turn.weight_version)
            for turn in segment.turns
            for i, lp in zip(turn.output_ids, turn.output_logprobs, strict=True)
        ]
        assert batch.input_ids[n, : batch.seq_lengths[n]].tolist() == prompt + post
        assert int(batch.prompt_lengths[n]) == len(prompt)
        assert batch.tokens[n].tolist() == post + [-1] * (batch.tokens.shape[1] - len(post))
        mask = batch.action_mask[n]
        assert batch.tokens[n][mask].tolist() == [i for i, _, _ in outputs]
        assert batch.behavior_logp[n][mask].tolist() == [lp for _, lp, _ in outputs]
        assert batch.token_versions[n][mask].tolist() == [v for _, _, v in outputs]
        assert bool((batch.behavior_logp[n][~mask] == 0).all())
        assert bool((batch.token_versions[n][~mask] == -1).all())
        assert batch.trajectory_ids[int(batch.trajectory_index[n])] == record.meta.trajectory_id
        assert float(batch.rewards[n]) == record.outcome.reward
    assert int(batch.action_mask.sum()) == sum(r.n_generated_tokens for r in recs)
    assert batch.trajectory_index.dtype == torch.long
