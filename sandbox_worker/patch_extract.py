"""The agent's patch, taken on the host from a snapshot of its tree with a git it cannot configure.

Why not ``git diff`` inside the agent's sandbox: everything that git reads there is the agent's
to write. ``.git/config`` (``diff.external``, ``diff.<driver>.textconv``, ``filter.<x>.clean``,
``core.fsmonitor``, ``core.hooksPath``, ``include.path``, aliases), ``.git/info/attributes``, the
index (``assume-unchanged`` bits), replace refs, the commit-graph (which names a commit's tree),
``commondir`` and ``objects/info/alternates``, even ``.git`` itself (a ``gitdir:`` file): with any
of them the agent chooses the patch text, for example one that writes files it never changed.

So the worker copies the working tree out (``Sandbox.copy_out``: a tar stream extracted with the
``tar`` filter, symlinks stored as symlinks, never followed) into a private host directory and
builds a *trusted* git directory next to it, which keeps nothing of the agent's but object files:

* ``.git`` must be a real directory holding a real ``objects`` directory (else the agent broke
  its repository: :class:`PatchRefusedError`, graded 0);
* only loose objects (``xx/<hex>``) and packs (``pack/pack-<hex>.pack|idx``) that are regular
  files are kept; alternates, commit-graphs, multi-pack indexes, bitmaps, promisor files, refs,
  hooks, config, index, ``info/attributes``, grafts and ``commondir`` are dropped;
* ``HEAD`` is the pinned base commit, ``config`` a minimal one written here (the object format
  follows the base commit's length), ``info/exclude`` the only file copied (ignore patterns: they
  can only hide the agent's own new files from its patch);
* every nested ``.git`` (a submodule or a repository the agent made) and every special file
  (fifo, socket, device) is removed from the snapshot, so that no git runs in a directory whose
  configuration the agent wrote (``git add`` checks submodules by running git in them).

The host's git then runs with no system, global or repository configuration of the agent's
(``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``, an empty ``HOME``), a fresh index read
from the base tree, and ``core.fsmonitor``, ``core.hooksPath`` and ``core.attributesFile`` pinned
on its command line; ``--no-ext-diff --no-textconv`` on the diff. In-tree ``.gitattributes`` still
apply (``binary``, ``text``/``eol``, ``diff=python`` hunk headers: git's built-ins, as in the
sandbox), but a ``filter=`` or ``diff=`` driver that no trusted configuration defines runs nothing.
The output is byte-identical to the old in-sandbox ``git add -A && git diff --cached --binary``
on an honest tree (tests/integration/sandbox_worker/test_patch_extract.py compares them).

A patch longer than ``max_bytes`` is never truncated: git is stopped as soon as its output passes
the cap and :class:`PatchTooLargeError` says so (the runner grades it 0 with that reason).

Attribution (the runner's): a :class:`PatchRefusedError` is the policy's doing (its tree or
repository), graded 0 with the reason; :class:`HostExtractionError` is this host's failure (no
git, host disk full), an infrastructure abort; errors of ``copy_out`` itself are left to the
caller, which asks whether the sandbox still answers.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sandbox_worker.backends.base import DiskQuotaError, Sandbox

MIB = 1024 * 1024
# The default cap of one patch. Far above any honest SWE patch (the largest gold patch of
# SWE-bench Verified is ~0.2 MiB), far below the adapter's close-body limit once JSON-escaped.
DEFAULT_MAX_PATCH_BYTES = 2 * MIB
# The highest cap the worker accepts: JSON may escape a patch byte into 6 (``\\u0001``), so a
# 4 MiB patch is at most 24 MiB in the close body, under the adapter's 64 MiB close limit
# (``adapter.max_close_body_bytes``); and under the 8 MiB exec output cap, which no longer
# matters here (the patch never travels through ``exec``) but did for the old in-sandbox diff.
MAX_PATCH_BYTES_LIMIT = 4 * MIB
DEFAULT_GIT_TIMEOUT_S = 300.0
# info/exclude larger than this is dropped (honest ones are a few lines).
_MAX_EXCLUDE_BYTES = 1 * MIB
# Host-side resource failures: the node's, not the policy's (its tree is bounded by its quota).
_MIN_FREE_BYTES = 64 * MIB
_MIN_FREE_INODES = 1024
_HOST_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EMFILE, errno.ENFILE})

_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_LOOSE_DIR = re.compile(r"[0-9a-f]{2}")
_LOOSE_FILE = re.compile(r"[0-9a-f]{38}|[0-9a-f]{62}")
_PACK_FILE = re.compile(r"pack-[0-9a-f]{40,64}\.(?:pack|idx)")

# Configuration pinned on the command line: wins over anything left in a configuration file
# (there is none of the agent's) and is passed on to any git child process.
_PINNED_CONFIG = (
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.untrackedCache=false",
    "core.splitIndex=false",
    "core.sparseCheckout=false",
    "core.quotePath=false",
    "core.fileMode=false",
    "core.symlinks=true",
    "core.autocrlf=false",
    "core.safecrlf=false",
    "submodule.recurse=false",
    "protocol.allow=never",
)
_DIFF_FLAGS = ("--no-color", "--no-ext-diff", "--no-textconv", "--binary")


class PatchRefusedError(Exception):
    """No patch can be taken from the tree the agent left (the policy's doing: graded 0).

    ``code`` is a stable reason (``git_dir_invalid``, ``base_unavailable``, ``git_failed``,
    ``workdir_missing``, ``git_timeout``, ``patch_too_large``); ``detail`` says what was found.
    """

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class PatchTooLargeError(PatchRefusedError):
    """The patch is longer than the worker's cap (never truncated)."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            "patch_too_large",
            f"the patch is longer than the worker's cap of {limit} bytes "
            "(worker.rollout.max_patch_bytes); a longer patch is never truncated",
        )
        self.limit = limit


