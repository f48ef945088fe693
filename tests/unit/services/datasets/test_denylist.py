"""The instance deny-list: file format, its errors, and splitting a dataset with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.datasets import DatasetError, load_instances
from services.datasets.denylist import apply_denylist, load_denylist
from tests.support.paths import TEST_DATA


def test_ids_with_and_without_reasons(tmp_path: Path) -> None:
    path = tmp_path / "deny.txt"
    path.write_text(
        "# flaky instances\n\nswerl__tinyini-1   # P2P fails on gold\nswerl__strkit-3\n  \n"
    )
    assert load_denylist(path) == {"swerl__tinyini-1": "P2P fails on gold", "swerl__strkit-3": ""}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ok-1\nbad id here\n", r"line 2: not an instance id or <dataset>/<id> key: 'bad id here'"),
        ("ok-1\n/ok-2\n", r"line 2: not an instance id or <dataset>/<id> key: '/ok-2'"),
        ("ok-1\na b/ok-2\n", r"line 2: not an instance id or <dataset>/<id> key: 'a b/ok-2'"),
        ("a-1\nb-2 # x\na-1 # again\n", r"line 3: 'a-1' is listed twice \(line 1\)"),
    ],
)
def test_bad_lines_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "deny.txt"
    path.write_text(text)
    with pytest.raises(DatasetError, match=message):
        load_denylist(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such deny-list file"):
        load_denylist(tmp_path / "nope.txt")


def test_apply_keeps_order_and_reports_the_denied() -> None:
    instances = load_instances(TEST_DATA / "instances.jsonl")
    ids = [inst.instance_id for inst in instances]
    denied = {ids[1]: "broken", ids[-1]: "", "not-in-the-set": ""}
    kept, dropped = apply_denylist(instances, denied)
    assert [inst.instance_id for inst in kept] == [ids[0], *ids[2:-1]]
    assert [inst.instance_id for inst in dropped] == [ids[1], ids[-1]]
