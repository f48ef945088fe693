"""Docs stay true about where things are: every repository path a doc names exists.

README.md and docs/*.md name modules, test files and scripts by path (``tests/unit/...``,
``services/queue/...``, ``deploy/...``). A rename that forgets a doc leaves a newcomer looking
for a file that is not there; this test names each stale reference.
"""

from __future__ import annotations

import re

from tests.support.paths import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
TOP = ("adapter", "trainer", "sandbox_worker", "services", "deploy", "tests", "bench", "docs")
# A path: a top-level folder, then path characters, ending in a file name or a folder slash.
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(TOP) + r")/[\w./-]*[\w/])")
# Named on purpose although absent from this checkout: paths inside a task's repository.
ELSEWHERE = {"tests/runtests.py": "django's test runner, inside a SWE-bench task repository"}


def referenced_paths(text: str) -> set[str]:
    found = set()
    for match in PATH.finditer(text):
        path = match.group(1).split("::")[0].rstrip(".")
        is_pattern = text[match.end() : match.end() + 1] in ("*", "<", "{")
        if is_pattern or path in ELSEWHERE:
            continue
        found.add(path)
    return found


def test_the_path_pattern_finds_paths_and_skips_prose() -> None:
    text = "`services/queue/keys.py`, tests/unit/adapter/; adapterish/x a/services/y bench/b_*.py"
    assert referenced_paths(text) == {"services/queue/keys.py", "tests/unit/adapter/"}


def test_every_path_named_in_the_docs_exists() -> None:
    stale = [
        f"{doc.relative_to(REPO_ROOT)}: {path}"
        for doc in DOCS
        for path in sorted(referenced_paths(doc.read_text()))
        if not (REPO_ROOT / path).exists()
    ]
    assert not stale, "docs name paths that do not exist (fix the doc):\n" + "\n".join(stale)