class HostExtractionError(RuntimeError):
    """This host could not extract the patch (no git, host disk or memory exhausted)."""


@dataclass(frozen=True)
class _Layout:
    """Where one extraction's files live on the host (all inside one private temp dir)."""

    root: Path
    tree: Path  # the snapshot of the working tree (its .git removed)
    git_dir: Path  # the trusted git dir built from the snapshot's objects
    index: Path  # the fresh index
    home: Path  # an empty HOME / XDG_CONFIG_HOME


def validate_base(base_commit: str) -> str:
    """The base must be a full commit id (the runner pins one at the start): a name (``HEAD``,
    a branch) would be resolved by refs the agent wrote."""
    if not isinstance(base_commit, str) or not _FULL_SHA.fullmatch(base_commit):
        raise ValueError(f"invalid base commit {base_commit!r}: a full 40- or 64-hex id")
    return base_commit


def extract_patch(
    sandbox: Sandbox,
    base_commit: str,
    workdir: str,
    *,
    max_bytes: int = DEFAULT_MAX_PATCH_BYTES,
    scratch_root: Path | None = None,
    timeout_s: float = DEFAULT_GIT_TIMEOUT_S,
) -> str:
    """The patch of ``workdir`` in ``sandbox`` against ``base_commit`` (see the module doc).

    Raises :class:`PatchRefusedError` (the agent's tree), :class:`HostExtractionError` (this
    host), and lets ``copy_out``'s own errors (``SandboxInfraError``, ``OSError``) through for
    the caller to attribute by asking whether the sandbox still answers.
    """
    validate_base(base_commit)
    with tempfile.TemporaryDirectory(prefix="swerl-patch-", dir=scratch_root) as tmp:
        tree = Path(tmp) / "tree"
        _snapshot(sandbox, workdir, tree)
        return diff_snapshot(tree, base_commit, Path(tmp), max_bytes=max_bytes, timeout_s=timeout_s)


def _snapshot(sandbox: Sandbox, workdir: str, dest: Path) -> None:
    """Copy the working tree out; a missing one is the agent's doing, a full host disk not."""
    try:
        sandbox.copy_out(workdir, dest)
    except FileNotFoundError as exc:
        raise PatchRefusedError("workdir_missing", f"{workdir}: {exc}") from exc
    except DiskQuotaError:  # the sandbox's own quota: let the caller attribute it
        raise
    except MemoryError as exc:
        raise HostExtractionError(f"copying {workdir} out: out of memory") from exc
    except OSError as exc:
        if exc.errno in _HOST_ERRNOS:
            raise HostExtractionError(f"copying {workdir} out: {exc}") from exc
        raise


