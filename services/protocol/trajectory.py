"""The trajectory record: what the adapter records for every agent conversation.

Layout (DESIGN.md "Trajectory record"):

* a record has identifiers, a list of *segments* and, once finished, an :class:`Outcome`;
* a segment is one token-consistent prefix chain: ``prompt_ids`` then, per turn, the
  observation tokens appended since the previous turn (tool output, user text, template glue;
  action mask 0) followed by the generated tokens (mask 1) with their behaviour logprobs and the
  weight version that produced them;
* a new segment starts when the rendered history stops extending the recorded tokens
  (context condensation, a rewritten assistant turn); ``segment.reason`` says why.

A turn's generated tokens normally come from one weight version (``weight_version``). A
token-mode refresh can switch versions inside a turn; the turn then also carries
``version_runs``: ``(start index, version)`` per run of output tokens of one version, starting
at 0 with ``weight_version`` (the oldest), so the switch point is exact without a version per
token. Records written before runs existed (no ``vr`` in the header) load as one run.

Token data is stored packed (see :mod:`services.protocol.packing`). Wire format of one turn
(``Turn.to_bytes``): ``b"SWT1"``, a little-endian u32 header length, a compact JSON header, then
the packed observation ids, output ids and output logprobs whose lengths the header gives.

A record made by the adapter in **relay mode** (an arbitrary OpenAI-compatible upstream,
docs/adapter.md "Relay mode") has no segments: its turns are :class:`TextTurn` entries
(``b"SWX1"`` + JSON): the request's messages new since the previous turn, the answer message,
usage and timing. It has no token ids and no behaviour logprobs, so the trainer refuses it; it
serves evaluation and inspection.
"""

from __future__ import annotations

import itertools
import json
import struct
import time
from array import array
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from services.protocol.ids import Ident, InstanceKey
from services.protocol.packing import float_array, int_array, pack, unpack

TURN_MAGIC = b"SWT1"
SEGMENT_MAGIC = b"SWS1"
TEXT_TURN_MAGIC = b"SWX1"


class ProtocolError(ValueError):
    """A payload does not follow the trajectory wire format."""


class OutcomeStatus(StrEnum):
    COMPLETED = "completed"  # the agent finished; reward from the tests
    TIMEOUT = "timeout"  # step or wall-time limit hit; reward from whatever patch exists
    ERROR = "error"  # the agent failed (not the infrastructure); reward from any patch
    ABORTED = "aborted"  # infrastructure failure: excluded from training, never a 0


class SegmentReason(StrEnum):
    INITIAL = "initial"
    HISTORY_MISMATCH = "history_mismatch"  # request did not extend the previous messages
    PREFIX_MISMATCH = "prefix_mismatch"  # rendering of old history is not a prefix of the new


