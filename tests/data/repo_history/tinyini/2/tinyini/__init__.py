"""tinyini: a tiny INI reader and writer."""

from tinyini.parser import ParseError, loads
from tinyini.writer import dumps

__version__ = "0.4.0"

__all__ = ["ParseError", "dumps", "loads"]
