"""Helpers for free text: whitespace, truncation, word counts and URL slugs."""

import re

_WHITESPACE = re.compile(r"\s+")
_SLUG_WORD = re.compile(r"[a-z0-9]+")
_WORD = re.compile(r"\b\w+(?:'\w+)?\b")


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace to a single space and strip both ends."""
    return _WHITESPACE.sub(" ", text).strip()


def count_words(text: str) -> int:
    """Count the words in ``text``; contractions such as "don't" count once."""
    return len(_WORD.findall(text))


def truncate(text: str, width: int, suffix: str = "...") -> str:
    """Shorten ``text`` to at most ``width`` characters, ending with ``suffix`` if cut.

    Text that already fits is returned unchanged.
    """
    if width < 0:
        raise ValueError(f"width must be >= 0, got {width}")
    if len(text) <= width:
        return text
    return text[:width] + suffix


def slugify(text: str, sep: str = "-") -> str:
    """Turn a title into a lower-case URL slug: ``"Hello, World!"`` -> ``"hello-world"``."""
    if not sep:
        raise ValueError("sep must not be empty")
    return sep.join(_SLUG_WORD.findall(text.lower()))
