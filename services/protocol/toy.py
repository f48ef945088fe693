"""The toy task "lookup then answer": its instance ids, prompt, tool, observation and reward.

A task small enough for the tiny model to learn on a CPU with the same shape as an agent episode
(docs/toy-task.md): the system prompt asks the model to call the ``lookup`` tool; the tool's
observation holds a secret code (one of :data:`CODES`, on :data:`CODE_REPEATS` lines); the
second assistant turn must answer that code. Reward 1 if it does, else 0.

Everything here is pure and shared by the sandbox worker's toy runner (which plays it against
the adapter, ``sandbox_worker/toy/``) and by the format warm-start of the tiny model
(``services/tiny_model/warm_start.py``, which trains on the very same prompt and tool), so it
lives in the shared base.

* Instance ids are ``toy-lookup-<n>`` (``n`` a decimal integer, no leading zeros, below
  :data:`MAX_INSTANCE`); ``n`` appears in the user message, so different ids are different
  prompts.
* The code of a trajectory is drawn from its task id and attempt with SHA-256
  (:func:`draw_code`): reproducible, independent of the prompt, uniform over the codes.
* The answer rule (:func:`reward_for_answer`): the answer turn's text, stripped of surrounding
  whitespace, must be exactly the code.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, Literal

#: The secret codes: single tokens of the tiny model's vocabulary (also after a newline), so an
#: answer is one code token and the end-of-turn token.
CODES: tuple[str, ...] = ("red", "cat", "key", "pear")
#: 32 lines: with 8 the 2-layer tiny model could not learn to read the observation at all (a
#: supervised copy of the code failed in 300 steps; its attention over ~300 prompt tokens
#: dilutes 8 code tokens to noise), with 32 it learns it (docs/toy-task.md).
CODE_REPEATS = 32
TOOL_NAME = "lookup"
INSTANCE_PREFIX = "toy-lookup-"
MAX_INSTANCE = 10**9
_INSTANCE_RE = re.compile(r"^toy-lookup-(0|[1-9][0-9]{0,8})$")

SYSTEM_PROMPT = (
    "You are a lookup agent. First call the lookup tool. "
    "Then answer with the secret code it returns, and nothing else."
)

LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Look up the secret code.",
        "parameters": {"type": "object", "properties": {}},
    },
}


class ToyTaskError(ValueError):
    """A toy instance id or answer is not what the toy task accepts (the message says why)."""


def instance_number(instance_id: str) -> int:
    """``n`` of ``toy-lookup-<n>``; :class:`ToyTaskError` for anything else."""
    match = _INSTANCE_RE.match(instance_id)
    if match is None:
        raise ToyTaskError(
            f"{instance_id!r} is not a toy instance id: expected {INSTANCE_PREFIX}<n> with n a "
            f"decimal integer without leading zeros, 0 <= n < {MAX_INSTANCE}"
        )
    return int(match.group(1))


def toy_instance_ids(count: int, start: int = 0) -> list[str]:
    """``count`` consecutive toy instance ids from ``toy-lookup-<start>``."""
    if count < 1 or start < 0 or start + count > MAX_INSTANCE:
        raise ToyTaskError(f"need 1 <= count and 0 <= start, start + count <= {MAX_INSTANCE}")
    return [f"{INSTANCE_PREFIX}{n}" for n in range(start, start + count)]


#: One toy prompt in :data:`HELD_OUT_EVERY` is held out (:func:`is_held_out`).
HELD_OUT_EVERY = 8
ToyPart = Literal["all", "train", "held_out"]


def is_held_out(n: int) -> bool:
    """Whether ``toy-lookup-<n>`` belongs to the held-out part of the toy prompts: SHA-256 of
    ``"held-out#<n>"`` mod :data:`HELD_OUT_EVERY` is 0. A hash, not ``n`` mod 8, so the held-out
    prompts have no digit pattern the training prompts lack (same distribution, unseen ids)."""
    digest = hashlib.sha256(f"held-out#{n}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HELD_OUT_EVERY == 0


def toy_prompt_ids(start: int, stop: int, part: ToyPart = "all") -> list[str]:
    """The toy instance ids ``toy-lookup-<n>`` for ``start <= n < stop``: all of them, only the
    training part (:func:`is_held_out` false) or only the held-out part."""
    if not 0 <= start < stop <= MAX_INSTANCE:
        raise ToyTaskError(f"need 0 <= start < stop <= {MAX_INSTANCE}, got [{start}, {stop})")
    if part not in ("all", "train", "held_out"):
        raise ToyTaskError(f"part must be all, train or held_out, got {part!r}")
    return [
        f"{INSTANCE_PREFIX}{n}"
        for n in range(start, stop)
        if part == "all" or is_held_out(n) == (part == "held_out")
    ]


def user_prompt(instance_id: str) -> str:
    return f"Request {instance_number(instance_id)}: what is the secret code?"


def prompt_messages(instance_id: str) -> list[dict[str, Any]]:
    """The first request's messages (the ``lookup`` tool goes in ``tools``: :data:`LOOKUP_TOOL`)."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt(instance_id)},
    ]


def draw_code(task_id: str, attempt: int) -> str:
    """The secret code of one trajectory: SHA-256 of ``"<task_id>#<attempt>"`` mod ``len(CODES)``
    (a retried attempt gets a fresh draw, as its trajectory is a new one)."""
    if attempt < 1:
        raise ToyTaskError(f"attempt must be >= 1, got {attempt}")
    digest = hashlib.sha256(f"{task_id}#{attempt}".encode()).digest()
    return CODES[int.from_bytes(digest[:8], "big") % len(CODES)]


def observation(code: str) -> str:
    """The ``lookup`` tool's result: the code on :data:`CODE_REPEATS` lines."""
    if code not in CODES:
        raise ToyTaskError(f"unknown code {code!r}; the codes are {list(CODES)}")
    return "\n".join([code] * CODE_REPEATS)


def reward_for_answer(answer: str | None, code: str) -> float:
    """1.0 when the answer, stripped of surrounding whitespace, is exactly ``code``; else 0.0."""
    if code not in CODES:
        raise ToyTaskError(f"unknown code {code!r}; the codes are {list(CODES)}")
    return 1.0 if (answer or "").strip() == code else 0.0
