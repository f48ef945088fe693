"""Start pytest so that no module of the repository runs before pytest has started.

The evaluation copies this file's *source* into the evaluation sandbox, next to the report
plugin (outside the repository), and runs the tests as ``<python> safe_pytest.py <pytest args>``
instead of ``python -m pytest <args>`` or ``pytest <args>``. Without it, whatever the patch adds
to the repository is importable while Python and pytest start: a new top-level package the
standard library imports lazily (``org/python/core.py``, which ``copy`` and ``pickle`` try), or
an ``X.DIST-INFO/entry_points.txt`` that pytest's plugin autoload finds, runs before pytest has
loaded the report plugin, and can forge every result. ``-P`` / ``PYTHONSAFEPATH`` would do part
of this, but only on Python >= 3.11, and most SWE-bench environments are older.

So: every ``sys.path`` entry inside the repository (``$SWERL_REPO``; the working directory, ``''``,
``.pth`` entries of editable installs, ``PYTHONPATH``) is removed; pytest is imported, its
configuration parsed, its plugins (entry points included) loaded; then, before the first
conftest or test module is imported, the entries go back where they were, and the working
directory goes first when the original command was ``python -m pytest``
(``SWERL_CWD_ON_PATH=1``), so the tests import the repository the way they always do.

It must run on every Python and pytest a SWE-bench environment has (Python >= 3.5, pytest >= 3):
no f-strings, no annotations, only long-standing APIs.
"""

import os
import sys


def _inside(entry, repo):
    path = os.path.realpath(entry or os.getcwd())
    return path == repo or path.startswith(repo.rstrip(os.sep) + os.sep)


def _split_path(repo):
    """Remove the repository's entries from sys.path; return them with their positions."""
    removed = [(index, entry) for index, entry in enumerate(sys.path) if _inside(entry, repo)]
    sys.path[:] = [entry for entry in sys.path if not _inside(entry, repo)]
    return removed


class _RestorePath:
    """Puts the repository back on sys.path once pytest's start-up is over."""

    def __init__(self, removed, cwd_first):
        self.removed = removed
        self.cwd_first = cwd_first
        self.done = False

    def restore(self):
        if self.done:
            return
        self.done = True
        for index, entry in self.removed:
            sys.path.insert(min(index, len(sys.path)), entry)
        if self.cwd_first:
            cwd = os.getcwd()
            if not sys.path or os.path.realpath(sys.path[0] or cwd) != os.path.realpath(cwd):
                sys.path.insert(0, cwd)


def main():
    repo = os.path.realpath(os.environ.get("SWERL_REPO") or os.getcwd())
    # sys.path[0] is this file's directory (the harness's, outside the repository): not a
    # place tests import from.
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or ".") == os.path.realpath(here):
        del sys.path[0]
    removed = _split_path(repo)
    restorer = _RestorePath(removed, os.environ.get("SWERL_CWD_ON_PATH") == "1")

    import pytest  # after the repository left sys.path, on purpose

    class _Hooks:
        # Called after the command line, ini files, -p plugins and entry points are loaded,
        # before the first conftest.py is imported.
        @pytest.hookimpl(tryfirst=True)
        def pytest_load_initial_conftests(self, early_config, parser, args):
            restorer.restore()

        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionstart(self, session):
            restorer.restore()

    try:
        code = pytest.main(sys.argv[1:], plugins=[_Hooks()])
    finally:
        restorer.restore()
    sys.exit(int(code))


if __name__ == "__main__":
    main()
