"""tinyini: a tiny INI reader."""

from tinyini.parser import ParseError, loads

__version__ = "0.3.0"

__all__ = ["ParseError", "loads"]
