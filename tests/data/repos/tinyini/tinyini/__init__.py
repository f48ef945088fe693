"""tinyini: a tiny INI reader and writer."""

from tinyini.config import Config
from tinyini.parser import ParseError, loads
from tinyini.writer import dumps

__version__ = "0.5.1"

__all__ = ["Config", "ParseError", "dumps", "loads"]
