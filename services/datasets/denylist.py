"""An instance deny-list: ids that must never be trained on or validated (broken, flaky,
contaminated), each with the reason it is there.

File format: one instance id per line, optionally followed by ``#`` and the reason; blank lines
and lines that are only a comment are ignored::

    # flaky on gold (timing-dependent test)
    astropy__astropy-7606   # PASS_TO_PASS test fails on gold
    django__django-10097

An id that is not a valid instance id, or one listed twice, is an error naming the line.
:func:`apply_denylist` splits a dataset into the instances kept and those denied, so callers
can report what they left out instead of dropping it silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from services.datasets.loader import DatasetError, read_text
from services.protocol.ids import split_instance_key
from services.protocol.instance import SWEInstance


def load_denylist(path: str | Path) -> dict[str, str]:
    """Denied instance id -> reason (``""`` when the line gives none), in file order. A line
    is a plain id (denied in every dataset) or a ``<dataset>/<instance id>`` key (only that
    dataset's entry of a training mixture)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such deny-list file")
    denied: dict[str, str] = {}
    where: dict[str, int] = {}
    for lineno, line in enumerate(read_text(path).splitlines(), start=1):
        entry, _, reason = line.partition("#")
        iid = entry.strip()
        if not iid:
            continue
        try:
            split_instance_key(iid)
        except ValueError:
            raise DatasetError(
                f"{path}:line {lineno}: not an instance id or <dataset>/<id> key: {iid!r}"
            ) from None
        if iid in denied:
            raise DatasetError(f"{path}:line {lineno}: {iid!r} is listed twice (line {where[iid]})")
        denied[iid], where[iid] = reason.strip(), lineno
    return denied


def apply_denylist(
    instances: Sequence[SWEInstance], denied: Mapping[str, str]
) -> tuple[list[SWEInstance], list[SWEInstance]]:
    """``(kept, denied)``, both in dataset order."""
    kept = [inst for inst in instances if inst.instance_id not in denied]
    dropped = [inst for inst in instances if inst.instance_id in denied]
    return kept, dropped
