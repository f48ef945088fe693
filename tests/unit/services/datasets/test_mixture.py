"""The ``--dataset`` mixture: parsing and validation, namespacing, the seeded sampler."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from services.datasets import DatasetError
from services.datasets.mixture import (
    MixtureSampler,
    load_mixture,
    mixture_argument,
    parse_mixture,
)

PATCH = "diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1 @@\n-a\n+b\n"


def row(instance_id: str, **extra: Any) -> dict[str, Any]:
    return {
        "instance_id": instance_id,
        "repo": "octo/lib",
        "patch": PATCH,
        "problem_statement": "It breaks.",
        "FAIL_TO_PASS": ["t.py::test_new"],
        "PASS_TO_PASS": [],
        **extra,
    }


def write_jsonl(path: Path, ids: list[str]) -> Path:
    path.write_text("".join(json.dumps(row(iid)) + "\n" for iid in ids))
    return path


@pytest.fixture
def two_files(tmp_path: Path) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    gym = tmp_path / "swe-gym.parquet"
    pq.write_table(pa.Table.from_pylist([row(f"octo__lib-{n}") for n in range(4)]), gym)
    smith = write_jsonl(tmp_path / "swe-smith.jsonl", ["octo__lib-0", "octo__lib.ab12.x__1"])
    return gym, smith


def test_parse_names_and_normalises_weights(two_files: tuple[Path, Path]) -> None:
    gym, smith = two_files
    mixture = parse_mixture(f"{gym}:3, {smith}:1")
    assert [(p.name, p.path, p.weight) for p in mixture.parts] == [
        ("swe-gym", gym, 0.75),
        ("swe-smith", smith, 0.25),
    ]
    named = parse_mixture(f"gym={gym},{smith}")  # default weight 1 each
    assert [(p.name, p.weight) for p in named.parts] == [("gym", 0.5), ("swe-smith", 0.5)]


def test_a_colon_in_the_path_is_not_a_weight(tmp_path: Path) -> None:
    folder = tmp_path / "at:10"
    folder.mkdir()
    path = write_jsonl(folder / "d.jsonl", ["octo__lib-1"])
    (part,) = parse_mixture(str(path)).parts
    assert part.path == path and part.weight == 1.0


def test_duplicate_ids_across_files_are_namespaced(two_files: tuple[Path, Path]) -> None:
    gym, smith = two_files
    loaded = load_mixture(parse_mixture(f"{gym}:0.5,{smith}:0.5"))
    keys = [entry.key for entries in loaded.values() for entry in entries]
    assert "swe-gym/octo__lib-0" in keys and "swe-smith/octo__lib-0" in keys
    assert len(keys) == len(set(keys)) == 6


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", "empty part"),
        ("{gym},", "empty part"),
        ("{gym}:0", "weight must be a positive number"),
        ("{gym}:-1", "weight must be a positive number"),
        ("{gym}:nan", "weight must be a positive number"),
        ("{gym}:inf", "weight must be a positive number"),
        ("{gym}:half", "weight 'half' is not a number"),
        ("{gym},{gym}", "name 'swe-gym' is used for both"),
        ("a={gym},b={gym}", "is given twice"),
        ("{dir}/missing.jsonl:1", "no such dataset file"),
        ("{dir}/data.csv:1", "unsupported dataset format"),
        ("bad name={gym}", "name 'bad name' must match"),
    ],
)
def test_invalid_specs(two_files: tuple[Path, Path], spec: str, expected: str) -> None:
    gym, _ = two_files
    with pytest.raises(DatasetError, match=expected):
        parse_mixture(spec.format(gym=gym, dir=gym.parent))


def test_argparse_type_is_a_usage_error(
    two_files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", type=mixture_argument, required=True)
    assert parser.parse_args(["--dataset", f"{two_files[0]}:2"]).dataset.parts[0].weight == 1.0
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["--dataset", f"{two_files[0]}:0"])
    assert info.value.code == 2
    assert "weight must be a positive number" in capsys.readouterr().err


def test_a_bad_row_in_a_part_names_its_file_and_line(two_files: tuple[Path, Path]) -> None:
    gym, smith = two_files
    smith.write_text(json.dumps(row("ok")) + "\n" + json.dumps(row("bad", patch="junk")) + "\n")
    with pytest.raises(DatasetError, match=rf"{smith}:line 2 \(instance 'bad'\): field 'patch'"):
        MixtureSampler(parse_mixture(f"{gym},{smith}"), seed=0)


def test_sampler_is_deterministic_and_follows_the_weights(two_files: tuple[Path, Path]) -> None:
    mixture = parse_mixture(f"{two_files[0]}:0.8,{two_files[1]}:0.2")
    first = [e.key for e in MixtureSampler(mixture, seed=7).draw(2000)]
    again = MixtureSampler(mixture, seed=7)
    assert [e.key for e in again.draw(1000) + again.draw(1000)] == first
    assert [e.key for e in MixtureSampler(mixture, seed=8).draw(2000)] != first
    share = Counter(key.split("/", 1)[0] for key in first)
    assert 0.75 < share["swe-gym"] / 2000 < 0.85  # binomial sd ~0.009: 5+ sd of room


def test_sampler_visits_every_instance_once_per_pass(two_files: tuple[Path, Path]) -> None:
    gym, _ = two_files
    entries = MixtureSampler(parse_mixture(str(gym)), seed=3).draw(12)
    passes = [sorted(e.key for e in entries[n : n + 4]) for n in range(0, 12, 4)]
    assert passes == [[f"swe-gym/octo__lib-{n}" for n in range(4)]] * 3
    assert [e.key for e in entries[:4]] != [e.key for e in entries[4:8]] or [
        e.key for e in entries[4:8]
    ] != [e.key for e in entries[8:12]]  # reshuffled between passes
    with pytest.raises(ValueError, match="count must be >= 0"):
        MixtureSampler(parse_mixture(str(gym)), seed=3).draw(-1)
