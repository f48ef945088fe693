"""A syntax check for unified diffs (gold and test patches of dataset rows).

``services`` may not import ``sandbox_worker`` (layering), so the loader cannot use the
evaluation's hunk-aware parser (``sandbox_worker.evaluation.patches``); this module checks only
what makes a diff unusable: no file header, a hunk before any file header, a malformed
``@@ -a,b +c,d @@`` line, a line inside a hunk that is not `` ``/``+``/``-``/``\\``, and a hunk
whose body is shorter or longer than its counts say (a truncated or hand-edited patch). Lines
between files (``diff --git``, ``index``, mode and rename lines) are not interpreted: ``git
apply`` does not need them to be anything in particular. A diff must end with a newline
(``git apply`` calls one that does not "corrupt").
"""

from __future__ import annotations

import re

_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def unified_diff_problem(text: str) -> str | None:
    """Why ``text`` is not a well-formed unified diff (naming the diff line), or None."""
    if text and not text.endswith("\n"):
        # git apply and patch reject a diff whose last line is cut (seen when a diff is read
        # through a stripping helper): the row's error, not a silent failing test later.
        return "the last diff line has no newline (a truncated diff: git apply calls it corrupt)"
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline ends the last line; it does not start an empty one
    saw_file = False
    position = 0
    while position < len(lines):
        line = lines[position]
        following = lines[position + 1] if position + 1 < len(lines) else ""
        if line.startswith("--- ") and following.startswith("+++ "):
            saw_file = True
            position += 2
            continue
        if line.startswith("@@"):
            if not saw_file:
                return f"diff line {position + 1}: hunk before any '--- '/'+++ ' file header"
            hunk_start = position
            problem, position = _skip_hunk(lines, position)
            if problem is None and _continues_hunk(lines, position):
                problem = f"diff line {hunk_start + 1}: hunk longer than its header says"
            if problem:
                return problem
            continue
        position += 1
    if not saw_file:
        return "no '--- '/'+++ ' file header"
    return None


def _skip_hunk(lines: list[str], start: int) -> tuple[str | None, int]:
    """(problem or None, index after the hunk) for the hunk whose header is ``lines[start]``."""
    header = _HUNK_HEADER.match(lines[start])
    if header is None:
        return f"diff line {start + 1}: malformed hunk header {lines[start][:80]!r}", start + 1
    old_left = 1 if header.group(1) is None else int(header.group(1))
    new_left = 1 if header.group(2) is None else int(header.group(2))
    position = start + 1
    while old_left > 0 or new_left > 0:
        if position >= len(lines):
            return f"diff line {start + 1}: truncated hunk {lines[start][:80]!r}", position
        marker = lines[position][:1]
        if marker in ("", " "):
            old_left, new_left = old_left - 1, new_left - 1
        elif marker == "-":
            old_left -= 1
        elif marker == "+":
            new_left -= 1
        elif marker != "\\":  # "\ No newline at end of file"
            return (
                f"diff line {position + 1}: {lines[position][:80]!r} inside a hunk "
                "(expected a line starting with ' ', '+', '-' or '\\')",
                position,
            )
        position += 1
    if old_left < 0 or new_left < 0:
        return f"diff line {start + 1}: hunk longer than its header says", position
    return None, position


def _continues_hunk(lines: list[str], position: int) -> bool:
    """Whether the line after a complete hunk is still a hunk body line (the counts are short)."""
    if position >= len(lines) or lines[position][:1] not in (" ", "+", "-"):
        return False
    following = lines[position + 1] if position + 1 < len(lines) else ""
    return not (lines[position].startswith("--- ") and following.startswith("+++ "))
