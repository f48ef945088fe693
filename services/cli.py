"""Start-up steps shared by the service entry points (``python -m adapter``, ``services.manager``,
``sandbox_worker``).

Why one module: every service starts the same way, and the operator should meet the same
behaviour wherever they are: ``--config FILE`` / ``--log-level`` / ``--print-config`` mean the
same thing, a configuration error prints ``error: ...`` (naming every offending key) and exits
2, ``--print-config`` prints the effective configuration as YAML and exits 0, and log lines
share one format. Written once here, a fix or a new common flag reaches all services at once.

What stays in each ``__main__``: its own flags, descriptions and epilogs (``--help`` must teach
the service), and what it does once configured.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from services.config import ConfigError, dump_config, load_config
from services.protocol.instance import REPO_PATTERN

# Exit statuses shared by the services (documented in their epilogs).
EXIT_OK = 0
EXIT_CONFIG = 2
# The levels the manager and the worker accept (their configs hold exactly these).
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR")
_KNOWN_LEVELS = frozenset(logging.getLevelNamesMapping()) - {"NOTSET"}
# The destinations of the common flags; a service's overrides never name them.
COMMON_DESTS = frozenset({"config", "log_level", "print_config"})


def positive_int(text: str) -> int:
    """``argparse`` ``type=`` for a count or seconds >= 1: anything else is a usage error."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def repo_timeout(text: str) -> tuple[str, int]:
    """``argparse`` ``type=`` for ``owner/name=SECONDS`` (a per-repository test timeout, the
    worker's ``evaluation.test_timeout_by_repo`` entry): anything else is a usage error."""
    repo, sep, seconds = text.rpartition("=")
    if not sep or not re.fullmatch(REPO_PATTERN, repo):
        raise argparse.ArgumentTypeError(f"expected owner/name=SECONDS, got {text!r}")
    return repo, positive_int(seconds)


def service_parser(
    prog: str, description: str, epilog: str | None = None
) -> argparse.ArgumentParser:
    """An argument parser that prints ``description`` and ``epilog`` as written.

    The services' help texts are laid out by hand (paragraphs, example command lines), which
    argparse's default formatter would re-wrap into one block.
    """
    if not prog.strip() or not description.strip():
        raise ValueError("a service parser needs a prog name and a description")
    return argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_common_arguments(
    parser: argparse.ArgumentParser,
    section: str,
    *,
    log_levels: Sequence[str] | None = LOG_LEVELS,
) -> None:
    """Add ``--config FILE``, ``--log-level`` and ``--print-config`` to ``parser``.

    ``section`` is the service's section of the YAML file (shown in ``--help``). ``log_levels``
    are the choices of ``--log-level``; ``None`` accepts any level name (checked after loading,
    see :func:`load_cli_config`), for a config whose ``log_level`` is free text.
    """
    if not section:
        raise ValueError("section must be a non-empty config section name")
    if log_levels is not None and not log_levels:
        raise ValueError("log_levels must name at least one level, or be None for any level")
    parser.add_argument("--config", metavar="FILE", help=f"YAML config file (section '{section}')")
    level_help = "level of the service's log lines (default: the config's log_level)"
    if log_levels is None:
        parser.add_argument("--log-level", dest="log_level", metavar="LEVEL", help=level_help)
    else:
        parser.add_argument(
            "--log-level", dest="log_level", choices=list(log_levels), help=level_help
        )
    parser.add_argument(
        "--print-config", action="store_true", help="print the effective config, exit"
    )


def nest_overrides(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Turn ``{"queue.prefix": v}`` into ``{"queue": {"prefix": v}}``, dropping ``None`` values.

    Flags that were not given are ``None`` and must not override the file or the environment;
    dropping them here also keeps an unset nested flag from creating an empty sub-mapping.
    """
    out: dict[str, Any] = {}
    for key, value in flat.items():
        parts = key.split(".")
        if not all(parts):
            raise ValueError(f"override key {key!r} has an empty part")
        if value is None:
            continue
        node = out
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"override key {key!r} conflicts with override {part!r}")
            node = child
        if isinstance(node.get(parts[-1]), dict):
            raise ValueError(f"override key {key!r} conflicts with a nested override")
        node[parts[-1]] = value
    return out


def load_cli_config[M: BaseModel](
    model: type[M],
    section: str,
    args: argparse.Namespace,
    overrides: Mapping[str, Any],
) -> M | int:
    """The service's configuration, or the exit status when ``main`` must return now.

    Loads ``model`` from ``args.config`` (or ``$SWERL_CONFIG``), the environment, and the
    flags: ``overrides`` (dotted keys for nested fields, ``None`` for flags not given) plus
    ``--log-level``. A bad value prints ``error: ...`` to stderr and gives 2; ``--print-config``
    prints the configuration as YAML (secrets masked) to stdout and gives 0. An ``int`` result
    is therefore always an exit status: ``if isinstance(cfg, int): return cfg``.
    """
    for name in ("config", "log_level", "print_config"):
        if not hasattr(args, name):
            raise ValueError(f"args has no {name!r}: call add_common_arguments on the parser")
    clash = COMMON_DESTS & set(overrides)
    if clash:
        raise ValueError(f"overrides must not name the common flags: {sorted(clash)}")
    try:
        flags = nest_overrides({**overrides, "log_level": args.log_level})
        cfg = load_config(model, section=section, path=args.config, overrides=flags)
        _check_log_level(cfg, section)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.print_config:
        print(dump_config(cfg), end="")
        return EXIT_OK
    return cfg


def _check_log_level(cfg: BaseModel, section: str) -> None:
    """A ``log_level`` that :mod:`logging` does not know is a config error, not a traceback."""
    level = getattr(cfg, "log_level", None)
    if isinstance(level, str) and level.upper() not in _KNOWN_LEVELS:
        known = ", ".join(sorted(_KNOWN_LEVELS))
        raise ConfigError(
            f"invalid configuration [{section}]:\n"
            f"  - {section}.log_level: unknown log level {level!r}, expected one of {known}"
        )


def log_format(tag: str | None = None) -> str:
    """The services' log line: time, level, ``[tag]`` (e.g. the worker's node), logger, text."""
    where = f"[{tag}] " if tag else ""
    return f"%(asctime)s %(levelname)s {where}%(name)s: %(message)s"


def configure_logging(level: str, tag: str | None = None) -> None:
    """Configure the root logger at ``level`` (any case) with :func:`log_format`.

    Like :func:`logging.basicConfig` it does nothing when the root logger already has handlers
    (a test runner's, an embedding program's): they own the output then.
    """
    name = level.upper()
    if name not in _KNOWN_LEVELS:
        raise ValueError(f"unknown log level {level!r}")
    logging.basicConfig(level=name, format=log_format(tag))
