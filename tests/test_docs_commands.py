"""Every command the docs tell a user to type names an entry point that exists and flags it takes.

README.md and docs/*.md show commands in shell blocks and inline (```` `python -m ... --flag` ````,
```` `swerl submit ...` ````). A renamed module or flag leaves a newcomer with an error on the
first try (issue 33, point 4). This test extracts each command, resolves its entry point (``python
-m MODULE``, ``python SCRIPT.py``, ``swerl SUBCOMMAND``), runs its ``--help`` (down to the
subcommand the doc names, in the set-up environment) and checks every ``--flag`` of the doc's
command appears there. Commands of other programs (pytest, the SWE-bench harness, commands run
inside a task's sandbox) are listed in :data:`FOREIGN` with the reason.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow  # runs each entry point's --help

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
SHELL_BLOCKS = ("bash", "sh", "shell", "console", "")
# A command: optional VAR=value prefixes, then python / .venv/bin/python / swerl.
COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S* )*((?:\.venv/bin/)?python3?|swerl)\s")
INLINE = re.compile(r"`((?:[A-Z_][A-Z0-9_]*=\S* )*(?:(?:\.venv/bin/)?python3?|swerl) [^`]+)`")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
# Entry points of other programs that the docs name on purpose.
FOREIGN = {
    "pytest": "pytest itself (its flags are pytest's)",
    "tornado.test": "a task repository's own test runner, inside its sandbox",
    "swebench.harness.prepare_images": "the official SWE-bench harness (docs/eval.md parity)",
    "openhands.agent_server": "the OpenHands agent server, started inside each sandbox",
    "test.py": "a task repository's own test script, inside its sandbox",
}


@dataclass(frozen=True)
class DocCommand:
    doc: str
    line: str

    def words(self) -> list[str]:
        try:
            words = shlex.split(self.line)
        except ValueError:  # an unbalanced quote in a placeholder: split on blanks
            words = self.line.split()
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
            words.pop(0)
        return words


def shell_blocks(text: str) -> list[list[str]]:
    """The lines of each fenced block whose language is a shell (or none)."""
    blocks, current, lang = [], None, ""
    for line in text.splitlines():
        stripped = line.strip()
        if current is None and stripped.startswith("```"):
            current, lang = [], stripped[3:].strip()
        elif current is not None and stripped == "```":
            if lang in SHELL_BLOCKS:
                blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return blocks


def commands_in(text: str, doc: str) -> list[DocCommand]:
    """Shell-block commands (backslash continuations joined, prompts and comments cut) and
    inline code spans that are commands."""
    found = []
    for block in shell_blocks(text):
        joined, pending = [], ""
        for line in block:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            joined.append(pending + line)
            pending = ""
        for line in joined:
            line = " ".join(line.strip().removeprefix("$ ").split(" #", 1)[0].split())
            if COMMAND.match(line + " "):
                found.append(DocCommand(doc, line))
    found += [DocCommand(doc, " ".join(m.group(1).split())) for m in INLINE.finditer(text)]
    return found


def entry_point(words: list[str]) -> tuple[list[str], list[str]] | str:
    """(the argv that starts it, the words after it), or the name of a foreign program."""
    program, rest = words[0], words[1:]
    if program == "swerl":
        return [sys.executable, "-m", "services.swerl_cli"], rest
    if rest[:1] == ["-m"] and len(rest) > 1:
        module = rest[1]
        if module in FOREIGN:
            return module
        return [sys.executable, "-m", module], rest[2:]
    if rest and rest[0].endswith(".py"):
        if Path(rest[0]).name in FOREIGN:
            return Path(rest[0]).name
        return [sys.executable, rest[0]], rest[1:]
    return "bare " + program  # e.g. `python` alone: nothing to check


def module_exists(argv: list[str]) -> bool:
    if argv[1] != "-m":
        return (REPO_ROOT / argv[1]).is_file()
    path = REPO_ROOT.joinpath(*argv[2].split("."))
    return path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()


@functools.cache
def help_text(argv: tuple[str, ...]) -> str | None:
    """``argv --help``'s output, None when it fails."""
    res = subprocess.run(
        [*argv, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=180
    )
    return res.stdout if res.returncode == 0 else None


def helps_for(argv: list[str], rest: list[str]) -> list[str]:
    """The help texts of the command and of each subcommand the words name (two levels): a
    lower-case word after the command is a subcommand when ``command word --help`` answers."""
    top = help_text(tuple(argv))
    assert top is not None, f"{' '.join(argv[1:])} --help failed"
    chain, texts = list(argv), [top]
    for word in rest[:2]:
        if not re.fullmatch(r"[a-z][a-z0-9_-]*", word):
            break
        sub = help_text((*chain, word))
        if sub is None:
            break
        chain.append(word)
        texts.append(sub)
    return texts


def doc_flags(rest: list[str]) -> set[str]:
    return {m for word in rest for m in FLAG.findall(word.split("=", 1)[0])}


def all_commands() -> list[DocCommand]:
    out = []
    for doc in DOCS:
        out += commands_in(doc.read_text(), str(doc.relative_to(REPO_ROOT)))
    return out


def test_commands_are_found_in_blocks_and_inline() -> None:
    text = (
        "Run `python -m services.api --port 1` or `swerl status`.\n"
        "```bash\n$ SWERL_X=1 python -m adapter --engines A \\\n    --model M  # start\n"
        "docker-compose up\n```\n```python\npython -m not.a.shell.block\n```\n"
    )
    got = [c.line for c in commands_in(text, "d.md")]
    assert got == [
        "SWERL_X=1 python -m adapter --engines A --model M",
        "python -m services.api --port 1",
        "swerl status",
    ]
    assert entry_point(DocCommand("d", got[0]).words()) == (
        [sys.executable, "-m", "adapter"],
        ["--engines", "A", "--model", "M"],
    )
    assert doc_flags(["--backend=docker", "[--steps", "N]", "--a|--b"]) == {
        "--backend",
        "--steps",
        "--a",
        "--b",
    }


def test_the_check_catches_a_wrong_flag_and_a_missing_module() -> None:
    argv, rest = entry_point(["python", "-m", "services.manager", "--no-such-flag"])
    assert module_exists(argv)
    assert "--no-such-flag" not in " ".join(helps_for(argv, rest))
    assert not module_exists([sys.executable, "-m", "services.no_such_module"])


def test_every_documented_command_exists_and_takes_its_flags() -> None:
    commands = all_commands()
    assert len(commands) > 60  # the extraction found the docs' commands
    resolved_all = [entry_point(c.words()) for c in commands]
    tops = {tuple(r[0]) for r in resolved_all if not isinstance(r, str) and module_exists(r[0])}
    with ThreadPoolExecutor(max_workers=4) as pool:  # warm help_text's cache, imports overlap
        list(pool.map(help_text, sorted(tops)))
    problems = []
    for command in commands:
        resolved = entry_point(command.words())
        if isinstance(resolved, str):
            continue
        argv, rest = resolved
        if not module_exists(argv):
            problems.append(f"{command.doc}: `{command.line}`: no such entry point")
            continue
        texts = " ".join(helps_for(argv, rest))
        unknown = sorted(f for f in doc_flags(rest) if not re.search(rf"{f}(?![\w-])", texts))
        if unknown:
            problems.append(f"{command.doc}: `{command.line}`: unknown flags {unknown}")
    assert problems == [], "\n".join(problems)
