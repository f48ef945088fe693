"""strkit: small, dependency-free string helpers."""

from strkit.case import (
    camel_case,
    constant_case,
    kebab_case,
    pascal_case,
    snake_case,
    split_words,
)

__version__ = "0.2.0"

__all__ = [
    "camel_case",
    "constant_case",
    "kebab_case",
    "pascal_case",
    "snake_case",
    "split_words",
]
