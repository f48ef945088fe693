"""SWE-bench predictions files: the shapes the harness reads, and every bad input named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.datasets.loader import DatasetError
from services.datasets.predictions import (
    Prediction,
    PredictionsError,
    gold_predictions,
    load_predictions,
)
from services.protocol.instance import SWEInstance

IDS = ["a__b-1", "a__b-2", "c__d-3"]


def _pred(iid: str, patch: str | None = "diff --git a/x b/x\n", model: str = "org/m") -> dict:
    return {"instance_id": iid, "model_name_or_path": model, "model_patch": patch}


def _jsonl(tmp_path: Path, rows: list[object], name: str = "preds.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_in_file_order_with_empty_and_null_patches(tmp_path: Path) -> None:
    rows = [_pred("a__b-2", ""), {**_pred("a__b-1", None), "cost": 0.3}, _pred("c__d-3")]
    path = _jsonl(tmp_path, rows)
    path.write_text(path.read_text() + "\n\n")  # blank lines are ignored
    got = load_predictions(path, IDS)
    assert list(got) == ["a__b-2", "a__b-1", "c__d-3"]
    assert [p.is_empty for p in got.values()] == [True, True, False]
    assert got["c__d-3"].model_dir == "org__m"


def test_json_list_and_swe_agent_mapping(tmp_path: Path) -> None:
    rows = [_pred("a__b-1"), _pred("c__d-3")]
    listed = tmp_path / "p.json"
    listed.write_text(json.dumps(rows))
    mapped = tmp_path / "q.json"
    mapped.write_text(json.dumps({r["instance_id"]: r for r in rows}))
    assert list(load_predictions(listed, IDS)) == list(load_predictions(mapped, IDS))


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([_pred("a__b-1"), {"instance_id": "a__b-2", "model_name_or_path": "m"}],
         "preds.jsonl:line 2 (instance 'a__b-2'): missing required field 'model_patch'"),
        ([{**_pred("a__b-1"), "model_patch": 3}],
         "preds.jsonl:line 1 (instance 'a__b-1'): field 'model_patch': Input should be a valid "
         "string"),
        ([{**_pred("a__b-1"), "model_name_or_path": ""}],
         "line 1 (instance 'a__b-1'): field 'model_name_or_path'"),
        ([_pred("a__b-1"), _pred("c__d-3"), _pred("a__b-1")],
         "preds.jsonl:line 3: duplicate instance_id 'a__b-1' (first at line 1)"),
        ([_pred("a__b-1"), _pred("zz__top-9")],
         "1 prediction(s) for instances the dataset does not hold: 'zz__top-9' (line 2)"),
        ([["a__b-1"]], "preds.jsonl:line 1: expected a JSON object, got list"),
        ([], "preds.jsonl: no predictions in the file"),
    ],
)  # fmt: skip
def test_bad_predictions_are_named(tmp_path: Path, rows: list[object], message: str) -> None:
    with pytest.raises(PredictionsError if "does not hold" in message else DatasetError) as exc:
        load_predictions(_jsonl(tmp_path, rows), IDS)
    assert message in str(exc.value)


def test_invalid_json_missing_file_and_suffix(tmp_path: Path) -> None:
    bad = tmp_path / "preds.jsonl"
    bad.write_text(json.dumps(_pred("a__b-1")) + "\n{not json\n")
    with pytest.raises(DatasetError, match=r"preds.jsonl:line 2: invalid JSON"):
        load_predictions(bad, IDS)
    with pytest.raises(DatasetError, match="no such predictions file"):
        load_predictions(tmp_path / "nope.jsonl", IDS)
    with pytest.raises(DatasetError, match=r"must be a \.jsonl or \.json file"):
        load_predictions(tmp_path / "preds.csv", IDS)
    scalar = tmp_path / "s.json"
    scalar.write_text("3")
    with pytest.raises(DatasetError, match="must be a list"):
        load_predictions(scalar, IDS)


def test_gold_predictions_are_the_dataset_patches() -> None:
    patch = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    inst = SWEInstance(
        instance_id="a__b-1", repo="a/b", patch=patch, problem_statement="p",
        FAIL_TO_PASS=["t::x"], PASS_TO_PASS=[],
    )  # fmt: skip
    assert gold_predictions([inst]) == {
        "a__b-1": Prediction(instance_id="a__b-1", model_name_or_path="gold", model_patch=patch)
    }
