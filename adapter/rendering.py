"""Chat-template rendering and tokenisation with the model's own Hugging Face tokenizer files.

The adapter renders prompts exactly as the model was trained to see them (the tokenizer's chat
template), and turns text into ids with the same tokenizer, never adding BOS or other special
tokens implicitly: every special token comes from the template text itself. Neither needs
transformers (nor torch): :mod:`adapter.chat_template` renders the template byte-identically to
``apply_chat_template`` and :mod:`adapter.text_tokenizer` loads ``tokenizer.json`` with the
``tokenizers`` library, giving the ids transformers' fast tokenizer gives.

Prompts are bounded before they are tokenised (:meth:`Renderer.encode_prompt`): every token of
the vocabulary stands for at most :attr:`Renderer.bytes_per_token` bytes of text, so a text of
more than ``tokens_left * bytes_per_token`` UTF-8 bytes cannot fit the context window and is
refused without tokenising it. A text that passes is tokenised and refused if its token count
does not fit, before its ids are turned into Python objects. Texts above
:data:`PROCESS_MIN_CHARS` go to tokenizer processes when the adapter attached them
(:mod:`adapter.tokenize_worker`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from adapter.chat_template import ChatTemplate, load_chat_template
from adapter.errors import APIError
from adapter.text_tokenizer import TextTokenizer

# Texts with more characters than this are tokenised in a tokenizer process when one is attached
# (freeing the Encoding of ~32k tokens holds the GIL for a few ms; of 500k tokens, ~100 ms).
PROCESS_MIN_CHARS = 65536

# (text, limit) -> (token count, ids or None when the count is >= limit)
LargeTextEncoder = Callable[[str, int], tuple[int, list[int] | None]]


class RenderError(APIError):
    """The chat template refused the conversation (e.g. an unsupported role or shape)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, f"chat template error: {message}", code="template_error")


class ContextLengthError(APIError):
    """The prompt does not fit the context window (LiteLLM's "maximum context length" phrase)."""

    def __init__(self, what: str, context: int) -> None:
        super().__init__(
            400,
            f"{what} but the model's context window is {context} tokens (this model's maximum "
            f"context length is {context} tokens, the phrase clients such as LiteLLM look for); "
            "shorten the conversation",
            code="context_length_exceeded",
            param="messages",
        )


class Renderer:
    """Wraps the tokenizer of ``model_dir``: render, encode, decode, stop-token facts."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
        end_of_turn: str | None = None,
        context_length: int | None = None,
        max_bytes_per_token: float | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "tokenizer_config.json").is_file():
            raise FileNotFoundError(f"{self.model_dir} has no tokenizer_config.json")
        self.tokenizer = TextTokenizer(self.model_dir)
        template = load_chat_template(self.model_dir, self.tokenizer.config)
        if not isinstance(template, str) or not template:
            raise ValueError(
                f"the tokenizer of {self.model_dir} has no (single) chat template: add "
                "chat_template.jinja (or chat_template in tokenizer_config.json)"
            )
        self.chat_template: str = template
        self._template = ChatTemplate(template, self.tokenizer.special_tokens_map)
        self.template_kwargs = dict(chat_template_kwargs or {})
        eos = self.tokenizer.eos_token
        self.end_of_turn: str = end_of_turn or (eos if isinstance(eos, str) else "")
        if not self.end_of_turn:
            raise ValueError("the tokenizer has no eos token: set adapter.end_of_turn")
        self.context_length = context_length or self._model_context_length()
        self.stop_token_ids = self._stop_token_ids()
        self._backend: Any = self.tokenizer.backend  # truncation and padding already off
        self.max_token_bytes = self._longest_token_bytes()
        self.bytes_per_token: float = max_bytes_per_token or float(self.max_token_bytes)
        self.large_text_encoder: LargeTextEncoder | None = None

    def _longest_token_bytes(self) -> int:
        """An upper bound of the UTF-8 bytes one token stands for: the longest decoded token,
        plus one byte for a space a decoder strips from a lone token (Metaspace, WordPiece).
        A partial UTF-8 sequence decodes to U+FFFD (3 bytes), never less than it stands for."""
        ids = [[i] for i in range(len(self.tokenizer))]
        texts = self._backend.decode_batch(ids, skip_special_tokens=False)
        return max(len(t.encode("utf-8", "surrogatepass")) for t in texts) + 1

    def tokenizer_json(self) -> str | None:
        """The tokenizer's full definition (what tokenizer processes load)."""
        return self.tokenizer.to_str()

    def _model_context_length(self) -> int:
        config = self.model_dir / "config.json"
        if config.is_file():
            data = json.loads(config.read_text())
            for key in ("max_position_embeddings", "max_sequence_length", "seq_length"):
                if isinstance(data.get(key), int):
                    return int(data[key])
        limit = self.tokenizer.model_max_length
        if isinstance(limit, int) and 0 < limit < 10**9:
            return limit
        raise ValueError("cannot tell the context length: set adapter.context_length")

    def _stop_token_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        gen = self.model_dir / "generation_config.json"
        if gen.is_file():
            value = json.loads(gen.read_text()).get("eos_token_id")
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list):
                ids.update(int(v) for v in value)
        eos_id = self.tokenizer.eos_token_id
        if eos_id is not None:
            ids.add(int(eos_id))
        return frozenset(ids)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        try:
            text = self._template.render(
                messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                **self.template_kwargs,
            )
        except APIError:
            raise
        except Exception as exc:  # jinja2 TemplateError and friends: the input's fault
            raise RenderError(str(exc)) from None
        if not isinstance(text, str):
            raise RenderError("chat template did not render a string")
        return text

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        # one call that releases the GIL while it encodes
        ids: list[int] = self._backend.encode_batch([text], add_special_tokens=False)[0].ids
        return ids

    def encode_prompt(self, text: str, known_tokens: int = 0) -> list[int]:
        """Ids of ``text``, which follows ``known_tokens`` tokens of the prompt; raises
        :class:`ContextLengthError` when the whole prompt would not fit the context window --
        from the text's size alone when it is too big to fit, else from its token count."""
        context = self.context_length
        limit = context - known_tokens  # the text must tokenise to fewer tokens than this
        size = len(text.encode("utf-8", "surrogatepass"))
        if limit <= 0 or size > limit * self.bytes_per_token:
            least = known_tokens + math.ceil(size / self.bytes_per_token)
            raise ContextLengthError(
                f"the prompt is at least {least} tokens ({size} bytes of text at most "
                f"{self.bytes_per_token:g} bytes per token, after {known_tokens} tokens)",
                context,
            )
        if not text:
            return []
        if self.large_text_encoder is not None and len(text) > PROCESS_MIN_CHARS:
            n, ids = self.large_text_encoder(text, limit)
        else:
            encoding = self._backend.encode_batch([text], add_special_tokens=False)[0]
            n = len(encoding)
            ids = encoding.ids if n < limit else None
        if ids is None or n >= limit:
            raise ContextLengthError(f"the prompt is {known_tokens + n} tokens", context)
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text shown to the client: special (control) tokens dropped, markers kept."""
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def token_text(self, token_id: int) -> str:
        text: str = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text
