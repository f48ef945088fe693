"""SWE-smith's repository profiles: the test command and log parser a SWE-smith row is graded by.

SWE-smith grades an instance with its repository's profile (``swesmith.profiles.python``):

* the test command: by default ``source /opt/miniconda3/bin/activate; conda activate testbed;
  pytest --disable-warnings --color=no --tb=no --verbose`` -- the published images keep the
  repository's environment in conda's ``testbed`` env, so a plain ``python -m pytest`` runs
  outside it -- over the whole suite; a profile with ``min_testing`` runs only the graded test
  files (the F2P files, then the P2P files, each sorted and de-duplicated: ``get_test_cmd``);
  a few repositories have their own command (pydantic runs ``uv``, paramiko ``-rA``, tornado
  ``python -m tornado.test --verbose``, python-slugify ``python test.py --verbose``, ...);
* the parser of that command's log (:data:`~sandbox_worker.evaluation.log_parser.SWESMITH_PARSERS`;
  python-slugify, tornado and mypy have parsers of their own).

python/mypy builds its command in code of its own (``test_cmd_rule: k_test_patch_cases``):
``pytest --color=no -rA -k "<case> or <case> ..."`` with the ``[case ...]`` names of the row's
``instance_ref`` test patch (the SWE-bench instance a PR-mirror bug was recreated from, where
a row carries it). When there are fewer than two such names -- every row without an
``instance_ref`` among them -- SWE-smith's command is ``pytest ... -k`` with no expression: a
pytest usage error before any test runs, which grades every patch 0. swerl refuses such a row
by name (:class:`UngradableRowError`) instead of reproducing that run, as it does a case name
a double-quoted shell word would not keep as written (``"``, ``$``, a backquote, a backslash,
a newline).

The test files (``get_test_files``: what SWE-smith's harness deletes from the task, reverts
after the model's patch and, under ``min_testing``, runs; :func:`profile_test_files`) are the
pytest ids' files by default (mido's without ``../dev/``), the modules of tornado's unittest
descriptions, and ``test.py`` for python-slugify. :func:`graded_test_files` gives them to the
task state (:mod:`sandbox_worker.task_state`: hidden from the agent, brought back over its
edits), to swerl's script and to the validation's tamper check.

The facts are data (``data/swesmith_profiles.json``, generated from the swesmith package by
``generate_swesmith_profiles.py``; nothing of its code is copied): the command, ``min_testing``,
the parser's name, the command and test-file rules' names, slugify's fixed files. A profile
whose command rule, test-file rule or parser swerl has no counterpart for would be refused by
name, as is a row of a repository SWE-smith has no profile for; in swesmith 0.0.9 every one of
the 133 Python profiles is reproduced.

In ``evaluation.eval_script: harness`` a SWE-smith row's eval script is swerl's (the task state
of :mod:`sandbox_worker.task_state`, the hidden tests restored, graded files reverted) with the
profile's command, and its log is read by the profile's parser; SWE-smith's grading rules are
SWE-bench's (``get_eval_report``). The time limit is the evaluation's ``test_timeout_s``
(SWE-smith's own is 90 s for every profile).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from sandbox_worker.evaluation.log_parser import SWESMITH_PARSERS
from sandbox_worker.evaluation.patches import files_of_test_ids
from services.protocol.instance import SWEInstance

PROFILES_PATH = Path(__file__).parent / "data" / "swesmith_profiles.json"
MIRROR_PREFIX = "swesmith/"
INSTANCE_REF = "instance_ref"  # SWE-smith's field: the SWE-bench row a PR mirror recreates
# The command rules swerl reproduces (the JSON's ``test_cmd_rule``): SWE-smith's default
# ``get_test_cmd`` (the graded files under ``min_testing``) and mypy's (``-k`` over the test
# patch's data-driven cases).
TEST_FILES_RULE = "test_files"
CASES_RULE = "k_test_patch_cases"
# The test-file rules (the JSON's ``test_files_rule``, SWE-smith's ``get_test_files``): the
# files its harness deletes from the task ("Remove F2P Tests") and reverts after the model's
# patch, and, under ``min_testing``, runs. pytest ids up to ``::`` (the default; mido's with
# ``../dev/`` dropped), unittest descriptions' modules (tornado), or one fixed list (slugify).
PYTEST_IDS_RULE = "pytest_ids"
DEV_PREFIX_RULE = "pytest_ids_dev_prefix"
UNITTEST_MODULES_RULE = "unittest_modules"
FIXED_RULE = "fixed"
FILE_RULES = (PYTEST_IDS_RULE, DEV_PREFIX_RULE, UNITTEST_MODULES_RULE, FIXED_RULE)
_DEV_PREFIX = "../dev/"
_UNITTEST_CLASS = re.compile(r"\s\((.*)\)")  # "test_x (pkg.module.Class)"
_CASE_NAME = re.compile(r"\[case ([^\]]+)\]")
_MIN_CASES = 2  # mypy's get_test_cmd adds the -k expression only for more than one case
_UNQUOTABLE = re.compile(r'["$`\\\n]')  # not kept as written inside a double-quoted word


class UnknownProfileError(ValueError):
    """No SWE-smith profile swerl reproduces for the row's repository."""


