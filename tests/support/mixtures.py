"""A two-file training mixture built from the mini instances (tests/data/instances.jsonl): the
first five rows as JSONL (dataset ``gym``), the last five as parquet (dataset ``smith``). Row 5
(``swerl__strkit-2``) is in both files, so one instance id is reused across datasets, as
SWE-Gym and SWE-smith may do: only the ``<dataset>/<instance_id>`` key tells them apart."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.paths import REPO_ROOT

MINI = REPO_ROOT / "tests" / "data" / "instances.jsonl"
SHARED_ID = "swerl__strkit-2"


@dataclass(frozen=True)
class TwoFileMixture:
    spec: str  # gym=<jsonl>:<w>,smith=<parquet>:<w>
    gym: Path
    smith: Path
    rows: dict[str, dict[str, Any]]  # "<dataset>/<instance_id>" -> the row


def mini_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in MINI.read_text().splitlines() if line.strip()]


def write_two_file_mixture(
    directory: Path, gym_weight: float = 0.5, smith_weight: float = 0.5
) -> TwoFileMixture:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = mini_rows()
    gym_rows, smith_rows = rows[:5], rows[4:]
    assert gym_rows[-1]["instance_id"] == SHARED_ID == smith_rows[0]["instance_id"]
    gym = directory / "gym.jsonl"
    gym.write_text("".join(json.dumps(row) + "\n" for row in gym_rows))
    smith = directory / "smith.parquet"
    pq.write_table(pa.Table.from_pylist(smith_rows), smith)
    keyed = {f"gym/{r['instance_id']}": r for r in gym_rows}
    keyed |= {f"smith/{r['instance_id']}": r for r in smith_rows}
    spec = f"gym={gym}:{gym_weight},smith={smith}:{smith_weight}"
    return TwoFileMixture(spec, gym, smith, keyed)
