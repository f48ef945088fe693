"""The algorithms benchmark runs end to end and reports every figure the issue asks for.

Timings are not asserted (the machines are noisy); the test reads the bench's ``--json``
summary and checks that the script runs in its pinned-allocator mode, times every objective
against GRPO, covers both thread settings and both reward layouts of GAE, measures peak
memory at both sizes, and that the vectorised GAE it times agrees with its loop reference.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow  # runs the benchmark in three processes (~30 s on 2 cores)

SCRIPT = REPO_ROOT / "bench" / "bench_algorithms.py"
# The candidates, each compared with GRPO.
CANDIDATES = ("li2sao-bootstrap", "li2sao-gae", "pact-actor", "pact-critic", "srppo")


def finite_positive(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_quick_benchmark_reports_ratios_and_agrees_with_the_loop(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("SWERL_BENCH_MALLOC_PINNED", None)
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--reps", "2", "--clock", "cpu",
         "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    summary = json.loads(out.read_text())
    assert summary["allocator"] == "pinned"  # re-executed itself with the timing allocator
    assert (summary["n"], summary["t"]) == (64, 2048)  # --quick

    objective = summary["objective"]
    assert objective["clock"] == "cpu" and objective["reps"] == 2
    assert set(objective["seconds"]) == {"grpo", *CANDIDATES}
    for kind, parts in objective["seconds"].items():
        for part in ("fwd", "both"):
            assert finite_positive(parts[part]["min"]), (kind, part)
            assert parts[part]["median"] >= parts[part]["min"], (kind, part)
    assert set(objective["ratio_to_grpo"]) == set(CANDIDATES)
    for kind, parts in objective["ratio_to_grpo"].items():
        for part in ("fwd", "both"):
            for stat in ("min", "median"):
                assert finite_positive(parts[part][stat]), (kind, part, stat)

    # GAE: one torch thread, then torch's default (the same when that default is 1).
    default = summary["torch_default_threads"]
    assert isinstance(default, int) and default >= 1
    gae = summary["gae"]
    assert [g["threads"] for g in gae] == sorted({1, default})
    for g in gae:
        assert set(g["min_seconds"]) == {"loop", "same_rows", "per_token", "outcome"}
        assert all(finite_positive(s) for s in g["min_seconds"].values()), g
        assert finite_positive(g["speedup_same_rows"]), g
        assert set(g["speedup_per_row"]) == {"per_token", "outcome"}  # both reward layouts
        assert all(finite_positive(s) for s in g["speedup_per_row"].values()), g
        assert 0 <= g["max_abs_error"] < 1e-5  # the vectorised GAE agrees with the loop

    memory = summary["memory"]
    assert memory["measure"] == "rss"
    assert memory["sizes"] == [[32, 2048], [64, 2048]]  # N/2 x T, then N x T
    assert set(memory["peak_bytes"]) == {"grpo", *CANDIDATES}
    for kind, peaks in memory["peak_bytes"].items():
        assert len(peaks) == 2 and all(finite_positive(p) for p in peaks), kind
        assert finite_positive(memory["ratio"][kind]), kind
