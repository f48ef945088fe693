"""Reverse a unified diff: the patch that undoes it (what ``git apply -R`` applies).

SWE-smith rows carry the diff that *introduces* their bug as ``patch``; the fix (the gold
patch, graded like SWE-bench's) is its reverse. Handled: ``git diff`` and plain unified diffs
with modified, added, deleted and renamed files, mode changes and ``\\ No newline at end of
file`` markers. Refused with :class:`ValueError`: binary patches and copies (their reverse is
not a patch of the same kind).
"""

from __future__ import annotations

import re

_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")
_SWAPPED_PAIRS = (
    ("new file mode ", "deleted file mode "),
    ("old mode ", "new mode "),
    ("rename from ", "rename to "),
)


def _swap_path(line: str, old_prefix: str, new_prefix: str) -> str:
    """``--- a/x`` <-> ``+++ b/x`` (``/dev/null`` kept as is)."""
    path = line[4:]
    if path.startswith("/dev/null"):
        return new_prefix + path
    for side in ("a/", "b/"):
        if path.startswith(side):
            other = "b/" if side == "a/" else "a/"
            return new_prefix + other + path[2:]
    return new_prefix + path


def _header_line(line: str) -> str:
    if line.startswith("diff --git "):
        parts = line[len("diff --git ") :].split(" ")
        if len(parts) == 2 and parts[0].startswith("a/") and parts[1].startswith("b/"):
            return f"diff --git a/{parts[1][2:]} b/{parts[0][2:]}"
        return line  # quoted or spaced paths: git apply reads the ---/+++ lines
    if line.startswith("index "):
        match = re.match(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)$", line)
        return f"index {match[2]}..{match[1]}{match[3]}" if match else line
    if line.startswith(("copy from ", "copy to ")):
        raise ValueError("cannot reverse a copy (its reverse is a deletion of the copy)")
    if line.startswith("GIT binary patch") or line.startswith("Binary files "):
        raise ValueError("cannot reverse a binary patch")
    for first, second in _SWAPPED_PAIRS:
        if line.startswith(first):
            return second + line[len(first) :]
        if line.startswith(second):
            return first + line[len(second) :]
    return line


def _reverse_change(lines: list[str]) -> list[str]:
    """A run of ``-``/``+`` lines (each with its ``\\`` marker): the old ``+`` lines become
    ``-`` lines and come first, as in a diff written the other way."""
    removed: list[str] = []
    added: list[str] = []
    target = removed
    for line in lines:
        if line.startswith("\\"):
            target.append(line)
            continue
        target = removed if line.startswith("+") else added
        target.append(("-" if line.startswith("+") else "+") + line[1:])
    return removed + added


def reverse_unified_diff(text: str) -> str:
    """The reverse of the unified diff ``text`` (see the module docstring)."""
    lines = text.split("\n")
    trailing = lines[-1] == ""
    if trailing:
        lines.pop()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.startswith("--- ") and nxt.startswith("+++ "):
            out += [_swap_path(nxt, "+++ ", "--- "), _swap_path(line, "--- ", "+++ ")]
            i += 2
            continue
        hunk = _HUNK.match(line)
        if hunk is None:
            out.append(_header_line(line))
            i += 1
            continue
        out.append(f"@@ -{hunk[2]} +{hunk[1]} @@{hunk[3]}")
        i += 1
        change: list[str] = []
        while i < len(lines) and (lines[i][:1] in ("+", "-", " ", "\\") or lines[i] == ""):
            body = lines[i]
            if body.startswith(("--- ", "+++ ")) and _starts_file(lines, i):
                break
            if body[:1] in ("+", "-") or (body.startswith("\\") and change):
                change.append(body)
            else:
                out += _reverse_change(change)
                change = []
                out.append(body)
            i += 1
        out += _reverse_change(change)
    return "\n".join(out) + ("\n" if trailing else "")


def _starts_file(lines: list[str], i: int) -> bool:
    """Whether ``lines[i]`` is a ``--- `` file header (followed by ``+++ ``), not a removed
    line that happens to start with ``-- ``."""
    return (
        lines[i].startswith("--- ")
        and i + 1 < len(lines)
        and lines[i + 1].startswith("+++ ")
        and (i + 2 >= len(lines) or lines[i + 2].startswith("@@"))
    )