@dataclass
class Turn:
    """One assistant turn: observation tokens since the previous turn + generated tokens."""

    observation_ids: array = field(default_factory=int_array)
    output_ids: array = field(default_factory=int_array)
    output_logprobs: array = field(default_factory=float_array)
    weight_version: int = 0
    finish_reason: str = "stop"
    engine: str = ""
    started_at: float = 0.0
    latency_s: float = 0.0
    queue_wait_s: float = 0.0  # time spent waiting at a closed weight-refresh gate
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # (start index into output_ids, version) per run; empty: every token is weight_version's.
    version_runs: list[tuple[int, int]] = field(default_factory=list)
    # The engine replayed a script (the reference engine's scripted mode, test machinery): the
    # tokens are not samples of the policy, so the trainer keeps them out of the loss.
    scripted: bool = False

    def __post_init__(self) -> None:
        if len(self.output_ids) != len(self.output_logprobs):
            raise ProtocolError(
                f"turn has {len(self.output_ids)} output ids but "
                f"{len(self.output_logprobs)} logprobs"
            )
        self.version_runs = [(int(s), int(v)) for s, v in self.version_runs]
        if len(self.version_runs) == 1:  # one run is no switch: stored as weight_version only
            if self.version_runs[0] != (0, self.weight_version):
                raise ProtocolError(
                    f"single version run {self.version_runs[0]} is not (0, {self.weight_version})"
                )
            self.version_runs = []
        if self.version_runs:
            check_version_runs(self.version_runs, self.weight_version, len(self.output_ids))

    def token_versions(self) -> list[int]:
        """The weight version of every output token."""
        if not self.version_runs:
            return [self.weight_version] * len(self.output_ids)
        ends = [start for start, _ in self.version_runs[1:]] + [len(self.output_ids)]
        versions: list[int] = []
        for (start, version), end in zip(self.version_runs, ends, strict=True):
            versions.extend([version] * (end - start))
        return versions

    def header(self) -> dict[str, Any]:
        return {
            "v": self.weight_version,
            "f": self.finish_reason,
            "e": self.engine,
            "t0": self.started_at,
            "lat": self.latency_s,
            "qw": self.queue_wait_s,
            "pt": self.prompt_tokens,
            "ct": self.cached_tokens,
            "no": len(self.observation_ids),
            "ng": len(self.output_ids),
            **({"vr": [list(run) for run in self.version_runs]} if self.version_runs else {}),
            **({"sc": True} if self.scripted else {}),
        }

    def to_bytes(self) -> bytes:
        head = json.dumps(self.header(), separators=(",", ":")).encode()
        return b"".join(
            (
                TURN_MAGIC,
                struct.pack("<I", len(head)),
                head,
                pack(self.observation_ids),
                pack(self.output_ids),
                pack(self.output_logprobs),
            )
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Turn:
        if len(data) < 8 or data[:4] != TURN_MAGIC:
            raise ProtocolError("not a turn record (bad magic)")
        (hlen,) = struct.unpack_from("<I", data, 4)
        try:
            head = json.loads(data[8 : 8 + hlen])
            no, ng = int(head["no"]), int(head["ng"])
            runs = [(int(start), int(version)) for start, version in head.get("vr", [])]
            scripted = head.get("sc", False)
            if not isinstance(scripted, bool):
                raise TypeError(f"sc must be a boolean, got {scripted!r}")
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(f"bad turn header: {exc}") from exc
        off = 8 + hlen
        if len(data) != off + 4 * (no + 2 * ng):
            raise ProtocolError(
                f"turn payload is {len(data) - off} bytes, header says {4 * (no + 2 * ng)}"
            )
        obs = unpack("i", data[off : off + 4 * no])
        off += 4 * no
        out = unpack("i", data[off : off + 4 * ng])
        off += 4 * ng
        lps = unpack("f", data[off : off + 4 * ng])
        return cls(
            observation_ids=obs,
            output_ids=out,
            output_logprobs=lps,
            weight_version=int(head["v"]),
            finish_reason=str(head["f"]),
            engine=str(head.get("e", "")),
            started_at=float(head.get("t0", 0.0)),
            latency_s=float(head.get("lat", 0.0)),
            queue_wait_s=float(head.get("qw", 0.0)),
            prompt_tokens=int(head.get("pt", 0)),
            cached_tokens=int(head.get("ct", 0)),
            version_runs=runs,
            scripted=scripted,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "observation_ids": list(self.observation_ids),
            "output_ids": list(self.output_ids),
            "output_logprobs": list(self.output_logprobs),
            "weight_version": self.weight_version,
            "finish_reason": self.finish_reason,
            "engine": self.engine,
            "started_at": self.started_at,
            "latency_s": self.latency_s,
            "queue_wait_s": self.queue_wait_s,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "version_runs": [list(run) for run in self.version_runs],
            "scripted": self.scripted,
        }


@dataclass
class TextTurn:
    """One answered chat completion of a relay-mode trajectory (text, no tokens).

    ``messages`` are the request's messages after those already recorded (the previous turns'
    requests and answers); when the request's history does not extend the recorded
    conversation (a condensed or rewritten history) ``history_reset`` is True and ``messages``
    is the request's whole history.
    """

    messages: list[dict[str, Any]]
    response: dict[str, Any]
    finish_reason: str = "stop"
    history_reset: bool = False
    model: str = ""
    engine: str = ""  # the upstream's base URL
    started_at: float = 0.0
    latency_s: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "messages": self.messages,
            "response": self.response,
            "finish_reason": self.finish_reason,
            "history_reset": self.history_reset,
            "model": self.model,
            "engine": self.engine,
            "started_at": self.started_at,
            "latency_s": self.latency_s,
            "usage": dict(self.usage),
        }

    def to_bytes(self) -> bytes:
        return TEXT_TURN_MAGIC + json.dumps(self.to_json(), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> TextTurn:
        if data[:4] != TEXT_TURN_MAGIC:
            raise ProtocolError("not a text turn record (bad magic)")
        try:
            raw = json.loads(data[4:])
            turn = cls(
                messages=list(raw["messages"]),
                response=dict(raw["response"]),
                finish_reason=str(raw.get("finish_reason", "stop")),
                history_reset=bool(raw.get("history_reset", False)),
                model=str(raw.get("model", "")),
                engine=str(raw.get("engine", "")),
                started_at=float(raw.get("started_at", 0.0)),
                latency_s=float(raw.get("latency_s", 0.0)),
                usage={str(k): int(v) for k, v in dict(raw.get("usage", {})).items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ProtocolError(f"bad text turn: {exc}") from exc
        if not all(isinstance(m, dict) for m in turn.messages):
            raise ProtocolError("bad text turn: messages must be objects")
        return turn


def check_version_runs(runs: list[tuple[int, int]], weight_version: int, n_tokens: int) -> None:
    """Runs start at 0 with ``weight_version``, then strictly increasing starts inside the
    output and a different version each (raises ProtocolError)."""
    if runs[0] != (0, weight_version):
        raise ProtocolError(f"version runs start with {runs[0]}, not (0, {weight_version})")
    for (start, version), (next_start, next_version) in itertools.pairwise(runs):
        if not start < next_start < n_tokens:
            raise ProtocolError(
                f"version run starts {start}, {next_start} are not increasing inside "
                f"{n_tokens} output tokens"
            )
        if next_version == version:
            raise ProtocolError(f"adjacent version runs have the same version {version}")


@dataclass
class Segment:
    prompt_ids: array = field(default_factory=int_array)
    turns: list[Turn] = field(default_factory=list)
    reason: SegmentReason = SegmentReason.INITIAL
    started_at: float = field(default_factory=time.time)

    def header_bytes(self) -> bytes:
        """Segment opener: magic, reason, start time and the packed prompt ids."""
        head = json.dumps(
            {
                "r": str(self.reason),
                "t0": self.started_at,
                "np": len(self.prompt_ids),
            },
            separators=(",", ":"),
        ).encode()
        return SEGMENT_MAGIC + struct.pack("<I", len(head)) + head + pack(self.prompt_ids)

    @classmethod
    def from_header_bytes(cls, data: bytes) -> Segment:
        if len(data) < 8 or data[:4] != SEGMENT_MAGIC:
            raise ProtocolError("not a segment record (bad magic)")
        (hlen,) = struct.unpack_from("<I", data, 4)
        try:
            head = json.loads(data[8 : 8 + hlen])
            n = int(head["np"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ProtocolError(f"bad segment header: {exc}") from exc
        body = data[8 + hlen :]
        if len(body) != 4 * n:
            raise ProtocolError(f"segment prompt is {len(body)} bytes, header says {4 * n}")
        return cls(
            prompt_ids=unpack("i", body),
            reason=SegmentReason(head["r"]),
            started_at=float(head.get("t0", 0.0)),
        )

    def token_ids(self) -> list[int]:
        """All tokens of the segment in order: prompt, then per turn observation + output."""
        ids = list(self.prompt_ids)
        for turn in self.turns:
            ids.extend(turn.observation_ids)
            ids.extend(turn.output_ids)
        return ids

    def flatten(self) -> dict[str, list]:
        """Post-prompt sequence for training: tokens, action mask, behaviour logprobs, versions.

        Observation tokens get mask 0, logprob 0.0 and version -1.
        """
        tokens: list[int] = []
        mask: list[int] = []
        logps: list[float] = []
        versions: list[int] = []
        for turn in self.turns:
            n_obs = len(turn.observation_ids)
            tokens.extend(turn.observation_ids)
            mask.extend([0] * n_obs)
            logps.extend([0.0] * n_obs)
            versions.extend([-1] * n_obs)
            n_out = len(turn.output_ids)
            tokens.extend(turn.output_ids)
            mask.extend([1] * n_out)
            logps.extend(turn.output_logprobs)
            versions.extend(turn.token_versions())
        return {
            "tokens": tokens,
            "action_mask": mask,
            "logprobs": logps,
            "versions": versions,
        }


class Outcome(BaseModel):
    status: OutcomeStatus
    reward: float | None = None  # None exactly when status is aborted
    abort_reason: str | None = None
    patch: str = ""
    test_report: dict[str, Any] = Field(default_factory=dict)
    n_turns: int = 0
    n_tokens: int = 0
    durations: dict[str, float] = Field(default_factory=dict)
    # False for an aborted outcome another attempt cannot change (unknown instance, missing
    # image: a configuration error): the queue finalises it at once instead of retrying.
    retryable: bool = True

    @model_validator(mode="after")
    def _reward_matches_status(self) -> Outcome:
        if self.status is OutcomeStatus.ABORTED:
            if self.reward is not None:
                raise ValueError("an aborted trajectory carries no reward (it is never a 0)")
            if not self.abort_reason:
                raise ValueError("an aborted trajectory needs an abort_reason")
        elif not self.retryable:
            raise ValueError("only an aborted trajectory can be marked not retryable")
        elif self.reward is None:
            raise ValueError(f"a {self.status} trajectory needs a reward")
        return self

    @property
    def trainable(self) -> bool:
        return self.status is not OutcomeStatus.ABORTED


class TrajectoryMeta(BaseModel):
    """Identifiers of a trajectory; set when it is opened.

    Unknown keys and mistyped values (``"5"`` for a number) are refused, not coerced: what a
    caller meant to record but misspelled would otherwise be lost silently.
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    trajectory_id: Ident
    task_id: Ident | Literal[""] = ""
    batch_id: Ident | Literal[""] = ""
    group_id: Ident | Literal[""] = ""
    instance_id: InstanceKey | Literal[""] = ""
    created_at: float = Field(default_factory=time.time, ge=0)
    extra: dict[str, Any] = Field(default_factory=dict)


@dataclass
class TrajectoryRecord:
    meta: TrajectoryMeta
    segments: list[Segment] = field(default_factory=list)
    outcome: Outcome | None = None
    counters: dict[str, int] = field(default_factory=dict)
    text_turns: list[TextTurn] = field(default_factory=list)  # relay mode only

    @property
    def n_turns(self) -> int:
        return sum(len(s.turns) for s in self.segments) + len(self.text_turns)

    @property
    def text_only(self) -> bool:
        """Recorded in relay mode: text turns, no tokens (not trainable)."""
        return bool(self.text_turns)

    @property
    def n_generated_tokens(self) -> int:
        return sum(len(t.output_ids) for s in self.segments for t in s.turns)

    @property
    def n_tokens(self) -> int:
        return sum(len(s.token_ids()) for s in self.segments)

    def to_json(self) -> dict[str, Any]:
        """A JSON view (token lists expanded) for the HTTP API and debugging."""
        return {
            "meta": self.meta.model_dump(mode="json"),
            "segments": [
                {
                    "reason": str(s.reason),
                    "started_at": s.started_at,
                    "prompt_ids": list(s.prompt_ids),
                    "turns": [t.to_json() for t in s.turns],
                }
                for s in self.segments
            ],
            "outcome": self.outcome.model_dump(mode="json") if self.outcome else None,
            "counters": dict(self.counters),
            **({"text_turns": [t.to_json() for t in self.text_turns]} if self.text_turns else {}),
        }

    def to_entries(self) -> list[bytes]:
        """The record as an ordered list of binary entries (segment headers, then its turns).

        This is the form the adapter appends to Redis as turns complete, and the form
        :meth:`from_entries` reads back.
        """
        entries: list[bytes] = []
        for seg in self.segments:
            entries.append(seg.header_bytes())
            entries.extend(t.to_bytes() for t in seg.turns)
        entries.extend(t.to_bytes() for t in self.text_turns)
        return entries

    @classmethod
    def from_entries(
        cls,
        meta: TrajectoryMeta,
        entries: list[bytes],
        outcome: Outcome | None = None,
        counters: dict[str, int] | None = None,
    ) -> TrajectoryRecord:
        rec = cls(meta=meta, outcome=outcome, counters=dict(counters or {}))
        for raw in entries:
            if raw[:4] == SEGMENT_MAGIC:
                rec.segments.append(Segment.from_header_bytes(raw))
            elif raw[:4] == TURN_MAGIC:
                if not rec.segments:
                    raise ProtocolError("turn entry before any segment entry")
                rec.segments[-1].turns.append(Turn.from_bytes(raw))
            elif raw[:4] == TEXT_TURN_MAGIC:
                rec.text_turns.append(TextTurn.from_bytes(raw))
            else:
                raise ProtocolError("unknown record entry (bad magic)")
        return rec
