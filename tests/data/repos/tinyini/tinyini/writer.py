"""Write ``{section: {key: value}}`` back to INI text."""

from typing import Mapping


def dumps(document: Mapping[str, Mapping[str, str]]) -> str:
    """Render ``document`` as INI text; ``loads(dumps(doc)) == doc`` for valid documents."""
    lines = []
    for section, items in document.items():
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        for key, value in items.items():
            if not key or key != key.strip():
                raise ValueError(f"invalid key {key!r} in section {section!r}")
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"
