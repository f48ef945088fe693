"""Test specs of the SWE-bench harness: which eval script a dataset row gets, and which parser.

Two row shapes exist, and both are graded as the official harness grades them:

- Rows that carry the harness's fields (swebench 5.0.2's shape: ``eval_script``, ``log_parser``,
  ``image`` ...) are used as they are: the eval script is the row's, with the test command's exit
  status recorded after the end marker (5.0.2's ``make_test_spec``: ``parse_eval_script`` then
  ``record_test_exit_code``).
- Rows as originally published (no ``eval_script``) get the script the earlier harness built
  from its per-repository / version specs (``MAP_REPO_VERSION_TO_SPECS``: test command,
  ``eval_commands``, ``install``) and the test files of the row's test patch. swebench 5.0.2 no
  longer ships those specs, so they are data here: ``data/swebench_specs.json``, generated from
  the pinned older release by ``generate_swebench_specs.py`` (its header says how); the script is
  then recorded like a 5.0.2 row's.

The parser: the row's ``log_parser`` if it has one, else the repository's
(:func:`sandbox_worker.evaluation.log_parser.parser_name_for`).

``tests/unit/sandbox_worker/evaluation/test_specs.py`` proves parity: against swebench 5.0.2's
``make_test_spec`` for rows with ``eval_script``, and against the older harness's scripts
(recorded fixtures) for published rows.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from sandbox_worker.evaluation.constants import (
    END_TEST_OUTPUT,
    NON_TEST_EXTS,
    START_TEST_OUTPUT,
    TEST_EXIT_CODE,
    TEST_EXIT_CODE_VAR,
)
from sandbox_worker.evaluation.log_parser import parser_name_for
from sandbox_worker.evaluation.patches import modified_files
from services.protocol.instance import SWEInstance

SPECS_PATH = Path(__file__).parent / "data" / "swebench_specs.json"
SCRIPT_HEADER = ("#!/bin/bash", "set -uxo pipefail")
ENV_NAME = "testbed"  # the conda environment of the harness's images
REPO_DIRECTORY = "/testbed"
CONDA_ACTIVATE = "source /opt/miniconda3/bin/activate"
HEREDOC_DELIMITER = "EOF_114329324912"  # the harness's test-patch heredoc delimiter
_DIFF_TARGET = re.compile(r"diff --git a/.* b/(.*)")


class UnknownSpecError(ValueError):
    """The row has no eval script and the harness has no spec for its repository/version."""


@dataclass(frozen=True)
class RepoVersionSpec:
    """What the earlier harness knew about one repository at one version."""

    repo: str
    version: str
    test_cmd: str
    install: str | None = None  # re-run in the eval script (editable installs)
    pre_install: tuple[str, ...] = ()  # image build only
    eval_commands: tuple[str, ...] = ()  # environment set-up before the tests (locale, env vars)
    python: str | None = None
    log_parser: str | None = None


@cache
def _table() -> dict[str, Any]:
    return json.loads(SPECS_PATH.read_text())["repos"]


def specs_source() -> str:
    """Where ``data/swebench_specs.json`` came from (its ``source`` field)."""
    return str(json.loads(SPECS_PATH.read_text())["source"])


def known_repos() -> list[str]:
    return sorted(_table())


def spec_for(repo: str, version: str) -> RepoVersionSpec:
    repo_specs = _table().get(repo)
    if repo_specs is None:
        raise UnknownSpecError(
            f"no SWE-bench test spec for repository {repo!r}: give the row an eval_script (or a "
            f"test_cmd to use swerl's own eval script); known: {', '.join(known_repos())}"
        )
    raw = repo_specs["versions"].get(version)
    if raw is None:
        versions = ", ".join(repo_specs["versions"])
        raise UnknownSpecError(
            f"no SWE-bench test spec for {repo} version {version!r} (known: {versions})"
        )
    test_cmd = raw["test_cmd"]
    return RepoVersionSpec(
        repo=repo,
        version=version,
        test_cmd=" ".join(test_cmd) if isinstance(test_cmd, list) else test_cmd,
        install=raw.get("install"),
        pre_install=tuple(raw.get("pre_install", ())),
        eval_commands=tuple(raw.get("eval_commands", ())),
        python=raw.get("python"),
        log_parser=repo_specs.get("log_parser"),
    )


def harness_test_directives(repo: str, test_patch: str) -> list[str]:
    """The test files the harness passes to the test command: the test patch's targets without
    data files; Django's as dotted module names relative to ``tests/``."""
    directives = [
        d
        for d in _DIFF_TARGET.findall(test_patch)
        if not any(d.endswith(ext) for ext in NON_TEST_EXTS)
    ]
    if repo == "django/django":
        directives = [_django_module(d) for d in directives]
    return directives


