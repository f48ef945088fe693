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


# The strict parser (training rewards and the hardened verdict) -----------------------------
#
# ``git apply`` refuses paths in ``.git`` and writes through symlinks, but the harness's last
# fallback, GNU ``patch``, does not: it also takes file names from context-diff headers
# (``*** a/.git/config``), ``Index:`` lines and normal diffs, writes into ``.git`` (a
# ``core.fsmonitor`` in ``.git/config`` runs at the next git call) and through a symlink the
# same patch creates. Training rewards therefore accept only what ``git diff`` writes, parsed
# here by one grammar, with every path checked, and apply it with ``git apply`` alone.

_EXTENDED = re.compile(
    r"^(?:old mode|new mode|deleted file mode|new file mode) [0-7]{6}$"
    r"|^(?:similarity|dissimilarity) index \d{1,3}%$"
    r"|^index [0-9a-f]{4,64}\.\.[0-9a-f]{4,64}(?: [0-7]{6})?$"
)
_RENAME_COPY = ("rename from ", "rename to ", "copy from ", "copy to ")
_BINARY_SECTION = re.compile(r"^(?:literal|delta) \d+$")
_BASE85_LINE = re.compile(r"^[A-Za-z][0-9A-Za-z!#$%&()*+;<=>?@^_`{|}~-]+$")
_SYMLINK_MODE = re.compile(r"^(?:new file mode|new mode) 120000$|^index \S+ 120000$")
_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


class PatchRefused(ValueError):
    """The patch is not a git-format unified diff swerl accepts for a training reward."""


@dataclass(frozen=True)
class GitFilePatch:
    """One ``diff --git`` block: every path it names, and whether it makes a symlink."""

    old: str  # repository-relative, or DEV_NULL
    new: str
    paths: tuple[str, ...]  # every name the block carries (headers, renames, copies)
    makes_symlink: bool
    binary: bool
    hunks: int


def parse_git_patch(patch: str) -> list[GitFilePatch]:
    """Parse ``patch`` as ``git diff --binary`` output, or raise :class:`PatchRefused`.

    The grammar is git's: each file is a ``diff --git a/X b/Y`` line, git's extended header
    lines, then either a ``---``/``+++`` pair and hunks whose line counts add up, a ``GIT binary
    patch`` (base85 ``literal``/``delta`` sections), a ``Binary files ... differ`` line, or
    nothing (a mode change, a pure rename, an empty new file). Any other line, anywhere, is a
    refusal: no preamble, no context diff, no ``Index:`` line, no normal diff."""
    lines = patch.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        raise PatchRefused("the patch is empty")
    files: list[GitFilePatch] = []
    index = 0
    while index < len(lines):
        if not lines[index].startswith("diff --git "):
            raise PatchRefused(
                f"line {index + 1}: expected 'diff --git', got {lines[index][:80]!r}"
            )
        index, block = _read_git_block(lines, index)
        files.append(block)
    return files


def _read_git_block(lines: list[str], index: int) -> tuple[int, GitFilePatch]:
    header = lines[index]
    names = _git_header_names(header[len("diff --git ") :])
    if len(names) != 2:
        raise PatchRefused(f"line {index + 1}: cannot read two names from {header[:120]!r}")
    old, new = names
    paths = [old, new]
    makes_symlink = False
    new_file = deleted = False
    index += 1
    while index < len(lines) and (
        _EXTENDED.match(lines[index]) or lines[index].startswith(_RENAME_COPY)
    ):
        line = lines[index]
        if line.startswith(_RENAME_COPY):
            raw = line.split(" ", 2)[2]
            paths.append(_unquote(raw) if raw.startswith('"') else raw)
        makes_symlink |= bool(_SYMLINK_MODE.match(line))
        new_file |= line.startswith("new file mode")
        deleted |= line.startswith("deleted file mode")
        index += 1
    binary = False
    hunks = 0
    if index < len(lines) and lines[index].startswith("--- "):
        if index + 1 >= len(lines) or not lines[index + 1].startswith("+++ "):
            raise PatchRefused(f"line {index + 1}: '---' without '+++'")
        minus = _strict_header_path(lines[index][4:])
        plus = _strict_header_path(lines[index + 1][4:])
        if minus != (DEV_NULL if new_file else old) or plus != (DEV_NULL if deleted else new):
            raise PatchRefused(
                f"line {index + 1}: the ---/+++ names ({minus!r}, {plus!r}) disagree with "
                f"'diff --git' ({old!r}, {new!r})"
            )
        index += 2
        while index < len(lines) and lines[index].startswith("@@"):
            try:
                index, _ = _read_hunk(lines, index)
            except PatchParseError as exc:
                raise PatchRefused(str(exc)) from None
            hunks += 1
        if hunks == 0:
            raise PatchRefused(f"line {index + 1}: a file header without any hunk")
    elif index < len(lines) and lines[index] == "GIT binary patch":
        index, binary = _read_binary(lines, index + 1), True
    elif index < len(lines) and lines[index].startswith("Binary files "):
        index, binary = index + 1, True
    return index, GitFilePatch(
        DEV_NULL if new_file else old,
        DEV_NULL if deleted else new,
        tuple(paths),
        makes_symlink,
        binary,
        hunks,
    )