def diff_snapshot(
    tree: Path,
    base_commit: str,
    scratch: Path,
    *,
    max_bytes: int = DEFAULT_MAX_PATCH_BYTES,
    timeout_s: float = DEFAULT_GIT_TIMEOUT_S,
) -> str:
    """The patch of the host copy ``tree`` (consumed: its ``.git`` is taken apart) against
    ``base_commit``; ``scratch`` is a private directory for the trusted git dir and index."""
    validate_base(base_commit)
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
    layout = _Layout(scratch, tree, scratch / "git", scratch / "index", scratch / "home")
    _require_real_dir(tree, "the working tree")
    try:
        _build_git_dir(tree / ".git", layout.git_dir, base_commit)
        _clear_snapshot(tree)
        layout.home.mkdir(exist_ok=True)
    except OSError as exc:
        if exc.errno in _HOST_ERRNOS:
            raise HostExtractionError(f"preparing the snapshot: {exc}") from exc
        raise PatchRefusedError("git_dir_invalid", f"cannot read the snapshot: {exc}") from exc
    git = _HostGit(layout, timeout_s)
    res = git.run(["read-tree", base_commit])
    if res.code != 0:
        raise PatchRefusedError(
            "base_unavailable",
            f"base commit {base_commit} is not in the repository the agent "
            f"left ({res.stderr[-400:].strip()})",
        )
    res = git.run(["add", "-A"])
    if res.code != 0:
        raise PatchRefusedError("git_failed", f"git add: {res.stderr[-400:]}")
    out = git.run(["diff", "--cached", *_DIFF_FLAGS, base_commit], max_stdout=max_bytes)
    if out.too_large:
        raise PatchTooLargeError(max_bytes)
    if out.code != 0:
        raise PatchRefusedError("git_failed", f"git diff: {out.stderr[-400:]}")
    return out.stdout.decode("utf-8", "replace")


def _require_real_dir(path: Path, what: str) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        raise PatchRefusedError("git_dir_invalid", f"{what} is missing") from None
    if not stat.S_ISDIR(mode):
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a directory"
        raise PatchRefusedError("git_dir_invalid", f"{what} is {kind}")


def _build_git_dir(agent_git: Path, git_dir: Path, base_commit: str) -> None:
    """A git dir that keeps only the object files of ``agent_git`` (see the module doc)."""
    _require_real_dir(agent_git, "the repository's .git")
    _require_real_dir(agent_git / "objects", ".git/objects")
    (git_dir / "refs" / "heads").mkdir(parents=True)
    (git_dir / "refs" / "tags").mkdir()
    (git_dir / "info").mkdir()
    (git_dir / "HEAD").write_text(f"{base_commit}\n")
    (git_dir / "config").write_text(_trusted_config(base_commit))
    _adopt_objects(agent_git / "objects", git_dir / "objects")
    exclude = agent_git / "info" / "exclude"
    if _is_regular(exclude) and exclude.lstat().st_size <= _MAX_EXCLUDE_BYTES:
        shutil.copyfile(exclude, git_dir / "info" / "exclude", follow_symlinks=False)


def _trusted_config(base_commit: str) -> str:
    if len(base_commit) == 64:
        return (
            "[core]\n\trepositoryformatversion = 1\n\tbare = false\n"
            "[extensions]\n\tobjectformat = sha256\n"
        )
    return "[core]\n\trepositoryformatversion = 0\n\tbare = false\n"


def _adopt_objects(source: Path, dest: Path) -> None:
    """Move loose objects and packs (regular files with object-store names) into ``dest``."""
    dest.mkdir()
    (dest / "pack").mkdir()
    with os.scandir(source) as entries:
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            if _LOOSE_DIR.fullmatch(entry.name):
                _adopt_dir(Path(entry.path), dest / entry.name, _LOOSE_FILE)
            elif entry.name == "pack":
                _adopt_files(Path(entry.path), dest / "pack", _PACK_FILE)


def _adopt_dir(source: Path, dest: Path, names: re.Pattern[str]) -> None:
    """Drop what does not belong in ``source``, then move the whole directory (one rename)."""
    with os.scandir(source) as entries:
        for entry in entries:
            if not (names.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)):
                _remove(Path(entry.path))
    os.rename(source, dest)


def _adopt_files(source: Path, dest: Path, names: re.Pattern[str]) -> None:
    with os.scandir(source) as entries:
        for entry in entries:
            if names.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                os.rename(entry.path, dest / entry.name)


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(path.lstat().st_mode)
    except OSError:
        return False


def _remove(path: Path) -> None:
    """Remove a file, symlink or directory without following any symlink."""
    if stat.S_ISDIR(path.lstat().st_mode):
        shutil.rmtree(path)
    else:
        path.unlink()


