"""strkit: small, dependency-free string helpers."""

from strkit.case import (
    camel_case,
    constant_case,
    kebab_case,
    pascal_case,
    snake_case,
    split_words,
)
from strkit.text import count_words, normalize_whitespace, slugify, truncate

__version__ = "0.3.0"

__all__ = [
    "camel_case",
    "constant_case",
    "count_words",
    "kebab_case",
    "normalize_whitespace",
    "pascal_case",
    "slugify",
    "snake_case",
    "split_words",
    "truncate",
]
