"""Start ``nproc`` local processes of one command as the ranks of a ``torch.distributed`` group
(what ``torchrun --standalone`` does, for the trainer's tools: ``score --nproc``).

Each child gets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR=127.0.0.1`` and a free
``MASTER_PORT`` (loopback only) and joins the group with the ``env://`` rendezvous
(:func:`trainer.backends.megatron.model.init_parallel`). When one rank fails the others are
stopped (a collective would wait for it forever); the exit status is the first failure's, or
0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from services.processes import free_port


def is_child() -> bool:
    """Whether this process is one of :func:`launch`'s ranks (or any launcher's)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def launch(args: list[str], nproc: int, poll_s: float = 0.2) -> int:
    """Run ``python ARGS`` as ranks ``0 .. nproc-1``; their exit status (see above)."""
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    port = str(free_port())
    procs = []
    for rank in range(nproc):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nproc),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        procs.append(subprocess.Popen([sys.executable, *args], env=env))
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                return int(failed[0])
            if all(c == 0 for c in codes):
                return 0
            time.sleep(poll_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
