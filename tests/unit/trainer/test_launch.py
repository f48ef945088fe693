"""trainer.launch: N local ranks with the env:// rendezvous variables; a failing rank stops the
others and its exit status is returned."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from trainer.launch import launch

REPORT = (
    "import os, pathlib, sys; "
    "keys = ('RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'); "
    "out = pathlib.Path(sys.argv[1], os.environ['RANK']); "
    "out.write_text(' '.join(os.environ[k] for k in keys))"
)


def test_every_rank_gets_its_rendezvous_environment(tmp_path: Path) -> None:
    assert launch(["-c", REPORT, str(tmp_path)], 3) == 0
    seen = [(tmp_path / str(rank)).read_text().split() for rank in range(3)]
    assert [s[:3] for s in seen] == [["0", "0", "3"], ["1", "1", "3"], ["2", "2", "3"]]
    assert {s[3] for s in seen} == {"127.0.0.1"} and len({s[4] for s in seen}) == 1


def test_a_failing_rank_stops_the_others() -> None:
    hang_or_fail = (
        "import os, sys, time; time.sleep(60) if os.environ['RANK'] == '0' else sys.exit(4)"
    )
    start = time.monotonic()
    assert launch(["-c", hang_or_fail], 2) == 4
    assert time.monotonic() - start < 30  # rank 0 was killed, not waited for
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        launch(["-c", "pass"], 0)
