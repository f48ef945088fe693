"""Encoding and validation of the entries on per-node task streams.

An entry has three fields: ``task_id``, ``attempt`` and ``payload`` (the task's JSON as the
manager stored it at submission). The attempt lives outside the payload because retries and
re-deliveries bump it inside Lua without re-encoding JSON. Anything that does not decode into
a valid :class:`RolloutTask` raises :class:`PayloadError`, which the worker dead-letters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from services.protocol.tasks import RolloutTask


class PayloadError(ValueError):
    """A stream entry is not a valid task; the message says why (it becomes the dead reason)."""


@dataclass(frozen=True)
class TaskEntry:
    entry_id: str
    task: RolloutTask


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def entry_fields(fields: dict[bytes, bytes] | dict[str, str]) -> dict[str, str]:
    """Stream fields as text (invalid UTF-8 replaced, so a dead letter can always be written)."""
    return {_text(k): _text(v) for k, v in fields.items()}


def decode_task_entry(entry_id: str, fields: dict[bytes, bytes] | dict[str, str]) -> TaskEntry:
    text = entry_fields(fields)
    missing = [k for k in ("task_id", "attempt", "payload") if k not in text]
    if missing:
        raise PayloadError(f"missing field(s) {', '.join(missing)}")
    try:
        attempt = int(text["attempt"])
    except ValueError:
        raise PayloadError(f"attempt is not an integer: {text['attempt'][:50]!r}") from None
    try:
        data = json.loads(text["payload"])
    except json.JSONDecodeError as exc:
        raise PayloadError(f"payload is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PayloadError(f"payload must be a JSON object, got {type(data).__name__}")
    data["attempt"] = attempt
    try:
        task = RolloutTask.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(root)'}: {e['msg']}" for e in exc.errors()
        )
        raise PayloadError(f"payload is not a valid task: {problems}") from None
    if task.task_id != text["task_id"]:
        raise PayloadError(
            f"task_id field {text['task_id']!r} does not match the payload's {task.task_id!r}"
        )
    return TaskEntry(entry_id=entry_id, task=task)


def task_payload(task: RolloutTask) -> str:
    """The JSON stored for a task (its attempt is carried separately, see module doc)."""
    return task.model_dump_json(exclude={"attempt"})
