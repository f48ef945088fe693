"""One SWE-bench-style task instance, as stored in SWE-bench / SWE-Gym / SWE-smith datasets.

The field names are SWE-bench's own (``instance_id``, ``repo``, ``base_commit``, ``patch``,
``test_patch``, ``problem_statement``, ``hints_text``, ``created_at``, ``version``,
``FAIL_TO_PASS``, ``PASS_TO_PASS``, ``environment_setup_commit``), so a dataset row validates
as is. The variants differ in details this model absorbs:

* ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` are JSON-encoded strings in SWE-bench's Hugging Face
  rows and plain lists in SWE-Gym / SWE-smith / parquet files: both are accepted, and
  :meth:`SWEInstance.to_swebench_dict` writes the JSON-string form back.
* SWE-smith rows (``repo`` in SWE-smith's mirror organisation, ``swesmith/<owner>__<name>.
  <commit8>``; :attr:`SWEInstance.is_swesmith`) have no ``base_commit`` and no ``test_patch``,
  and their ``patch`` is the diff that *introduces* the bug into the repository snapshot of
  their image: the fix, :attr:`SWEInstance.gold_patch`, is its reverse. The task state (bug
  applied, failing tests hidden) is made in each sandbox by :mod:`sandbox_worker.task_state`,
  which gives the rest of the pipeline a SWE-bench-shaped instance (``base_commit`` the task
  commit, ``test_patch`` the hidden tests).
* Unknown extra columns (SWE-smith's ``image_name``, SWE-bench Verified's ``difficulty``,
  ``meta``...) are kept on purpose (``model_extra``, written back by ``to_swebench_dict``), not
  rejected: image naming and reports read them, and a loader that dropped columns would make
  a round trip lossy.
* ``patch`` and ``test_patch`` must parse as unified diffs (:mod:`services.protocol.diffs`):
  a truncated or garbled gold patch is that row's error, not a silent 0 reward later.

``test_cmd`` is swerl's extension: the command (before the test files) that runs the
instance's tests; ``None`` means the evaluation's default pytest command.
"""

from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.protocol.diff_reverse import reverse_unified_diff
from services.protocol.diffs import unified_diff_problem

# instance ids appear in sandbox names, image tags and Redis keys: keep them to a safe alphabet.
INSTANCE_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._+\-]{0,199}$"
REPO_PATTERN = r"^[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+$"
# SWE-smith's GitHub organisation of repository mirrors: its rows' ``repo`` is
# ``swesmith/<owner>__<name>.<commit8>``.
SWESMITH_ORG = "swesmith"
# A commit hash or ref name; never whitespace or shell metacharacters.
GIT_REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/\-]{0,199}$"


class SWEInstance(BaseModel):
    """A task instance; validation errors name the offending field."""

    model_config = ConfigDict(extra="allow", frozen=True)

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN)
    repo: str = Field(pattern=REPO_PATTERN)
    base_commit: str | None = Field(default=None, pattern=GIT_REF_PATTERN)
    patch: str = Field(min_length=1)  # the gold patch (non-test files only)
    test_patch: str = ""
    problem_statement: str
    hints_text: str = ""
    created_at: str = ""
    version: str = ""
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str]
    environment_setup_commit: str | None = Field(default=None, pattern=GIT_REF_PATTERN)
    test_cmd: str | None = Field(default=None, min_length=1)

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _decode_test_list(cls, value: Any) -> Any:
        """Accept a JSON-encoded list (SWE-bench rows) as well as a list or tuple."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not a JSON-encoded list of test ids: {exc.msg}") from None
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, list):
            for item in value:
                if not isinstance(item, str) or not item.strip():
                    raise ValueError(f"test ids must be non-empty strings, got {item!r}")
        return value

    @field_validator("patch", "test_patch")
    @classmethod
    def _parses_as_a_diff(cls, value: str) -> str:
        problem = unified_diff_problem(value) if value else None
        if problem:
            raise ValueError(f"is not a unified diff: {problem}")
        return value

    @model_validator(mode="after")
    def _swesmith_bug_reverses(self) -> SWEInstance:
        """A SWE-smith row's gold patch is the reverse of its ``patch``: it must have one."""
        if self.is_swesmith:
            try:
                reverse_unified_diff(self.patch)
            except ValueError as exc:
                raise ValueError(
                    f"patch: a SWE-smith bug patch must be reversible: {exc}"
                ) from None
        return self

    @field_validator("version", "created_at", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        """Datasets store versions as floats (``3.0``) and dates as timestamps; keep strings."""
        if isinstance(value, datetime | date):
            return value.isoformat()
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        return "" if value is None else value

    @field_validator("hints_text", "test_patch", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    @property
    def is_swesmith(self) -> bool:
        """A SWE-smith row: its ``patch`` introduces the bug (module docstring)."""
        return self.repo.startswith(SWESMITH_ORG + "/")

    @property
    def gold_patch(self) -> str:
        """The patch that resolves the instance: ``patch``, or its reverse for SWE-smith."""
        return reverse_unified_diff(self.patch) if self.is_swesmith else self.patch

    @property
    def base_ref(self) -> str:
        """The revision patches are taken against: ``base_commit``, else the image's ``HEAD``."""
        return self.base_commit or "HEAD"

    def to_swebench_dict(self) -> dict[str, Any]:
        """The SWE-bench row form: test lists JSON-encoded, unset optional fields omitted."""
        row = self.model_dump(exclude_none=True)
        row["FAIL_TO_PASS"] = json.dumps(self.FAIL_TO_PASS)
        row["PASS_TO_PASS"] = json.dumps(self.PASS_TO_PASS)
        return row
