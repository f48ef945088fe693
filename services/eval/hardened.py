"""The hardened verdict and tamper flags ``swerl eval`` reports next to the official verdict.

Why: the official harness grades the tree a prediction left, with GNU ``patch`` as its last
apply fallback, so a prediction that plants a ``conftest.py``, rewrites ``.git/config`` through
a context diff or forges its test results can be counted resolved on a public leaderboard.
``swerl eval`` keeps that verdict untouched (``resolved``: leaderboard parity) and grades every
prediction a second time as training rewards are graded (strict patch parsing, test
infrastructure restored, structured report and canaries where swerl's script runs:
``grade.hardened_config``). Each prediction then gets:

* ``resolved``: the official verdict (the run report's ``resolved_ids``);
* ``hardened_resolved``: the hardened pass's verdict (None: not run, or its infrastructure
  failed);
* ``tamper``: the flags either pass found (``EvalReport.tamper``: ``test_infra_touched``,
  ``git_touched``, ``patch_refused_strict``, ``canary_forged``), plus
  ``resolved_only_official`` when the official pass resolved it and the hardened one did not.

One ``hardened.json`` per graded instance (next to its ``report.json``) keeps the verdict, so
``--resume`` and the run report read it back as they read the harness's files; the run
report's extra keys are :func:`summary_keys` (new keys only, the harness's stay as they are).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sandbox_worker.evaluation import EvalReport

HARDENED_FILE = "hardened.json"  # the verdict of one instance, next to report.json
HARDENED_LOG = "hardened.log"  # the hardened pass's transcript
RESOLVED_ONLY_OFFICIAL = "resolved_only_official"
# The flags the evaluation reports (EvalReport.tamper), then swerl eval's own; every one gets a
# count in the run report (0 included) so that readers see the same shape every run.
EVALUATION_FLAGS = ("test_infra_touched", "git_touched", "patch_refused_strict", "canary_forged")
KNOWN_FLAGS = (*EVALUATION_FLAGS, RESOLVED_ONLY_OFFICIAL)

HardenedStatus = Literal["resolved", "unresolved", "error", "not_run"]
_STATUSES = ("resolved", "unresolved", "error", "not_run")


@dataclass(frozen=True)
class Verdict:
    """Both verdicts of one prediction and what its passes found."""

    instance_id: str
    resolved: bool  # the official verdict
    hardened_status: HardenedStatus  # as the harness's categories, or not_run
    hardened_detail: str = ""  # why it is not resolved under the hardened grading
    hardened_infra: bool = False  # the hardened pass hit an infrastructure failure
    flags: tuple[str, ...] = ()  # the evaluation's flags, both passes
    infra_touched: dict[str, str] = field(default_factory=dict)  # path -> reason
    strict_refusal: str | None = None  # why the strict parser refuses the patch

    @property
    def hardened_resolved(self) -> bool | None:
        """None when the hardened pass did not run or its infrastructure failed: unknown,
        never counted as a failure of the prediction."""
        if self.hardened_status == "not_run" or self.hardened_infra:
            return None
        return self.hardened_status == "resolved"

    @property
    def tamper(self) -> list[str]:
        """The flags, sorted, with ``resolved_only_official`` when the verdicts disagree."""
        found = set(self.flags)
        if self.resolved and self.hardened_resolved is False:
            found.add(RESOLVED_ONLY_OFFICIAL)
        return sorted(found)

    def to_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "resolved": self.resolved,
            "hardened_resolved": self.hardened_resolved,
            "hardened_status": self.hardened_status,
            "hardened_detail": self.hardened_detail,
            "hardened_infra": self.hardened_infra,
            "tamper": self.tamper,
            "flags": list(self.flags),
            "infra_touched": dict(self.infra_touched),
            "strict_refusal": self.strict_refusal,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        """The verdict ``to_json`` wrote; ValueError for anything else (a damaged file)."""
        status = data.get("hardened_status")
        if status not in _STATUSES:
            raise ValueError(f"hardened_status {status!r} is not one of {_STATUSES}")
        flags = data.get("flags", [])
        touched = data.get("infra_touched", {})
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise ValueError("flags must be a list of strings")
        if not isinstance(touched, dict):
            raise ValueError("infra_touched must be a map")
        return cls(
            instance_id=str(data["instance_id"]),
            resolved=bool(data["resolved"]),
            hardened_status=status,
            hardened_detail=str(data.get("hardened_detail", "")),
            hardened_infra=bool(data.get("hardened_infra", False)),
            flags=tuple(flags),
            infra_touched={str(k): str(v) for k, v in touched.items()},
            strict_refusal=data.get("strict_refusal"),
        )


def combine(
    official: EvalReport,
    official_resolved: bool,
    hardened: EvalReport | None,
    hardened_grade: tuple[str, str, bool] | None,
) -> Verdict:
    """The verdict of one prediction from its official report and, when the hardened pass
    ran, its report and ``grade.verdict`` of it (status, why, infrastructure failure)."""
    reports = [official] if hardened is None else [official, hardened]
    flags = sorted({flag for report in reports for flag in report.tamper})
    touched: dict[str, str] = {}
    for report in reports:
        touched.update(report.infra_touched)
    refusal = next((r.strict_refusal for r in reversed(reports) if r.strict_refusal), None)
    if hardened is None or hardened_grade is None:
        why = "the official pass hit an infrastructure failure" if official.infra_error else ""
        return Verdict(
            official.instance_id, official_resolved, "not_run", why or "--no-hardened",
            flags=tuple(flags), infra_touched=touched, strict_refusal=refusal,
        )  # fmt: skip
    status, detail, infra = hardened_grade
    return Verdict(
        official.instance_id, official_resolved, status,  # type: ignore[arg-type]
        detail, infra, tuple(flags), touched, refusal,
    )  # fmt: skip


def write_verdict(log_dir: Path, verdict: Verdict) -> None:
    (log_dir / HARDENED_FILE).write_text(json.dumps(verdict.to_json(), indent=4) + "\n")


def read_verdict(log_dir: Path) -> Verdict | None:
    """The instance's verdict; None when there is none or it is damaged (then the instance
    counts as without a hardened verdict, and ``--resume`` grades it again)."""
    try:
        return Verdict.from_json(json.loads((log_dir / HARDENED_FILE).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def is_hardened(verdict: Verdict | None) -> bool:
    """The hardened pass ran to a verdict (``--resume`` need not grade the instance again)."""
    return verdict is not None and verdict.hardened_resolved is not None


def summary_keys(
    verdicts: Mapping[str, Verdict | None], official_resolved: Iterable[str], enabled: bool
) -> dict[str, Any]:
    """The run report's extra keys for the instances graded (non-empty predictions) ->
    their verdicts (None: no ``hardened.json``); the official verdict is the run report's."""
    resolved = set(official_resolved)
    fixed = {
        iid: _with_official(iid, v, iid in resolved)
        for iid, v in sorted(verdicts.items())
        if v is not None
    }
    by_status: dict[str, list[str]] = {s: [] for s in _STATUSES}
    for iid, v in fixed.items():
        by_status[v.hardened_status].append(iid)
    missing = sorted([*by_status["not_run"], *(i for i, v in verdicts.items() if v is None)])
    tamper_ids: dict[str, list[str]] = {flag: [] for flag in KNOWN_FLAGS}
    for iid, v in fixed.items():
        for flag in v.tamper:
            tamper_ids.setdefault(flag, []).append(iid)
    return {
        "hardened_evaluation": enabled,
        "hardened_resolved_instances": len(by_status["resolved"]),
        "hardened_resolved_ids": by_status["resolved"],
        "hardened_unresolved_ids": by_status["unresolved"],
        "hardened_error_ids": by_status["error"],
        "hardened_infra_failure_ids": sorted(i for i, v in fixed.items() if v.hardened_infra),
        "hardened_missing_ids": missing,
        "tamper_counts": {flag: len(ids) for flag, ids in tamper_ids.items()},
        "tamper_ids": tamper_ids,
        "tampered_ids": sorted(i for i, v in fixed.items() if v.tamper),
        "verdicts": {iid: v.to_json() for iid, v in fixed.items()},
    }