def _read_binary(lines: list[str], index: int) -> int:
    """Skip one or two base85 sections (forward, then reverse) of a ``GIT binary patch``."""
    for section in range(2):
        if index >= len(lines) or not _BINARY_SECTION.match(lines[index]):
            if section == 0:
                raise PatchRefused(f"line {index + 1}: a binary patch without a literal/delta")
            return index
        index += 1
        while index < len(lines) and lines[index] != "":
            if not _BASE85_LINE.match(lines[index]):
                raise PatchRefused(f"line {index + 1}: not a base85 line of a binary patch")
            index += 1
        index += 1  # the blank line closing the section
    return index


def _strict_header_path(raw: str) -> str:
    """A ``---``/``+++`` name as git writes it: ``a/x`` or ``b/x`` (swapped by ``git diff
    -R``; quoted when unusual), or ``/dev/null``."""
    name = raw[:-1] if raw.endswith("\t") else raw  # git adds a tab after names with spaces
    name = _unquote(name) if name.startswith('"') else name
    if name == DEV_NULL:
        return DEV_NULL
    if not name.startswith(("a/", "b/")):
        raise PatchRefused(f"the name {raw!r} lacks git's a/ or b/ prefix")
    return name[2:]


def strict_patch_refusal(patch: str) -> str | None:
    """Why a training reward refuses ``patch`` (not git's format, or a path that leaves the
    working tree's ordinary files), or None when it is accepted.

    Every name is checked: not empty or absolute, no ``..``, no ``.git`` component in any
    letter case (``.GIT`` is the same directory on a case-insensitive filesystem and git
    refuses it too), no NUL or other control character, and nothing under a symlink the same
    patch creates. Writes through symlinks already in the tree are ``git apply``'s refusal
    ("beyond a symbolic link"), the only applier of strict patches."""
    try:
        files = parse_git_patch(patch)
    except PatchRefused as exc:
        return f"not a git-format unified diff: {exc}"
    symlinks = {_normalized(f.new) for f in files if f.makes_symlink}
    for block in files:
        for path in block.paths:
            if why := _unsafe_path(path, symlinks):
                return why
    return None


def _unsafe_path(path: str, symlinks: set[str]) -> str | None:
    if path == DEV_NULL:
        return None
    if not path or path.startswith("/"):
        return f"the patch names an absolute or empty path ({path!r})"
    if any(ord(char) < 32 or ord(char) == 127 for char in path):
        return f"the patch names a path with a control character ({path!r})"
    parts = _normalized(path).split("/")
    if any(part.lower() == ".git" for part in parts):
        return f"the patch writes into .git ({path!r})"
    if ".." in parts:
        return f"the patch leaves the repository ({path!r})"
    for depth in range(1, len(parts)):
        if "/".join(parts[:depth]) in symlinks:
            return f"the patch writes through a symlink it creates ({path!r})"
    return None


def patch_names_git_dir(patch: str) -> bool:
    """Whether any line a patch tool could read as a file name names ``.git`` in any letter
    case (a tamper flag for the harness's lenient cascade, whose GNU ``patch`` also reads
    context-diff ``***`` and ``Index:`` names)."""
    starts = ("diff ", "--- ", "+++ ", "*** ", "Index: ", "rename ", "copy ", "Prereq: ")
    for line in patch.split("\n"):
        if line.startswith(starts):
            text = _QUOTED.sub(lambda m: _unquote(m.group(0)), line)
            if _GIT_COMPONENT.search(text):
                return True
    return False


_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
_GIT_COMPONENT = re.compile(r"(?:^|[/\s])\.git(?:[/\s]|$)", re.IGNORECASE)


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
            other = " a/" if rest.startswith("b/") else " b/"  # `git diff -R` swaps them
            cut = rest.find(other) if not names else -1
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
