"""Typed access to a parsed INI document."""

from pathlib import Path
from typing import List, Union

from tinyini.parser import Document, loads

_MISSING = object()
_TRUE = ("1", "yes", "true", "on")
_FALSE = ("0", "no", "false", "off")


class Config:
    """A parsed INI document with typed getters. Keys are case-insensitive."""

    def __init__(self, document: Document) -> None:
        self._document = document

    @classmethod
    def from_string(cls, text: str) -> "Config":
        return cls(loads(text))

    @classmethod
    def from_file(cls, path: Union[str, Path]) -> "Config":
        return cls(loads(Path(path).read_text(encoding="utf-8")))

    def sections(self) -> List[str]:
        return list(self._document)

    def get(self, section: str, key: str, default: object = _MISSING) -> str:
        try:
            return self._document[section][key.lower()]
        except KeyError:
            if default is _MISSING:
                raise KeyError(f"no option {key!r} in section {section!r}") from None
            return default

    def getint(self, section: str, key: str, default: object = _MISSING) -> int:
        value = self.get(section, key, default)
        return value if value is default else int(value)

    def getfloat(self, section: str, key: str, default: object = _MISSING) -> float:
        value = self.get(section, key, default)
        return value if value is default else float(value)

    def getboolean(self, section: str, key: str, default: object = _MISSING) -> bool:
        """Accepts 1/yes/true/on and 0/no/false/off."""
        value = self.get(section, key, default)
        if value is default:
            return value
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ValueError(f"{section}.{key}: not a boolean: {value!r}")

    def getlist(self, section: str, key: str, sep: str = ",") -> List[str]:
        """Split a value on ``sep``, dropping blanks: ``"a, b,,c"`` -> ``["a", "b", "c"]``."""
        return [item.strip() for item in self.get(section, key).split(sep) if item.strip()]
