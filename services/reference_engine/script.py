"""Scripted policy for the reference engine (``--script FILE``): replay given assistant outputs.

A tiny random model cannot solve a task, so tests that need an agent that succeeds run the
reference engine in *scripted mode*: the engine still runs the loaded model over every token (so
each reported logprob is the real logprob the model assigns to the replayed token), but the token
it emits is taken from a script instead of being sampled. This is test machinery and is labelled
as such in ``/model_info``, in every ``meta_info`` and in the logs.

Script file: JSON Lines, one conversation per line, either

* ``{"match": "SUBSTRING", "turns": [OUTPUT, ...]}`` -- used for prompts whose decoded text
  contains ``SUBSTRING`` (e.g. a task id in the user message), or
* ``[OUTPUT, ...]`` -- shorthand for ``match: ""``, which matches every prompt.

Each ``OUTPUT`` is the assistant's text (tokenised with the model's tokenizer; ``<|im_end|>`` is
appended unless already there) or a list of token ids (used verbatim). The first script in file
order whose ``match`` occurs in the prompt is used; the turn is the number of assistant turns
already in the prompt (``<|im_start|>assistant`` occurrences, not counting the generation prompt
that ends it). Several concurrent conversations are therefore scripted by giving each its own
``match``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

ASSISTANT_HEADER = "<|im_start|>assistant"
GENERATION_PROMPT = "<|im_start|>assistant\n"


class ScriptError(ValueError):
    """The script file is malformed, or no scripted output fits a prompt."""


class _Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True)
class Script:
    """One scripted conversation: a prompt marker and the token ids of each assistant turn."""

    line: int
    match: str
    turns: tuple[tuple[int, ...], ...]


class ScriptBook:
    """All scripts of a file, tokenised once at start-up."""

    def __init__(self, scripts: list[Script], path: str) -> None:
        if not scripts:
            raise ScriptError(f"script file {path} holds no scripts")
        self.scripts = scripts
        self.path = path

    @classmethod
    def load(
        cls, path: str | Path, tokenizer: _Tokenizer, eos_id: int, vocab_size: int
    ) -> ScriptBook:
        path = Path(path)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ScriptError(f"cannot read script file {path}: {exc}") from exc
        scripts = []
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ScriptError(f"{path}:{number}: not valid JSON ({exc})") from exc
            scripts.append(
                _parse_entry(entry, f"{path}:{number}", number, tokenizer, eos_id, vocab_size)
            )
        return cls(scripts, str(path))

    def select(self, prompt_text: str) -> tuple[Script, int, tuple[int, ...]]:
        """The script, turn index and token ids to replay for a decoded prompt."""
        script = next((s for s in self.scripts if s.match in prompt_text), None)
        if script is None:
            raise ScriptError(
                f"scripted engine: no script in {self.path} matches the prompt "
                f"(markers: {[s.match for s in self.scripts]})"
            )
        turn = count_assistant_turns(prompt_text)
        if turn >= len(script.turns):
            raise ScriptError(
                f"scripted engine: script at line {script.line} (match {script.match!r}) has "
                f"{len(script.turns)} turns but the prompt already holds {turn} assistant turns"
            )
        return script, turn, script.turns[turn]


def count_assistant_turns(prompt_text: str) -> int:
    """Assistant turns already present in a rendered prompt (the generation prompt excluded)."""
    count = prompt_text.count(ASSISTANT_HEADER)
    if prompt_text.endswith(GENERATION_PROMPT) or prompt_text.endswith(ASSISTANT_HEADER):
        count -= 1
    return max(count, 0)


def _parse_entry(
    entry: object, where: str, line: int, tokenizer: _Tokenizer, eos_id: int, vocab_size: int
) -> Script:
    if isinstance(entry, list):
        match, turns = "", entry
    elif isinstance(entry, dict):
        unknown = set(entry) - {"match", "turns"}
        if unknown:
            raise ScriptError(f"{where}: unknown keys {sorted(unknown)} (allowed: match, turns)")
        match = entry.get("match", "")
        turns = entry.get("turns")
        if not isinstance(match, str):
            raise ScriptError(f"{where}: 'match' must be a string")
    else:
        raise ScriptError(f"{where}: a script line must be a JSON list or object")
    if not isinstance(turns, list) or not turns:
        raise ScriptError(f"{where}: 'turns' must be a non-empty list of outputs")
    return Script(
        line=line,
        match=match,
        turns=tuple(
            _turn_ids(turn, f"{where} turn {i}", tokenizer, eos_id, vocab_size)
            for i, turn in enumerate(turns)
        ),
    )


def _turn_ids(
    turn: object, where: str, tokenizer: _Tokenizer, eos_id: int, vocab_size: int
) -> tuple[int, ...]:
    if isinstance(turn, str):
        ids = list(tokenizer.encode(turn, add_special_tokens=False))
        if not ids or ids[-1] != eos_id:
            ids.append(eos_id)
        return tuple(ids)
    if (
        isinstance(turn, list)
        and turn
        and all(isinstance(t, int) and not isinstance(t, bool) for t in turn)
    ):
        bad = [t for t in turn if not 0 <= t < vocab_size]
        if bad:
            raise ScriptError(
                f"{where}: token ids {bad[:5]} outside the vocabulary [0, {vocab_size})"
            )
        return tuple(turn)
    raise ScriptError(f"{where}: an output must be a string or a non-empty list of token ids")
