"""The trainer benchmark runs end to end and reports every figure issue 10 asks for.

Timings are not asserted (the machines are noisy); the test runs ``--quick --json`` and checks
that every phase is present and every figure is a finite positive number: step tokens/s of
the torch and the megatron backend side by side, the batch-building + objective share, peak
memory at two batch sizes with its linear fit, checkpoint save / load MB/s (both backends),
and the packer's padding waste.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow  # trains two models for a few steps in three processes

SCRIPT = REPO_ROOT / "bench" / "bench_trainer.py"
MODELS = ("tiny", "qwen3-20m")


def finite_positive(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_quick_benchmark_reports_every_phase(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--reps", "1", "--json", str(out),
         "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1200,  # a loaded 2-core machine; the run itself takes ~2-3 min
        check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    summary = json.loads(out.read_text())
    assert summary["quick"] is True and summary["device"] == "cpu"
    assert {"step", "memory", "checkpoint", "padding"} <= set(summary)

    step = summary["step"]
    assert step["reps"] == 1
    for model in MODELS:
        entry = step[model]
        for key in ("rows", "trajectories", "tokens", "action_tokens", "padded_tokens"):
            assert isinstance(entry[key], int) and entry[key] > 0, (model, key)
        assert entry["tokens"] <= entry["padded_tokens"]
        assert entry["parameters"]["actor"] > 0 and entry["parameters"]["critic_trainable"] > 0
        for part in ("build_s", "objective_s", "overhead_share"):
            assert all(finite_positive(v) for v in entry[part].values()), (model, part)
        assert entry["objective_calls_per_step"] == 2  # 1 + (K - 1), K = 2 critic passes
        for backend in ("torch", "megatron"):
            cell = entry["backends"][backend]
            assert cell["status"] == "ok", (model, backend, cell["status"])
            for part in ("step_s", "tokens_per_s"):
                assert all(finite_positive(v) for v in cell[part].values()), (model, part)
    # the ~20M model is the larger one
    assert step["qwen3-20m"]["parameters"]["actor"] > 50 * step["tiny"]["parameters"]["actor"]
    assert 15e6 < step["qwen3-20m"]["parameters"]["actor"] < 25e6

    memory = summary["memory"]
    assert memory["measure"] == "rss"
    for model in MODELS:
        fit = memory[model]
        points = fit["points"]
        assert [p["groups"] for p in points] == [1, 2]  # --quick: two sizes
        assert points[1]["padded_tokens"] > points[0]["padded_tokens"]
        assert all(finite_positive(p["peak_bytes"]) for p in points), model
        assert all(finite_positive(b) for b in fit["bytes_per_padded_token"]), model
        assert finite_positive(fit["slope_bytes_per_token"]), model
        assert math.isfinite(fit["intercept_bytes"]) and math.isfinite(fit["max_relative_residual"])
        assert all(finite_positive(r) for r in fit["token_ratio"] + fit["peak_ratio"]), model

    checkpoint = summary["checkpoint"]
    for model in MODELS:
        for backend in ("torch", "megatron"):
            cell = checkpoint[model][backend]
            assert cell["status"] == "ok" and finite_positive(cell["megabytes"]), (model, backend)
            for part in ("save_s", "load_s", "save_mb_per_s", "load_mb_per_s"):
                assert all(finite_positive(v) for v in cell[part].values()), (model, part)
    assert not any(p.name.startswith("swerl-bench-trainer-") for p in tmp_path.iterdir())

    padding = summary["padding"]
    assert padding["trajectories"] == 128 and padding["rows"] >= padding["trajectories"]
    assert padding["plans"] and padding["target"] == 0.10
    for plan in padding["plans"]:
        for key in ("groups_whole", "groups_whole_packed", "rows_free"):
            assert math.isfinite(plan[key]) and 0 <= plan[key] < 1, (plan, key)
        assert plan["groups_whole_packed"] <= plan["groups_whole"]
        assert plan["groups_whole_packed_lanes"] >= plan["groups_whole_packed_micro_batches"]
        assert plan["groups_whole_micro_batches"] >= 1 and plan["rows_free_micro_batches"] >= 1
