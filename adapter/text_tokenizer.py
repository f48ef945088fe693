"""A model's tokenizer loaded with the ``tokenizers`` library alone (no transformers, no torch).

:class:`TextTokenizer` reads ``tokenizer.json`` and ``tokenizer_config.json`` the way transformers'
fast tokenizer does for the calls the adapter makes -- encode without adding special tokens,
decode with or without them, the named special tokens and their ids, the vocabulary size -- and
gives the same ids and texts. Special and added tokens that ``tokenizer_config.json`` declares but
``tokenizer.json`` lacks are added, as transformers adds them when it loads the tokenizer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# transformers' named special tokens, in its order (the chat template sees them as variables)
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# transformers' model_max_length when the config names none
_NO_LIMIT = int(1e30)
_FORCE_BPE_CLEAN_UP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"


def _token_text(value: Any) -> str | None:
    """A token as tokenizer_config.json writes it: a string or a serialised ``AddedToken``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _added_token(value: Any, special: bool) -> AddedToken | None:
    text = _token_text(value)
    if text is None:
        return None
    if not isinstance(value, dict):
        return AddedToken(text, special=special, normalized=not special)
    return AddedToken(
        text,
        single_word=bool(value.get("single_word", False)),
        lstrip=bool(value.get("lstrip", False)),
        rstrip=bool(value.get("rstrip", False)),
        normalized=bool(value.get("normalized", not special)),
        special=bool(value.get("special", special)),
    )


def _clean_up_spaces(text: str) -> str:
    """transformers' ``clean_up_tokenization`` (for WordPiece-style decoders)."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text


class TextTokenizer:
    """The fast tokenizer of ``model_dir``: ``encode``, ``decode``, special tokens, vocabulary."""

    def __init__(self, model_dir: str | Path) -> None:
        root = self.model_dir = Path(model_dir)
        config_path = root / TOKENIZER_CONFIG_FILE
        if not config_path.is_file():
            raise FileNotFoundError(f"{root} has no {TOKENIZER_CONFIG_FILE}")
        if not (root / TOKENIZER_FILE).is_file():
            raise FileNotFoundError(
                f"{root} has no {TOKENIZER_FILE} (the adapter needs a fast tokenizer): write it "
                "once with transformers, AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)"
            )
        self.config: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8"))
        self.backend = Tokenizer.from_file(str(root / TOKENIZER_FILE))
        self.backend.no_truncation()  # settings changed only here, never while encoding
        self.backend.no_padding()
        self._add_declared_tokens()
        self.special_tokens_map: dict[str, str] = {
            name: text
            for name in SPECIAL_TOKEN_NAMES
            if (text := _token_text(self.config.get(name))) is not None
        }
        limit = self.config.get("model_max_length")
        self.model_max_length: int = int(limit) if isinstance(limit, int | float) else _NO_LIMIT
        self.clean_up_tokenization_spaces = bool(self.config.get("clean_up_tokenization_spaces"))
        # transformers skips the clean-up for BPE models (it would corrupt their text)
        force = bool(self.config.get(_FORCE_BPE_CLEAN_UP))
        is_bpe = type(self.backend.model).__name__ == "BPE"
        self._clean_up = self.clean_up_tokenization_spaces and (force or not is_bpe)

    def _add_declared_tokens(self) -> None:
        """Add the tokens tokenizer_config.json declares and tokenizer.json lacks."""
        declared = self.config.get("added_tokens_decoder") or {}
        for _, value in sorted(declared.items(), key=lambda item: int(item[0])):
            token = _added_token(value, special=bool(value.get("special", False)))
            if token is not None and self.backend.token_to_id(token.content) is None:
                if token.special:
                    self.backend.add_special_tokens([token])
                else:
                    self.backend.add_tokens([token])
        extra: list[Any] = [self.config.get(name) for name in SPECIAL_TOKEN_NAMES]
        for key in ("additional_special_tokens", "extra_special_tokens"):
            value = self.config.get(key)
            if isinstance(value, list):
                extra.extend(value)
            elif isinstance(value, dict):
                extra.extend(value.values())
        for value in extra:
            token = _added_token(value, special=True)
            if token is not None and self.backend.token_to_id(token.content) is None:
                self.backend.add_special_tokens([token])

    def __len__(self) -> int:
        """Size of the vocabulary, added tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)

    @property
    def eos_token(self) -> str | None:
        return self.special_tokens_map.get("eos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self.token_id(self.eos_token)

    @property
    def pad_token_id(self) -> int | None:
        return self.token_id(self.special_tokens_map.get("pad_token"))

    def convert_tokens_to_ids(self, token: str) -> int | None:
        """The id of ``token``; when it is not in the vocabulary, the unknown token's id (None
        when there is no unknown token)."""
        found = self.backend.token_to_id(token)
        if found is not None:
            return found
        return self.token_id(self.special_tokens_map.get("unk_token"))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not text:
            return []
        ids: list[int] = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[
            0
        ].ids
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text: str = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_spaces(text) if self._clean_up else text

    def to_str(self) -> str:
        """The full tokenizer definition (what tokenizer processes load)."""
        text: str = self.backend.to_str()
        return text