def _django_module(path: str) -> str:
    path = path.removesuffix(".py")
    path = path.removeprefix("tests/")
    return path.replace("/", ".")


def published_eval_commands(instance: SWEInstance) -> list[str]:
    """The earlier harness's eval commands for a row as published (no ``eval_script``)."""
    spec = spec_for(instance.repo, instance.version)
    base = instance.base_commit or ""
    reset_tests = f"git checkout {base} {' '.join(modified_files(instance.test_patch))}"
    apply_test_patch = (
        f"git apply -v - <<'{HEREDOC_DELIMITER}'\n{instance.test_patch}\n{HEREDOC_DELIMITER}"
    )
    activate = [CONDA_ACTIVATE, f"conda activate {ENV_NAME}"]
    commands = [*activate, f"cd {REPO_DIRECTORY}", *spec.eval_commands]
    commands += [
        f"git config --global --add safe.directory {REPO_DIRECTORY}",
        f"cd {REPO_DIRECTORY}",
        "git status",
        "git show",
        f"git -c core.fileMode=false diff {base}",
        *activate,
    ]
    if spec.install is not None:
        commands.append(spec.install)
    directives = harness_test_directives(instance.repo, instance.test_patch)
    test_command = " ".join([spec.test_cmd, *directives])
    return [
        *commands,
        reset_tests,
        apply_test_patch,
        f": '{START_TEST_OUTPUT}'",
        test_command,
        f": '{END_TEST_OUTPUT}'",
        reset_tests,
    ]


def commands_of_script(script: str) -> list[str]:
    """A row's ``eval_script`` as commands, without the header lines (5.0.2's rule)."""
    return [line for line in script.strip().split("\n") if line not in SCRIPT_HEADER]


def record_test_exit_code(commands: list[str]) -> list[str]:
    """Capture the test command's exit status right after it and print it after the end
    marker (the script's own status is the final test-file reset's). Unchanged if the script
    has no end marker."""
    for i, line in enumerate(commands):
        if END_TEST_OUTPUT in line:
            return [
                *commands[:i],
                f"{TEST_EXIT_CODE_VAR}=$?",
                line,
                f'echo "{TEST_EXIT_CODE}: ${TEST_EXIT_CODE_VAR}"',
                *commands[i + 1 :],
            ]
    return commands


def row_field(instance: SWEInstance, name: str) -> str | None:
    """A harness field the row may carry beyond the published ones (``eval_script``, ...)."""
    value = (instance.model_extra or {}).get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{instance.instance_id}: field {name!r} must be a string")
    return value


def harness_eval_script(instance: SWEInstance) -> str:
    """The eval script the official harness runs for this row."""
    own = row_field(instance, "eval_script")
    commands = commands_of_script(own) if own is not None else published_eval_commands(instance)
    return "\n".join([*SCRIPT_HEADER, *record_test_exit_code(commands)]) + "\n"


def harness_parser_name(instance: SWEInstance) -> str:
    """The harness's log parser for this row."""
    return parser_name_for(instance.repo, row_field(instance, "log_parser"))
