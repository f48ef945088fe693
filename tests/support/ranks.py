"""Run a module as the ranks of a gloo group: ``python -m MODULE RANK WORLD PORT *ARGS`` each.

The worker modules (tests.support.dp_worker, tests.support.dp_checkpoint_worker) join the group
on ``tcp://127.0.0.1:PORT``; :func:`run_ranks` fails with every rank's output tail if any rank
exits non-zero.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from services.processes import free_port
from tests.support.engines import REPO_ROOT


def run_ranks(module: str, args: list[str], world: int = 2, timeout: float = 300) -> list[str]:
    """Run ``world`` ranks of ``module`` to completion; their outputs, rank order."""
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module, str(rank), str(world), port, *args],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for rank in range(world)
    ]
    try:
        outputs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    return outputs


def join_group(rank: str, world: str, port: str) -> None:
    """Join the gloo group of :func:`run_ranks` (one thread per rank: 2 cores are shared)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=int(rank), world_size=int(world)
    )


def rank_main(run: Callable[[int, list[str]], Any], out_file: str) -> int:
    """The ``main`` of a worker module: join the group (``RANK WORLD PORT`` first on the
    command line), ``run(world, args)`` with the arguments after them, save what rank 0's run
    returns to ``out_file`` (``torch.save``), and leave the group whatever happened."""
    import torch
    import torch.distributed as dist

    rank, world, port, *args = sys.argv[1:]
    join_group(rank, world, port)
    try:
        result = run(int(world), args)
        if int(rank) == 0:
            torch.save(result, out_file)
    finally:
        dist.destroy_process_group()
    return 0
