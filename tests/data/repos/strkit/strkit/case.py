"""Conversions between identifier naming styles.

Every converter first splits its input into lower-case words with :func:`split_words`, so
``"parseJSONResponse"``, ``"parse_json_response"`` and ``"parse-json-response"`` all convert
the same way.
"""

import re

# Characters that always separate words.
_SEPARATORS = re.compile(r"[\s_\-.]+")
# Boundaries inside a word: lower/digit -> upper ("camelCase") and inside runs of capitals.
_CASE_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z])")


def split_words(name: str) -> list:
    """Split an identifier or phrase into its lower-case words."""
    spaced = _SEPARATORS.sub(" ", name)
    spaced = _CASE_BOUNDARY.sub(" ", spaced)
    return [word.lower() for word in spaced.split()]


def snake_case(name: str) -> str:
    """``"parseJsonResponse"`` -> ``"parse_json_response"``."""
    return "_".join(split_words(name))


def kebab_case(name: str) -> str:
    """``"parseJsonResponse"`` -> ``"parse-json-response"``."""
    return "-".join(split_words(name))


def constant_case(name: str) -> str:
    """``"parseJsonResponse"`` -> ``"PARSE_JSON_RESPONSE"``."""
    return snake_case(name).upper()


def pascal_case(name: str) -> str:
    """``"parse_json_response"`` -> ``"ParseJsonResponse"``."""
    return "".join(word.capitalize() for word in split_words(name))


def camel_case(name: str) -> str:
    """``"parse_json_response"`` -> ``"parseJsonResponse"``."""
    words = split_words(name)
    if not words:
        return ""
    return words[0] + "".join(word.capitalize() for word in words[1:])
