"""Read the file list of a unified diff (git or plain), hunk-aware.

The evaluation needs, for the test patch: the files it *modifies* (restored to the base commit
before the test patch is applied, so an agent cannot tamper with them), the files it *creates*
(removed first), and the test files to run. Parsing follows hunk line counts, so a removed line
that happens to start with ``--`` is never mistaken for a file header (the harness uses
``unidiff`` for this; the comparison tests check that both agree).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sandbox_worker.evaluation.constants import NON_TEST_EXTS

DEV_NULL = "/dev/null"
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_GIT_HEADER = re.compile(r"^diff --git a/(.*) b/(.*)$")
_DIRECTIVE = re.compile(r"diff --git a/.* b/(.*)")


class PatchParseError(ValueError):
    """The text is not a well-formed unified diff."""


@dataclass(frozen=True)
class Hunk:
    """One ``@@ -old_start,old_len +new_start,new_len @@`` hunk and its body lines."""

    header: str
    old_start: int
    old_len: int
    lines: tuple[str, ...]

    def old_lines(self) -> list[str]:
        """The hunk's lines as they are before the patch (context and removed lines)."""
        return [line[1:] for line in self.lines if line[:1] in (" ", "-", "")]


@dataclass(frozen=True)
class PatchedFile:
    """One file of a diff; ``source``/``target`` are repo-relative or :data:`DEV_NULL`."""

    source: str
    target: str
    hunks: tuple[Hunk, ...] = ()

    @property
    def is_new(self) -> bool:
        return self.source == DEV_NULL


def is_empty_patch(patch: str | None) -> bool:
    return patch is None or not patch.strip()


def patched_files(patch: str) -> list[PatchedFile]:
    """The files of ``patch`` in order of appearance."""
    files: list[PatchedFile] = []
    source: str | None = None
    target: str | None = None
    hunks: list[Hunk] = []
    in_git_block = False  # inside a ``diff --git`` block whose ---/+++ pair is still due
    lines = patch.split("\n")

    def close() -> None:
        if source is not None and target is not None:
            files.append(PatchedFile(source, target, tuple(hunks)))

    index = 0
    while index < len(lines):
        line = lines[index]
        git = _GIT_HEADER.match(line)
        if git:
            close()
            source, target, hunks, in_git_block = git.group(1), git.group(2), [], True
        elif in_git_block and line.startswith("new file mode"):
            source = DEV_NULL
        elif in_git_block and line.startswith("deleted file mode"):
            target = DEV_NULL
        elif (
            line.startswith("--- ")
            and index + 1 < len(lines)
            and lines[index + 1].startswith("+++ ")
        ):
            if not in_git_block:
                close()  # a plain diff: one ---/+++ pair per file
                hunks = []
            source, target = _header_path(line[4:]), _header_path(lines[index + 1][4:])
            in_git_block = False
            index += 1
        elif line.startswith("@@"):
            if source is None:
                raise PatchParseError(f"hunk before any file header: {line!r}")
            index, hunk = _read_hunk(lines, index)
            hunks.append(hunk)
            continue
        index += 1
    close()
    return files


def _header_path(raw: str) -> str:
    """``a/foo.py\\t2024-01-01`` -> ``foo.py``; ``/dev/null`` stays."""
    path = raw.split("\t", 1)[0].strip()
    if path.startswith('"') and path.endswith('"'):
        path = path[1:-1]
    if path == DEV_NULL:
        return DEV_NULL
    return path[2:] if path.startswith(("a/", "b/")) else path


def _read_hunk(lines: list[str], index: int) -> tuple[int, Hunk]:
    """The hunk whose header is at ``index`` and the index of the line after it."""
    header = lines[index]
    match = _HUNK.match(header)
    if not match:
        raise PatchParseError(f"malformed hunk header: {header!r}")
    old_start = int(match.group(1))
    old_len = int(match.group(2)) if match.group(2) is not None else 1
    old = old_len
    new = int(match.group(4)) if match.group(4) is not None else 1
    body: list[str] = []
    index += 1
    while (old > 0 or new > 0) and index < len(lines):
        line = lines[index]
        tag = line[:1]
        if tag == "-":
            old -= 1
        elif tag == "+":
            new -= 1
        elif tag in (" ", ""):
            old -= 1
            new -= 1
        elif tag != "\\":  # "\ No newline at end of file" belongs to the hunk
            raise PatchParseError(f"unexpected line inside a hunk: {line!r}")
        body.append(line)
        index += 1
    if old > 0 or new > 0:
        raise PatchParseError(f"truncated hunk: {header!r}")
    while index < len(lines) and lines[index].startswith("\\"):
        body.append(lines[index])
        index += 1
    return index, Hunk(header, old_start, old_len, tuple(body))


