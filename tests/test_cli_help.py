"""Every command-line option of every swerl entry point has a help text (issue 13: `--help` that
teaches), and every parser has a description; subcommands are checked too.

The parser each ``main(argv)`` builds is captured where it parses, so the check sees exactly
what ``--help`` prints, without running anything.
"""

from __future__ import annotations

import argparse
import importlib

import pytest

ENTRY_POINTS = (
    "adapter.__main__",
    "sandbox_worker.__main__",
    "sandbox_worker.images",
    "sandbox_worker.validate",
    "services.api.__main__",
    "services.datasets.overlap",
    "services.demo",
    "services.eval.main",
    "services.manager.__main__",
    "services.reference_engine.server",
    "services.swerl_cli.main",
    "services.tiny_model.build",
    "trainer.loop.cli",  # python -m trainer train
    "trainer.service.cli",  # python -m trainer serve
    "services.tiny_model.warm_start",
    "services.toy_train",
    "services.toy_train_job",
    "services.swe_train",
    # python -m trainer itself: checked once its subcommands settle (issue 12 adds `report`)
)


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
        main(["--help"])
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
