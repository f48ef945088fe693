"""Decoding task-stream entries: valid tasks pass, everything else is a clear PayloadError."""

from __future__ import annotations

import json

import pytest

from services.protocol import RolloutTask
from services.queue.entries import PayloadError, decode_task_entry, task_payload


def good_fields(attempt: str = "3") -> dict[bytes, bytes]:
    task = RolloutTask(task_id="b:0:0", batch_id="b", group_id="g", instance_id="i", attempt=1)
    return {
        b"task_id": b"b:0:0",
        b"attempt": attempt.encode(),
        b"payload": task_payload(task).encode(),
    }


def test_valid_entry_takes_its_attempt_from_the_entry() -> None:
    entry = decode_task_entry("1-0", good_fields("3"))
    assert entry.entry_id == "1-0"
    assert entry.task.task_id == "b:0:0" and entry.task.attempt == 3
    assert entry.task.trajectory_id == "b:0:0.a3"
    assert '"attempt"' not in task_payload(entry.task)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({b"task_id": b"x"}, "missing field(s) attempt, payload"),
        ({**good_fields(), b"attempt": b"two"}, "attempt is not an integer"),
        ({**good_fields(), b"payload": b"{oops"}, "payload is not JSON"),
        ({**good_fields(), b"payload": b"[1, 2]"}, "payload must be a JSON object, got list"),
        ({**good_fields(), b"payload": b'{"task_id": "b:0:0"}'}, "batch_id: Field required"),
        ({**good_fields(), b"payload": b"\xff\xfe"}, "payload is not JSON"),
        ({**good_fields(), b"task_id": b"other"}, "does not match the payload's 'b:0:0'"),
        ({**good_fields(), b"attempt": b"0"}, "attempt: Input should be greater than or equal"),
    ],
)
def test_invalid_entries_are_rejected_with_the_reason(fields: dict, message: str) -> None:
    with pytest.raises(PayloadError) as err:
        decode_task_entry("1-0", fields)
    assert message in str(err.value)


def test_a_payload_of_an_unknown_kind_is_refused_naming_the_field() -> None:
    task = RolloutTask(task_id="b:0:0", batch_id="b", group_id="g", instance_id="i", attempt=1)
    payload = json.loads(task_payload(task))
    fields = {"task_id": "b:0:0", "attempt": "1", "payload": json.dumps({**payload, "kind": "x"})}
    with pytest.raises(PayloadError, match=r"payload is not a valid task: kind: .*'swe' or 'toy'"):
        decode_task_entry("1-0", fields)
    toy = {**payload, "kind": "toy"}  # a toy task must name a toy instance
    fields["payload"] = json.dumps(toy)
    with pytest.raises(PayloadError, match="kind 'toy': 'i' is not a toy instance id"):
        decode_task_entry("1-0", fields)
    fields["payload"] = json.dumps({**toy, "instance_id": "toy-lookup-2"})
    assert decode_task_entry("1-0", fields).task.kind == "toy"
