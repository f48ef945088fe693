"""The algorithms benchmark runs end to end and reports every figure the issue asks for.

Timings are not asserted (the machines are noisy); the test checks that the script runs in its
pinned-allocator mode, covers both thread settings and both reward layouts, and that the
vectorised GAE it times agrees with its loop reference.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "bench" / "bench_algorithms.py"


def test_quick_benchmark_reports_ratios_and_agrees_with_the_loop() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("SWERL_BENCH_MALLOC_PINNED", None)
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--no-memory", "--reps", "2", "--clock", "cpu"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert "allocator: pinned" in out  # re-executed itself with the timing allocator settings
    assert "objective time (cpu clock)" in out
    for kind in ("li2sao-bootstrap", "li2sao-gae", "pact-actor", "pact-critic", "srppo"):
        assert re.search(rf"ratio {kind} / grpo: forward [\d.]+x .* fwd\+bwd [\d.]+x", out), kind
    threads = {
        int(t) for t in re.findall(r"GAE \(gamma=1, lambda=0\.95\), torch threads (\d+)", out)
    }
    default = re.search(r"torch default threads (\d+)", out)
    assert default and int(default.group(1)) >= 1
    assert threads == {1, int(default.group(1))}  # one thread, then torch's default
    assert len(re.findall(r"full batch vs loop: \d+x \(\[N, T\] rewards\)", out)) == len(threads)
    assert len(re.findall(r"full batch vs loop: \d+x \(\[N\] outcomes\)", out)) == len(threads)
    errors = [float(e) for e in re.findall(r"max \|vectorised - loop\| = ([\d.e+-]+)", out)]
    assert errors and max(errors) < 1e-5