class UngradableRowError(UnknownProfileError):
    """The profile is reproduced, but SWE-smith's own command for this row would be broken."""


@dataclass(frozen=True)
class SmithProfile:
    key: str  # owner__repo.commit8
    test_cmd: str
    min_testing: bool
    test_cmd_rule: str  # TEST_FILES_RULE or CASES_RULE
    test_files_rule: str  # one of FILE_RULES
    fixed_test_files: tuple[str, ...]  # FIXED_RULE's files
    log_parser: str
    timeout: int


@cache
def _table() -> dict[str, Any]:
    table: dict[str, Any] = json.loads(PROFILES_PATH.read_text())
    return table


def profiles_source() -> str:
    return str(_table()["source"])


def profile_key(instance: SWEInstance) -> str:
    """``owner__repo.commit8``: the row's ``repo`` without SWE-smith's mirror prefix, else its
    ``instance_id`` without the last part (SWE-smith's ``get_from_inst``)."""
    repo = instance.repo
    if repo.startswith(MIRROR_PREFIX):
        return repo[len(MIRROR_PREFIX) :]
    return instance.instance_id.rsplit(".", 1)[0]


def profile_for(instance: SWEInstance) -> SmithProfile:
    """The profile of a SWE-smith row (:class:`UnknownProfileError` if there is none swerl
    reproduces, naming why)."""
    key = profile_key(instance)
    entry = _table()["repos"].get(key)
    if entry is None:
        raise UnknownProfileError(
            f"{instance.instance_id}: no SWE-smith profile for {key!r} "
            f"({len(_table()['repos'])} Python profiles of {profiles_source()})"
        )
    parser = str(entry["log_parser"])
    rule = str(entry["test_cmd_rule"])
    files_rule = str(entry["test_files_rule"])
    known = rule in (TEST_FILES_RULE, CASES_RULE) and files_rule in FILE_RULES
    if not known or parser not in SWESMITH_PARSERS:
        raise UnknownProfileError(
            f"{instance.instance_id}: SWE-smith's profile of {key} builds its test command, "
            f"its test files or parses its log in code of its own (command {rule}, files "
            f"{files_rule}, parser {parser}), which swerl does not reproduce; grade it with "
            "evaluation.eval_script: swerl and a test_cmd"
        )
    return SmithProfile(
        key=key,
        test_cmd=str(entry["test_cmd"]),
        min_testing=bool(entry["min_testing"]),
        test_cmd_rule=rule,
        test_files_rule=files_rule,
        fixed_test_files=tuple(entry.get("test_files_fixed", ())),
        log_parser=parser,
        timeout=int(entry["timeout"]),
    )


def profile_test_command(instance: SWEInstance) -> str:
    """The command SWE-smith runs for the row (``get_test_cmd``): the profile's, with the
    graded test files appended under ``min_testing``, or mypy's ``-k`` over the test patch's
    cases (:class:`UngradableRowError` where SWE-smith's own would be broken)."""
    profile = profile_for(instance)
    if profile.test_cmd_rule == CASES_RULE:
        return _cases_command(instance, profile)
    if not profile.min_testing:
        return profile.test_cmd
    f2p_files, p2p_files = _files_of(profile, instance)
    files = f2p_files + p2p_files
    return " ".join([profile.test_cmd, *files]) if files else profile.test_cmd


def graded_test_files(instance: SWEInstance) -> tuple[list[str], list[str]]:
    """The F2P and P2P test files of a SWE-smith row: its profile's rule
    (:func:`profile_test_files`), or, for a row without a profile swerl reproduces, the files
    of its pytest ids. The F2P files are those SWE-smith's "Remove F2P Tests" commit deletes:
    the task state hides them and the evaluation brings them back over the model's edits, so a
    rule that misses one (a unittest id has no ``::``) would show the agent its tests and let
    its edits to them stand."""
    try:
        return profile_test_files(instance)
    except UnknownProfileError:
        return files_of_test_ids(instance.FAIL_TO_PASS), files_of_test_ids(instance.PASS_TO_PASS)


