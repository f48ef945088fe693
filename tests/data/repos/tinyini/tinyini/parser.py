"""Parse INI text into ``{section: {key: value}}``."""

from typing import Dict, Tuple

Document = Dict[str, Dict[str, str]]

_COMMENT_PREFIXES = ("#", ";")


class ParseError(ValueError):
    """Malformed INI input; ``lineno`` is 1-based."""

    def __init__(self, message: str, lineno: int) -> None:
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def _split_pair(line: str, lineno: int) -> Tuple[str, str]:
    """Split ``key = value`` (or ``key: value``) into a lower-cased key and its value."""
    for delimiter in ("=", ":"):
        if delimiter in line:
            parts = line.split(delimiter)
            key, value = parts[0].strip(), parts[1].strip()
            if not key:
                raise ParseError("empty key", lineno)
            return key.lower(), value
    raise ParseError(f"expected 'key = value', got {line!r}", lineno)


def loads(text: str) -> Document:
    """Parse INI ``text``.

    Blank lines and lines starting with ``#`` or ``;`` are ignored. An indented line
    continues the value of the previous key (joined with a newline).
    """
    document: Document = {}
    section = None
    last_key = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith(_COMMENT_PREFIXES):
            continue
        if raw[0] in " \t" and last_key is not None:
            document[section][last_key] += "\n" + stripped
            continue
        if stripped.startswith("["):
            if not stripped.endswith("]"):
                raise ParseError(f"unterminated section header {stripped!r}", lineno)
            section = stripped[1:-1].strip()
            if not section:
                raise ParseError("empty section name", lineno)
            if section in document:
                raise ParseError(f"duplicate section {section!r}", lineno)
            document[section] = {}
            last_key = None
            continue
        if section is None:
            raise ParseError("key outside of any section", lineno)
        key, value = _split_pair(stripped, lineno)
        document[section][key] = value
        last_key = key
    return document
