"""What the reward-channel hardening costs: a gold evaluation with and without it, side by side.

Usage (from the repository root)::

    .venv/bin/python bench/bench_eval_hardening.py            # 3 instances x 5 rounds
    .venv/bin/python bench/bench_eval_hardening.py --quick    # 2 instances x 2 rounds
    .venv/bin/python bench/bench_eval_hardening.py --json out.json

For each backend (real dockerd and bubblewrap) the gold patches of mini instances are evaluated,
interleaved round by round, under two configurations of the same code:

* ``hardened`` -- the training reward's defaults: the strict patch policy, the canaries and
  mutation canaries planted in the test files, ``.git`` hidden during the tests and the safe
  pytest launcher (docs/security.md);
* ``without`` -- the same evaluation with those four switched off (``patch_policy="harness"``,
  ``canary_test=False``, ``hide_git=False``, ``safe_sys_path=False``).

The steps both share (host-side checks, the git prelude before the infrastructure listing, the
``.git`` fingerprint, git isolation) are in both. It prints the median time of each and their
ratio; every evaluation must resolve (a hardening that failed a gold patch would show here).
Nothing asserts timings: the machines are noisy, the ratio is what to read.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

INSTANCES = ("swerl__spanlib-1", "swerl__strkit-1", "swerl__tinyini-2")


def _configs() -> dict[str, Any]:
    from sandbox_worker.evaluation import EvalConfig

    hardened = EvalConfig(test_timeout_s=300)
    without = hardened.model_copy(
        update={
            "patch_policy": "harness",
            "canary_test": False,
            "hide_git": False,
            "safe_sys_path": False,
        }
    )
    return {"hardened": hardened, "without": without}


def run(quick: bool) -> dict[str, Any]:
    from sandbox_worker.backends import make_backend
    from sandbox_worker.evaluation import evaluate_patch
    from sandbox_worker.images import DEFAULT_INSTANCES, instance_image
    from services.datasets import load_instances
    from tests.support.docker import build_task_images, ensure_dockerd

    names = INSTANCES[:2] if quick else INSTANCES
    rounds = 2 if quick else 5
    ensure_dockerd()
    build_task_images()  # cached: a no-op when current
    instances = {i.instance_id: i for i in load_instances(DEFAULT_INSTANCES, only=list(names))}
    configs = _configs()
    node = f"bench-eh-{os.getpid() % 100000}"
    root = Path(tempfile.mkdtemp(prefix="swerl-eh-"))  # short: unix socket paths
    out: dict[str, Any] = {"instances": list(names), "rounds": rounds}
    try:
        for kind in ("docker", "bwrap"):
            backend = make_backend(kind, state_root=root / kind)
            times: dict[str, list[float]] = {name: [] for name in configs}
            failures: list[str] = []
            for round_ in range(rounds + 1):  # round 0 warms caches and is not counted
                order = list(configs) if round_ % 2 else list(reversed(configs))
                for name in order:
                    for instance_id in names:
                        inst = instances[instance_id]
                        report = evaluate_patch(
                            backend,
                            inst,
                            inst.patch,
                            instance_image(instance_id),
                            node=node,
                            config=configs[name],
                        )
                        if not report.resolved:
                            failures.append(f"{name}/{instance_id}: {report.infra_error}")
                        if round_:
                            times[name].append(report.duration_s)
            backend.cleanup_node(node)
            medians = {name: statistics.median(values) for name, values in times.items()}
            out[kind] = {
                "median_s": medians,
                "ratio_hardened_over_without": medians["hardened"] / medians["without"],
                "not_resolved": failures,
            }
            print(
                f"{kind:6s}: hardened {medians['hardened']:.2f} s, without {medians['without']:.2f}"
                f" s per gold evaluation (median of {len(times['hardened'])}): ratio "
                f"{out[kind]['ratio_hardened_over_without']:.2f}"
                + (f"; NOT RESOLVED: {failures}" if failures else "")
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["load_average_1m"] = os.getloadavg()[0]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 instances x 2 rounds")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures = run(args.quick)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    failed = any(figures[kind]["not_resolved"] for kind in ("docker", "bwrap"))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
