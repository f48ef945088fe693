"""SWE-smith's repository profiles: the test command and log parser a SWE-smith row is graded by.

SWE-smith grades an instance with its repository's profile (``swesmith.profiles.python``):

* the test command: by default ``source /opt/miniconda3/bin/activate; conda activate testbed;
  pytest --disable-warnings --color=no --tb=no --verbose`` -- the published images keep the
  repository's environment in conda's ``testbed`` env, so a plain ``python -m pytest`` runs
  outside it -- over the whole suite; a profile with ``min_testing`` runs only the graded test
  files (the F2P files, then the P2P files, each sorted and de-duplicated: ``get_test_cmd``);
  a few repositories have their own command (pydantic runs ``uv``, paramiko ``-rA``, ...);
* the parser of that command's log (:data:`~sandbox_worker.evaluation.log_parser.SWESMITH_PARSERS`).

The facts are data (``data/swesmith_profiles.json``, generated from the swesmith package by
``generate_swesmith_profiles.py``; nothing of its code is copied). Three profiles build their
command or parse their log in code of their own (python/mypy, tornadoweb/tornado,
un33k/python-slugify): those are not reproduced and such a row is refused by name, as is a row
of a repository SWE-smith has no profile for.

In ``evaluation.eval_script: harness`` a SWE-smith row's eval script is swerl's (the task state
of :mod:`sandbox_worker.task_state`, the hidden tests restored, graded files reverted) with the
profile's command, and its log is read by the profile's parser; SWE-smith's grading rules are
SWE-bench's (``get_eval_report``). The time limit is the evaluation's ``test_timeout_s``
(SWE-smith's own is 90 s for every profile).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from services.protocol.instance import SWEInstance

PROFILES_PATH = Path(__file__).parent / "data" / "swesmith_profiles.json"
MIRROR_PREFIX = "swesmith/"


class UnknownProfileError(ValueError):
    """No SWE-smith profile swerl reproduces for the row's repository."""


@dataclass(frozen=True)
class SmithProfile:
    key: str  # owner__repo.commit8
    test_cmd: str
    min_testing: bool
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
    own_command = entry["own_test_cmd"] or (entry["own_test_files"] and entry["min_testing"])
    if own_command or parser.startswith("own:"):
        raise UnknownProfileError(
            f"{instance.instance_id}: SWE-smith's profile of {key} builds its test command or "
            "parses its log in code of its own, which swerl does not reproduce; grade it with "
            "evaluation.eval_script: swerl and a test_cmd"
        )
    return SmithProfile(
        key=key,
        test_cmd=str(entry["test_cmd"]),
        min_testing=bool(entry["min_testing"]),
        log_parser=parser,
        timeout=int(entry["timeout"]),
    )


def profile_test_command(instance: SWEInstance) -> str:
    """The command SWE-smith runs for the row (``get_test_cmd``): the profile's, with the
    graded test files appended under ``min_testing``."""
    profile = profile_for(instance)
    if not profile.min_testing:
        return profile.test_cmd
    files = _test_files(instance.FAIL_TO_PASS) + _test_files(instance.PASS_TO_PASS)
    return " ".join([profile.test_cmd, *files]) if files else profile.test_cmd


def _test_files(test_ids: list[str]) -> list[str]:
    """SWE-smith's ``get_test_files``: each id up to its first ``::``, sorted, once."""
    return sorted({test_id.split("::", 1)[0] for test_id in test_ids})