def profile_test_files(instance: SWEInstance) -> tuple[list[str], list[str]]:
    """SWE-smith's ``get_test_files`` of the row: the F2P and the P2P test files, each sorted
    and once (tornado's come as sets in SWE-smith: their order is not one it keeps)."""
    return _files_of(profile_for(instance), instance)


def _files_of(profile: SmithProfile, instance: SWEInstance) -> tuple[list[str], list[str]]:
    if profile.test_files_rule == FIXED_RULE:
        return list(profile.fixed_test_files), list(profile.fixed_test_files)
    rule = {
        PYTEST_IDS_RULE: _pytest_file,
        DEV_PREFIX_RULE: _pytest_file_in_dev,
        UNITTEST_MODULES_RULE: _unittest_module_file,
    }[profile.test_files_rule]
    return _files(instance.FAIL_TO_PASS, rule), _files(instance.PASS_TO_PASS, rule)


def _files(test_ids: list[str], file_of: Callable[[str], str | None]) -> list[str]:
    """The files of ``test_ids`` (None: the id names none), sorted, once."""
    return sorted({file for file in map(file_of, test_ids) if file is not None})


def _pytest_file(test_id: str) -> str:
    """``tests/a.py::T::t`` -> ``tests/a.py``: the id up to its first ``::``."""
    return test_id.split("::", 1)[0]


def _pytest_file_in_dev(test_id: str) -> str:
    """mido's: ``../dev/tests/a.py::t`` -> ``tests/a.py`` (its tests run from a sibling dir)."""
    return _pytest_file(test_id).removeprefix(_DEV_PREFIX)


def _unittest_module_file(test_id: str) -> str | None:
    """tornado's: ``test_x (tornado.test.web_test.WebTest)`` -> ``tornado/test/web_test.py``,
    the parenthesised name without its last part; an id without one names no file."""
    match = _UNITTEST_CLASS.search(test_id)
    if match is None:
        return None
    return "/".join(match.group(1).split(".")[:-1]) + ".py"


def _cases_command(instance: SWEInstance, profile: SmithProfile) -> str:
    """mypy's rule: ``<test_cmd> "<case> or <case> ..."`` (``test_cmd`` ends in ``-k``)."""
    cases = reference_test_cases(instance)
    where = f"{instance.instance_id}: SWE-smith's profile of {profile.key}"
    if len(cases) < _MIN_CASES:
        raise UngradableRowError(
            f"{where} selects tests with pytest -k from the [case ...] names of the row's "
            f"{INSTANCE_REF} test patch; this row has {len(cases)}, so SWE-smith would run "
            f"{profile.test_cmd.rsplit(';', 1)[-1].strip()!r} with no -k expression (a pytest "
            "usage error, no test runs): refused rather than graded 0; grade it with "
            "evaluation.eval_script: swerl and a test_cmd"
        )
    bad = [case for case in cases if _UNQUOTABLE.search(case)]
    if bad:
        raise UngradableRowError(
            f"{where}: the case name {bad[0]!r} of the row's {INSTANCE_REF} test patch would "
            "not reach pytest as written inside SWE-smith's double quotes: refused"
        )
    return f'{profile.test_cmd} "{" or ".join(cases)}"'


def reference_test_cases(instance: SWEInstance) -> list[str]:
    """The ``[case <name>]`` names of the row's ``instance_ref`` test patch, in order, repeats
    kept (mypy's data-driven tests); none without an ``instance_ref`` or a ``test_patch`` in
    it, :class:`UngradableRowError` if either is of the wrong type."""
    ref = _checked(instance, (instance.model_extra or {}).get(INSTANCE_REF), dict, INSTANCE_REF)
    test_patch = _checked(
        instance, (ref or {}).get("test_patch"), str, f"{INSTANCE_REF}.test_patch"
    )
    return _CASE_NAME.findall(test_patch) if test_patch is not None else []


def _checked(instance: SWEInstance, value: Any, kind: type, field: str) -> Any:
    """``value`` if it is None or a ``kind``; else :class:`UngradableRowError` naming ``field``."""
    if value is not None and not isinstance(value, kind):
        raise UngradableRowError(
            f"{instance.instance_id}: {field} must be a {'mapping' if kind is dict else 'string'} "
            f"(SWE-smith's reference instance), got {type(value).__name__}"
        )
    return value
