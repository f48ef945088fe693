"""Framing of a trajectory record's binary entries on the wire (``GET /trajectories/<id>/raw``).

The adapter's ``/raw`` answer is the record's entries (segment headers and turns, see
:mod:`services.protocol.trajectory`) one after another, each as a little-endian u32 byte length
followed by the entry's bytes; the ``x-swerl-entries`` header carries the entry count, so a
truncated body is detected even when it ends on a frame boundary.

:func:`encode_frames` and :func:`decode_frames` are the only implementation of this framing: the
adapter encodes with one, every reader (tests, the trainer's batch builder) decodes with the other
and hands the entries to :meth:`TrajectoryRecord.from_entries`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from services.protocol.trajectory import ProtocolError

MEDIA_TYPE = "application/octet-stream"
COUNT_HEADER = "x-swerl-entries"

_LENGTH = struct.Struct("<I")
MAX_ENTRY_BYTES = (1 << 32) - 1


def encode_frames(entries: Sequence[bytes]) -> bytes:
    """The entries as one body: ``u32 LE length + bytes`` per entry, in order."""
    parts: list[bytes] = []
    for i, entry in enumerate(entries):
        if len(entry) > MAX_ENTRY_BYTES:
            raise ProtocolError(f"entry {i} is {len(entry)} bytes, more than a u32 length holds")
        parts.append(_LENGTH.pack(len(entry)))
        parts.append(bytes(entry))
    return b"".join(parts)


def decode_frames(payload: bytes, expected_count: int | str | None = None) -> list[bytes]:
    """The entries of a body made by :func:`encode_frames`.

    ``expected_count`` is the ``x-swerl-entries`` header (an int or its text), checked when
    given. A truncated length or entry, or a count that differs, is a :class:`ProtocolError`.
    """
    view = memoryview(payload)
    entries: list[bytes] = []
    offset = 0
    while offset < len(view):
        if len(view) - offset < _LENGTH.size:
            raise ProtocolError(
                f"truncated frame at byte {offset}: {len(view) - offset} bytes left, "
                f"a length prefix needs {_LENGTH.size}"
            )
        (size,) = _LENGTH.unpack_from(view, offset)
        start = offset + _LENGTH.size
        if size > len(view) - start:
            raise ProtocolError(
                f"truncated entry {len(entries)} at byte {offset}: it declares {size} bytes, "
                f"{len(view) - start} remain"
            )
        entries.append(bytes(view[start : start + size]))
        offset = start + size
    if expected_count is not None and _count(expected_count) != len(entries):
        raise ProtocolError(
            f"{COUNT_HEADER} says {expected_count} entries, the body holds {len(entries)}"
        )
    return entries


def _count(value: int | str) -> int:
    if isinstance(value, bool):
        raise ProtocolError(f"{COUNT_HEADER} must be a count, got {value!r}")
    if isinstance(value, int):
        return value
    text = value.strip()
    if not text.isdigit() or not text.isascii():
        raise ProtocolError(f"{COUNT_HEADER} must be a non-negative integer, got {value[:40]!r}")
    return int(text)
