"""Every command-line option of every swerl entry point has a help text (issue 13: `--help` that
teaches), and every parser has a description; subcommands are checked too.

The parser each ``main(argv)`` builds is captured where it parses, so the check sees exactly
what ``--help`` prints, without running anything.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys

import pytest

from tests.support.paths import REPO_ROOT

# The packages whose modules may be command-line entry points (python -m ...).
PACKAGES = ("adapter", "bench", "deploy", "sandbox_worker", "services", "trainer")
# A module is an entry point when it defines main() and builds an argparse parser.
_MAIN = re.compile(r"^def main\(", re.MULTILINE)
_PARSER = re.compile(r"\bargparse\b|\bservice_parser\(|\bbuild_\w*parser\(")
# Known entry points: the discovery below must find every one of them (it is not too narrow).
KNOWN = (
    "adapter.__main__",
    "sandbox_worker.__main__",
    "sandbox_worker.images",
    "sandbox_worker.validate",
    "services.api.__main__",
    "services.demo",
    "services.eval.main",
    "services.manager.__main__",
    "services.swerl_cli.main",
    "trainer.loop.cli",  # python -m trainer train
    "trainer.service.cli",  # python -m trainer serve
)


def discover_entry_points() -> list[str]:
    """Every module of :data:`PACKAGES` that defines ``main`` and builds an argparse parser."""
    found = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            source = path.read_text()
            if _MAIN.search(source) and _PARSER.search(source):
                found.append(".".join(path.relative_to(REPO_ROOT).with_suffix("").parts))
    return found


ENTRY_POINTS = discover_entry_points()


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("captured")
        self.parser = parser


def capture_parser(module: str, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    def grab(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Captured(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", grab)
    main = importlib.import_module(module).main
    with pytest.raises(_Captured) as got:
        if inspect.signature(main).parameters:
            main(["--help"])
        else:  # main() reads sys.argv
            monkeypatch.setattr(sys, "argv", [module, "--help"])
            main()
    return got.value.parser


def undocumented(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    """Options and subcommands of ``parser`` (recursively) without a help text."""
    missing = [] if parser.description else [f"{prefix or parser.prog}: no description"]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                if not helps.get(name):
                    missing.append(f"{prefix}{name}: subcommand without help")
                missing += undocumented(sub, f"{prefix}{name} ")
        elif not action.help and action.help != argparse.SUPPRESS:
            missing.append(f"{prefix}{'/'.join(action.option_strings) or action.dest}")
    return missing


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_every_option_has_help(module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    parser = capture_parser(module, monkeypatch)
    assert undocumented(parser) == [], f"python -m {module.removesuffix('.__main__')}"


def test_the_check_finds_an_undocumented_option() -> None:
    parser = argparse.ArgumentParser(description="d")
    parser.add_argument("--documented", help="yes")
    parser.add_argument("--bare")
    sub = parser.add_subparsers().add_parser("run", description="r")
    sub.add_argument("--inner")
    assert undocumented(parser) == ["--bare", "run: subcommand without help", "run --inner"]


def test_the_discovery_finds_every_known_entry_point() -> None:
    assert set(KNOWN) <= set(ENTRY_POINTS), sorted(set(KNOWN) - set(ENTRY_POINTS))
    assert len(ENTRY_POINTS) >= 30  # bench, deploy and test-machinery tools included


def test_python_m_trainer_help_names_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.__main__ import COMMANDS, main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {command} " in out for command in COMMANDS), out
