"""Finished trajectory records -> padded training batches and micro-batch plans.

See :mod:`trainer.data.batch` for the layout and docs/trainer.md for the choices.
"""

from trainer.data.batch import BatchError, BuildReport, TrainBatch, batch_from_rows, build_batch
from trainer.data.micro import (
    MicroBatchPlan,
    PackedInputs,
    lane_layout,
    pack_inputs,
    plan_micro_batches,
)
from trainer.data.rows import RecordError, SegmentRow, check_record, segment_rows

__all__ = [
    "BatchError",
    "BuildReport",
    "MicroBatchPlan",
    "PackedInputs",
    "RecordError",
    "SegmentRow",
    "TrainBatch",
    "batch_from_rows",
    "build_batch",
    "check_record",
    "lane_layout",
    "pack_inputs",
    "plan_micro_batches",
    "segment_rows",
]