def _with_official(iid: str, verdict: Verdict, resolved: bool) -> Verdict:
    """The verdict with the run report's official verdict (the harness's files decide)."""
    if verdict.instance_id == iid and verdict.resolved == resolved:
        return verdict
    return Verdict(
        iid, resolved, verdict.hardened_status, verdict.hardened_detail, verdict.hardened_infra,
        verdict.flags, verdict.infra_touched, verdict.strict_refusal,
    )  # fmt: skip


def summary_lines(report: Mapping[str, Any]) -> list[str]:
    """The lines printed after the harness's: the hardened resolved rate next to the official
    one, then each flag with its count and ids."""
    total = int(report["total_instances"])
    official = int(report["resolved_instances"])
    lines = []
    if report.get("hardened_evaluation"):
        hardened = int(report["hardened_resolved_instances"])
        rate = 100.0 * hardened / total if total else 0.0
        line = f"Hardened verdict: resolved {hardened}/{total} ({rate:.1f}%), official {official}"
        missing = report["hardened_missing_ids"]
        lines.append(line + (f"; no hardened verdict for {len(missing)}" if missing else ""))
    else:
        lines.append("Hardened verdict: not run (--no-hardened); flags of the official pass only")
    flagged = report["tampered_ids"]
    lines.append(f"Predictions with tamper flags: {len(flagged)}")
    for flag, ids in report["tamper_ids"].items():
        if ids:
            shown = ", ".join(ids[:10]) + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")
            lines.append(f"  {flag}: {len(ids)} ({shown})")
    return lines