def modified_files(patch: str) -> list[str]:
    """Files the patch changes or deletes (they exist at the base commit)."""
    return [f.source for f in patched_files(patch) if not f.is_new]


def new_files(patch: str) -> list[str]:
    """Files the patch creates."""
    return [f.target for f in patched_files(patch) if f.is_new]


def directives_of_test_patch(test_patch: str) -> list[str]:
    """Test files to run: the targets of the test patch without data files (harness rule)."""
    directives = _DIRECTIVE.findall(test_patch)
    return [d for d in directives if not any(d.endswith(ext) for ext in NON_TEST_EXTS)]


def files_of_test_ids(test_ids: list[str]) -> list[str]:
    """``tests/a.py::T::t[x]`` -> ``tests/a.py``: the files of pytest node ids, in order."""
    files = [test_id.split("::", 1)[0] for test_id in test_ids if "::" in test_id]
    return list(dict.fromkeys(files))


_SYMLINK_MODE = re.compile(r"^(?:new file mode|new mode) 120000\s*$")
_PATH_HEADERS = ("--- ", "+++ ", "rename from ", "rename to ", "copy from ", "copy to ")
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def unsafe_patch_reason(patch: str) -> str | None:
    """Why applying ``patch`` could write outside the working tree's files, or None.

    ``git apply`` refuses such patches, but the harness's last fallback, GNU ``patch``, writes
    into ``.git/`` (a ``core.fsmonitor`` in ``.git/config`` runs a command at the next git
    call) and through a symlink created by the same patch (``vendored -> /usr/lib/python3``,
    then ``vendored/x.pth``). Names are read from every header ``patch`` or git use, quoted
    names unescaped."""
    paths: list[str] = []
    symlinks: set[str] = set()
    current: str | None = None
    for line in patch.split("\n"):
        if line.startswith("diff --git "):
            names = _git_header_names(line[len("diff --git ") :])
            paths += names
            current = names[-1] if names else None
        elif _SYMLINK_MODE.match(line) and current is not None:
            symlinks.add(_normalized(current))
        elif line.startswith(_PATH_HEADERS):
            header = next(h for h in _PATH_HEADERS if line.startswith(h))
            raw = line[len(header) :].split("\t", 1)[0].strip()
            name = _unquote(raw) if raw.startswith('"') else raw
            if header in ("--- ", "+++ ") and name != DEV_NULL:
                name = name[2:] if name.startswith(("a/", "b/")) else name
            paths.append(name)
    for path in paths:
        if path == DEV_NULL:
            continue
        parts = _normalized(path).split("/")
        if ".git" in parts:
            return f"the patch writes into .git ({path!r})"
        if ".." in parts:
            return f"the patch leaves the repository ({path!r})"
        for depth in range(1, len(parts)):
            if "/".join(parts[:depth]) in symlinks:
                return f"the patch writes through a symlink it creates ({path!r})"
    return None


def _normalized(path: str) -> str:
    return "/".join(p for p in path.split("/") if p not in ("", "."))


def _git_header_names(rest: str) -> list[str]:
    """``a/x b/y`` (or quoted) -> ``["x", "y"]``."""
    names: list[str] = []
    while rest:
        rest = rest.lstrip(" ")
        if rest.startswith('"'):
            end = 1
            while end < len(rest) and rest[end] != '"':
                end += 2 if rest[end] == "\\" else 1
            names.append(_unquote(rest[: end + 1]))
            rest = rest[end + 1 :]
        else:
            cut = rest.find(" b/") if not names else -1
            token, rest = (rest, "") if cut < 0 else (rest[:cut], rest[cut:])
            names.append(token)
    return [n[2:] if n.startswith(("a/", "b/")) else n for n in names]


def _unquote(quoted: str) -> str:
    """A git/GNU-patch C-style quoted name (``"a/\\056git"``) -> its text."""
    body = quoted[1:-1] if quoted.endswith('"') and len(quoted) > 1 else quoted[1:]
    out = bytearray()
    index = 0
    while index < len(body):
        char = body[index]
        if char != "\\" or index + 1 == len(body):
            out += char.encode()
            index += 1
            continue
        nxt = body[index + 1]
        if nxt in "01234567":
            digits = re.match(r"[0-7]{1,3}", body[index + 1 :])
            assert digits is not None
            out.append(int(digits.group(0), 8) & 0xFF)
            index += 1 + len(digits.group(0))
        else:
            out += _C_ESCAPES.get(nxt, nxt).encode()
            index += 2
    return out.decode("utf-8", "surrogateescape")
