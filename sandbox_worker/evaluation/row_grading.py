"""How one dataset row is graded: the eval script, the grading mode and the log parser.

The choices (``EvalConfig.eval_script`` / ``grading`` / ``log_parser``, the worker's
``evaluation.*`` keys) may each be ``"auto"``; :func:`row_grading` resolves them for one row:

========================================================  ===========  ==========  ============
row                                                       eval script  grading     log parser
========================================================  ===========  ==========  ============
has its own ``test_cmd`` (swerl's extension: users' own   ``swerl``    structured  pytest's
repositories)
carries the harness's ``eval_script`` (swebench 5.0.2)    ``harness``  swebench    the row's
SWE-smith row (``swesmith/...``)                          ``harness``  swebench    its profile's
repository the harness specifies (django, sympy, ...;     ``harness``  swebench    the repo's
SWE-Gym's repositories)
anything else (swerl's mini set, users' pytest repos)     ``swerl``    structured  pytest's
========================================================  ===========  ==========  ============

``structured`` grading (the structured report, the reward-hacking defence of training rewards:
docs/tasks-and-rewards.md) applies wherever swerl's pytest script runs; the harness's scripts
load no report plugin, so their rows are graded by the harness's parser (test infrastructure is
still restored first when ``restore_test_infra`` is on).

A choice that cannot grade the row right raises :class:`GradingConfigError`, a deterministic
failure (the same for every attempt: never retried, never a reward of 0) whose message names the
config keys to change: swerl's pytest script on a repository whose tests do not run under pytest
(django, sympy), a parser of another runner's output than the script's, structured grading of a
harness script, a harness row without a spec for its version, a SWE-smith profile swerl does not
reproduce, an unknown parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sandbox_worker.evaluation.log_parser import LOG_PARSERS
from sandbox_worker.evaluation.specs import (
    UnknownSpecError,
    harness_eval_script,
    harness_parser_name,
    is_swegym_repo,
    known_repos,
)
from sandbox_worker.evaluation.swesmith_profiles import (
    UnknownProfileError,
    profile_for,
    profile_test_command,
)
from services.protocol.instance import SWEInstance

ScriptChoice = Literal["auto", "swerl", "harness"]
GradingChoice = Literal["auto", "structured", "swebench"]
Script = Literal["swerl", "harness"]
Grading = Literal["structured", "swebench"]

# Parsers of test runners other than pytest: swerl's script (pytest -rA) cannot feed them.
NON_PYTEST_RUNNERS: dict[str, str] = {
    "parse_log_django": "django",  # Django's runtests.py
    "parse_log_sympy": "sympy",  # sympy's bin/test
    "swesmith_unittest_verbose": "unittest",  # SWE-smith's python-slugify: test.py --verbose
    "swesmith_unittest_headers": "unittest",  # SWE-smith's tornado: python -m tornado.test
}
KEYS = "evaluation.eval_script / evaluation.grading / evaluation.log_parser"


class GradingConfigError(ValueError):
    """The configured grading cannot grade this row right: a deterministic failure."""


@dataclass(frozen=True)
class RowGrading:
    """The resolved choices for one row (no ``auto`` left)."""

    eval_script: Script
    grading: Grading
    log_parser: str  # a name of LOG_PARSERS


def runner_of(parser: str) -> str:
    """The test runner whose output ``parser`` reads: ``django``, ``sympy``, ``unittest`` or
    ``pytest``."""
    return NON_PYTEST_RUNNERS.get(parser, "pytest")


def _harness_script_or_error(instance: SWEInstance) -> None:
    """Check the harness can script the row (SWE-smith: its profile's command)."""
    try:
        if instance.is_swesmith:
            profile_test_command(instance)
        else:
            harness_eval_script(instance)
    except UnknownProfileError as exc:
        raise GradingConfigError(
            f"{exc} (evaluation.eval_script: swerl with a test_cmd on the row grades it)"
        ) from None
    except UnknownSpecError as exc:
        raise GradingConfigError(
            f"{instance.instance_id}: {exc}; set evaluation.eval_script to swerl only for rows "
            "whose tests run under pytest (give the row a test_cmd)"
        ) from None
    except ValueError as exc:
        raise GradingConfigError(f"{instance.instance_id}: {exc}") from None


def _has_harness_spec(instance: SWEInstance) -> bool:
    """The row's repository is one the harness (or SWE-Gym's fork) specifies."""
    return instance.repo in known_repos() or is_swegym_repo(instance.repo)


def _choose_script(instance: SWEInstance, choice: ScriptChoice) -> Script:
    if choice != "auto":
        return choice
    if instance.test_cmd is not None:
        return "swerl"
    extra = instance.model_extra or {}
    if extra.get("eval_script") or instance.is_swesmith or _has_harness_spec(instance):
        return "harness"
    return "swerl"


def _row_parser(instance: SWEInstance) -> str:
    """The harness's parser name for the row (an unknown one: a GradingConfigError)."""
    try:
        return harness_parser_name(instance)
    except UnknownProfileError as exc:
        raise GradingConfigError(str(exc)) from None
    except ValueError as exc:
        raise GradingConfigError(
            f"{instance.instance_id}: {exc}; fix the row's log_parser or set "
            "evaluation.log_parser to a known parser"
        ) from None


def _native_runner(instance: SWEInstance) -> str:
    """The runner the row's own tests need: its harness parser's (SWE-smith: its profile's),
    ``pytest`` for a repository no harness specifies."""
    try:
        if instance.is_swesmith:
            return runner_of(profile_for(instance).log_parser)
        return runner_of(_row_parser(instance)) if _has_harness_spec(instance) else "pytest"
    except (GradingConfigError, UnknownProfileError):
        return "pytest"


def row_grading(
    instance: SWEInstance, eval_script: ScriptChoice, grading: GradingChoice, log_parser: str
) -> RowGrading:
    """Resolve the choices for ``instance`` (module docstring); :class:`GradingConfigError`
    when they cannot grade it right."""
    script = _choose_script(instance, eval_script)
    if grading == "auto":
        grading = "structured" if script == "swerl" else "swebench"
    where = f"{instance.instance_id} ({instance.repo})"
    if script == "harness":
        if grading == "structured":
            raise GradingConfigError(
                f"{where} is graded by the harness's script, which loads no structured-report "
                "plugin: set evaluation.grading to auto or swebench (or evaluation.eval_script "
                "to swerl for a pytest repository with a test_cmd)"
            )
        _harness_script_or_error(instance)
        parser = _row_parser(instance) if log_parser == "auto" else log_parser
        expected = _row_parser(instance)
        if runner_of(parser) != runner_of(expected):
            raise GradingConfigError(
                f"{where}: evaluation.log_parser {log_parser!r} reads {runner_of(parser)} "
                f"output but the harness's script runs {runner_of(expected)} ({expected}): set "
                "evaluation.log_parser to auto"
            )
        return RowGrading("harness", grading, parser)
    if instance.test_cmd is None:
        # swerl's script runs pytest: a repository of another runner cannot be graded by it
        runner = _native_runner(instance)
        if runner != "pytest":
            raise GradingConfigError(
                f"{where}: its tests run under {runner}, not pytest, so swerl's eval script "
                f"and the pytest parser would grade every patch 0; set evaluation.eval_script "
                f"and evaluation.log_parser to auto (the harness's script and parser) and "
                f"evaluation.grading to auto (configured: {KEYS} = {eval_script} / "
                f"{grading} / {log_parser})"
            )
    parser = log_parser
    if log_parser == "auto":
        parser = "pytest" if instance.is_swesmith else _row_parser(instance)
    if instance.test_cmd is None and runner_of(parser) != "pytest":
        raise GradingConfigError(
            f"{where}: evaluation.log_parser {parser!r} reads {runner_of(parser)} output but "
            "swerl's eval script runs pytest: set evaluation.log_parser to auto or pytest"
        )
    if parser not in LOG_PARSERS:
        raise GradingConfigError(f"{where}: unknown evaluation.log_parser {parser!r}")
    return RowGrading("swerl", grading, parser)
