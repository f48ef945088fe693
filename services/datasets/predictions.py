"""SWE-bench predictions files: ``instance_id``, ``model_name_or_path``, ``model_patch``.

The shape the official harness's ``run_evaluation`` reads (``swebench.harness.utils.
get_predictions_from_file``): ``.jsonl`` (one prediction per line, blank lines ignored) or
``.json`` (a list of predictions, or SWE-agent's ``{instance_id: prediction}`` mapping); the
literal ``gold`` stands for the dataset's own patches (model ``gold``). ``model_patch`` may be
``null`` or empty: such a prediction is an empty patch (never run, counted as
``empty_patch``). Extra fields (costs, trajectories...) are ignored.

Validated at the boundary, all of it before anything runs: a malformed line names the file,
the line (or item) and the field; duplicate ids name both places; ids the dataset does not hold
are listed. Every problem is a :class:`PredictionsError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from services.datasets.loader import (
    DatasetError,
    invalid_json,
    jsonl_records,
    read_text,
    validate_record,
)
from services.protocol.instance import INSTANCE_ID_PATTERN, SWEInstance

GOLD = "gold"


class PredictionsError(DatasetError):
    """A predictions file is missing, unreadable, malformed or names unknown instances."""


class Prediction(BaseModel):
    """One prediction, as SWE-bench writes it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: str = Field(pattern=INSTANCE_ID_PATTERN)
    model_name_or_path: str = Field(min_length=1, max_length=500)
    model_patch: str | None

    @property
    def is_empty(self) -> bool:
        """The harness's empty patch: ``""`` or ``None`` (never run)."""
        return self.model_patch in ("", None)

    @property
    def model_dir(self) -> str:
        """The model's directory name in the harness's log layout (``/`` -> ``__``)."""
        return self.model_name_or_path.replace("/", "__")


def gold_predictions(instances: Sequence[SWEInstance]) -> dict[str, Prediction]:
    """The dataset's own patches as predictions (the harness's ``--predictions_path gold``)."""
    return {
        inst.instance_id: Prediction(
            instance_id=inst.instance_id, model_name_or_path=GOLD, model_patch=inst.patch
        )
        for inst in instances
    }


def load_predictions(path: str | Path, dataset_ids: Sequence[str]) -> dict[str, Prediction]:
    """Every prediction of ``path`` by instance id, in file order; each id must be one of
    ``dataset_ids``."""
    path = Path(path)
    found: dict[str, Prediction] = {}
    where_of: dict[str, str] = {}
    for where, record in _records(path):
        prediction = validate_record(path, where, record, Prediction)
        iid = prediction.instance_id
        if iid in found:
            raise PredictionsError(
                f"{path}:{where}: duplicate instance_id {iid!r} (first at {where_of[iid]})"
            )
        found[iid], where_of[iid] = prediction, where
    if not found:
        raise PredictionsError(f"{path}: no predictions in the file")
    known = set(dataset_ids)
    unknown = [iid for iid in found if iid not in known]
    if unknown:
        shown = ", ".join(f"{iid!r} ({where_of[iid]})" for iid in unknown[:10])
        more = f" and {len(unknown) - 10} more" if len(unknown) > 10 else ""
        raise PredictionsError(
            f"{path}: {len(unknown)} prediction(s) for instances the dataset does not hold: "
            f"{shown}{more}"
        )
    return found


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json"):
        raise PredictionsError(f"{path}: predictions must be a .jsonl or .json file")
    if not path.is_file():
        raise PredictionsError(f"{path}: no such predictions file")
    text = read_text(path)
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise invalid_json(path, exc.lineno, exc) from None
        if isinstance(data, dict):  # SWE-agent's {instance_id: prediction}
            data = list(data.values())
        if not isinstance(data, list):
            raise PredictionsError(
                f"{path}: a .json predictions file must be a list (or an id -> prediction map)"
            )
        for index, item in enumerate(data, start=1):
            yield f"item {index}", item
        return
    yield from jsonl_records(path, text)
