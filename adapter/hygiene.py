"""Input hygiene at the HTTP boundary: what Python accepts but the adapter must refuse with a 4xx.

Python's ``json`` module decodes more than the adapter can safely carry further:

* lone UTF-16 surrogates (``"\\ud800"``): valid JSON escapes, but not Unicode; the tokenizer,
  Redis and the JSON answer would fail on them later (a 500 and a dropped connection);
* ``NaN`` / ``Infinity`` and numbers that overflow to ``inf``: not JSON at all, and an answer
  that echoes one cannot be serialised;
* integers longer than Python's digit limit (a ``ValueError``, not a ``JSONDecodeError``);
* deep nesting: past ~1,000 levels the decoder raises ``RecursionError``, and below that the
  validators, the store and the answer recurse again. Bodies are bounded to
  :data:`MAX_JSON_DEPTH` levels, far above any real request (a chat request with nested tool
  schemas is ~10 levels deep).

:func:`decode_json` turns each of these into an :class:`APIError` 400 naming the problem (and,
where there is one, the path in the body).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from adapter.errors import APIError

MAX_JSON_DEPTH = 64
# A \uD800-\uDFFF escape, or a surrogate encoded as UTF-8 bytes (json decodes bytes with
# "surrogatepass"), somewhere in the raw body: only then are strings searched for lone
# surrogates (paired escapes, which json decodes into one character, also match; that only
# costs the search).
_SURROGATE_IN_RAW = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} overflows a 64-bit float")
    return value


def _path(parts: list[str | int]) -> str:
    return ".".join(str(p) for p in parts) or "body"


def _check_tree(value: Any, check_strings: bool) -> None:
    """Depth bound and (if asked) lone surrogates, iteratively (no recursion on hostile input)."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            items: Any = node.items()
        elif isinstance(node, list):
            items = enumerate(node)
        else:
            if check_strings and isinstance(node, str) and _SURROGATE.search(node):
                raise APIError(
                    400,
                    f"{_path(path)}: the string contains a lone UTF-16 surrogate (such as "
                    "\\ud800), which is not valid Unicode",
                    code="invalid_json",
                    param=str(path[0]) if path else None,
                )
            continue
        if len(path) >= MAX_JSON_DEPTH:
            raise APIError(
                400,
                f"request body is nested more than {MAX_JSON_DEPTH} levels deep (at "
                f"{_path(path[:8])}...)",
                code="invalid_json",
                param=str(path[0]) if path else None,
            )
        for key, child in items:
            if check_strings and isinstance(key, str) and _SURROGATE.search(key):
                raise APIError(
                    400,
                    f"{_path(path)}: a key contains a lone UTF-16 surrogate, which is not "
                    "valid Unicode",
                    code="invalid_json",
                    param=str(path[0]) if path else None,
                )
            stack.append((child, [*path, key]))


def decode_json(raw: bytes) -> Any:
    """Decode a request body; every problem is an APIError 400 (``code="invalid_json"``)."""
    try:
        value = json.loads(raw, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise APIError(
            400,
            f"request body is nested too deeply (more than {MAX_JSON_DEPTH} levels allowed)",
            code="invalid_json",
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise APIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    _check_tree(value, check_strings=_SURROGATE_IN_RAW.search(raw) is not None)
    return value