def _clear_snapshot(tree: Path) -> None:
    """Remove every ``.git`` (the top one is already taken apart) and every special file, so
    that git neither runs in a nested repository nor opens a fifo or device of the agent's."""
    for top, dirs, files in os.walk(tree):
        here = Path(top)
        for name in [*dirs, *files]:
            path = here / name
            mode = path.lstat().st_mode
            special = not (stat.S_ISDIR(mode) or stat.S_ISREG(mode) or stat.S_ISLNK(mode))
            if name == ".git" or special:
                _remove(path)
        dirs[:] = [d for d in dirs if os.path.lexists(here / d)]


@dataclass(frozen=True)
class _GitResult:
    code: int
    stdout: bytes
    stderr: str
    too_large: bool = False


class _HostGit:
    """The host's git, isolated from every configuration but the trusted git dir's."""

    def __init__(self, layout: _Layout, timeout_s: float) -> None:
        binary = shutil.which("git")
        if binary is None:
            raise HostExtractionError("git is not installed on the worker host")
        self.binary = binary
        self.layout = layout
        self.timeout_s = timeout_s
        home = str(layout.home)
        self.env = {
            "PATH": f"{Path(binary).parent}:/usr/bin:/bin",
            "HOME": home,
            "XDG_CONFIG_HOME": home,
            "LC_ALL": "C",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_ATTR_NOSYSTEM": "1",
            "GIT_DIR": str(layout.git_dir),
            "GIT_WORK_TREE": str(layout.tree),
            "GIT_INDEX_FILE": str(layout.index),
            "GIT_NO_REPLACE_OBJECTS": "1",
            "GIT_NO_LAZY_FETCH": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_OPTIONAL_LOCKS": "0",
        }

    def run(self, args: list[str], max_stdout: int | None = None) -> _GitResult:
        argv = [self.binary]
        for item in _PINNED_CONFIG:
            argv += ["-c", item]
        argv += args
        err_path = self.layout.root / "git.stderr"
        try:
            with open(err_path, "w+b") as err:
                proc = subprocess.Popen(
                    argv,
                    cwd=self.layout.tree,
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    start_new_session=True,
                )
                stdout, too_large, timed_out = _collect(proc, max_stdout, self.timeout_s)
                err.seek(0)
                stderr = err.read()[-4000:].decode("utf-8", "replace")
        except OSError as exc:
            if exc.errno in _HOST_ERRNOS:
                raise HostExtractionError(f"running git on the host: {exc}") from exc
            raise HostExtractionError(f"cannot run the host's git: {exc}") from exc
        if timed_out:
            raise PatchRefusedError(
                "git_timeout", f"git {args[0]} ran over {self.timeout_s:.0f}s on the agent's tree"
            )
        if proc.returncode != 0 and _host_disk_full(self.layout.root):
            raise HostExtractionError(f"git {args[0]} failed on a full host disk: {stderr[-400:]}")
        return _GitResult(proc.returncode, stdout, stderr, too_large)


def _host_disk_full(path: Path) -> bool:
    """Whether the host file system of the snapshot is (nearly) full. Asked of the file system,
    not read from git's messages: those quote file names, which the agent chooses."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return True
    few_inodes = fs.f_files > 0 and fs.f_favail < _MIN_FREE_INODES
    return fs.f_bavail * fs.f_frsize < _MIN_FREE_BYTES or few_inodes


def _collect(
    proc: subprocess.Popen[bytes], limit: int | None, timeout_s: float
) -> tuple[bytes, bool, bool]:
    """Read ``proc``'s stdout up to ``limit`` bytes (then kill it: too large) within
    ``timeout_s`` (then kill it: timed out). Returns (stdout, too_large, timed_out)."""
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        _kill(proc)

    timer = threading.Timer(timeout_s, kill)
    timer.daemon = True
    timer.start()
    try:
        chunks, too_large = _read_capped(proc.stdout, limit)
        if too_large:
            _kill(proc)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            _kill(proc)
            proc.wait()
    return b"".join(chunks), too_large, timed_out.is_set()


def _read_capped(stream: IO[bytes] | None, limit: int | None) -> tuple[list[bytes], bool]:
    assert stream is not None
    chunks: list[bytes] = []
    size = 0
    with stream:
        while chunk := stream.read(1 << 16):
            size += len(chunk)
            if limit is not None and size > limit:
                return chunks, True
            chunks.append(chunk)
    return chunks, False


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
