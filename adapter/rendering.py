"""Chat-template rendering and tokenisation with the model's own Hugging Face tokenizer.

The adapter renders prompts exactly as the model was trained to see them (the tokenizer's chat
template), and turns text into ids with the same tokenizer, never adding BOS or other special
tokens implicitly: every special token comes from the template text itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adapter.errors import APIError


class RenderError(APIError):
    """The chat template refused the conversation (e.g. an unsupported role or shape)."""

    def __init__(self, message: str) -> None:
        super().__init__(400, f"chat template error: {message}", code="template_error")


class Renderer:
    """Wraps the tokenizer of ``model_dir``: render, encode, decode, stop-token facts."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        chat_template_kwargs: dict[str, Any] | None = None,
        end_of_turn: str | None = None,
        context_length: int | None = None,
    ) -> None:
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "tokenizer_config.json").is_file():
            raise FileNotFoundError(f"{self.model_dir} has no tokenizer_config.json")
        from transformers import AutoTokenizer  # heavy (imports torch): only once it is needed

        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        template = self.tokenizer.chat_template
        if not isinstance(template, str) or not template:
            raise ValueError(f"the tokenizer of {self.model_dir} has no (single) chat template")
        self.chat_template: str = template
        self.template_kwargs = dict(chat_template_kwargs or {})
        eos = self.tokenizer.eos_token
        self.end_of_turn: str = end_of_turn or (eos if isinstance(eos, str) else "")
        if not self.end_of_turn:
            raise ValueError("the tokenizer has no eos token: set adapter.end_of_turn")
        self.context_length = context_length or self._model_context_length()
        self.stop_token_ids = self._stop_token_ids()

    def _model_context_length(self) -> int:
        config = self.model_dir / "config.json"
        if config.is_file():
            data = json.loads(config.read_text())
            for key in ("max_position_embeddings", "max_sequence_length", "seq_length"):
                if isinstance(data.get(key), int):
                    return int(data[key])
        limit = getattr(self.tokenizer, "model_max_length", None)
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
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        return frozenset(ids)

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools or None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
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
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    def decode(self, ids: list[int]) -> str:
        """Text shown to the client: special (control) tokens dropped, markers kept."""
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def token_text(self, token_id: int) -> str:
        text: str = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text
