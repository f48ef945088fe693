"""Per-sandbox cgroups for the bwrap backend (cgroup v1 or v2), the way docker limits containers.

Why cgroups and not only ``prlimit``: rlimits are per process (``RLIMIT_AS``) or per user
(``RLIMIT_NPROC``, which the kernel does not enforce for uid 0 at all), so they cannot bound a
sandbox's *total* memory or process count; a cgroup can, and it also lists every process of a
sandbox so that destroy/cleanup kill them all. Layout: ``<controller root>/swerl/<name>`` with
``name = <node>.<sandbox_id>``, so a node's leftovers are found by prefix.

A process joins by writing its pid to ``cgroup.procs`` of each directory; :meth:`join_prefix`
returns a tiny ``/bin/sh`` prefix that does so and then ``exec``s the real command, so no
``preexec_fn`` runs in the forked worker.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "swerl"
JOIN_FAILED_EXIT = 125
V1_CONTROLLERS = ("pids", "memory", "cpu")
CFS_PERIOD_US = 100_000


class CgroupError(RuntimeError):
    pass


@dataclass(frozen=True)
class CgroupLimits:
    cpus: float
    memory_bytes: int
    pids: int


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc}") from exc


class Cgroups:
    """The cgroup hierarchy this host offers: ``version`` 1, 2, or 0 (unavailable)."""

    def __init__(self, root: Path = CGROUP_ROOT) -> None:
        self.root = root
        self.version = self._detect()

    def _detect(self) -> int:
        if os.geteuid() != 0:
            return 0
        if (self.root / "cgroup.controllers").exists():
            wanted = {"pids", "memory", "cpu"}
            have = set((self.root / "cgroup.controllers").read_text().split())
            return 2 if wanted <= have else 0
        if all((self.root / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
            return 1
        return 0

    @property
    def available(self) -> bool:
        return self.version != 0

    def _dirs(self, name: str) -> list[Path]:
        if self.version == 1:
            return [self.root / c / PARENT / name for c in V1_CONTROLLERS]
        if self.version == 2:
            return [self.root / PARENT / name]
        return []

    def _ensure_parent(self) -> None:
        if self.version == 1:
            for c in V1_CONTROLLERS:
                (self.root / c / PARENT).mkdir(exist_ok=True)
        elif self.version == 2:
            parent = self.root / PARENT
            if not parent.exists():
                parent.mkdir()
            for d in (self.root, parent):
                enabled = set((d / "cgroup.subtree_control").read_text().split())
                missing = {"pids", "memory", "cpu"} - enabled
                if missing:
                    _write(d / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))

    def create(self, name: str, limits: CgroupLimits) -> None:
        if not self.available:
            raise CgroupError("no usable cgroup hierarchy")
        self._ensure_parent()
        for d in self._dirs(name):
            d.mkdir(exist_ok=True)
        quota = max(1000, int(limits.cpus * CFS_PERIOD_US))
        if self.version == 1:
            pids, mem, cpu = self._dirs(name)
            _write(pids / "pids.max", str(limits.pids))
            _write(mem / "memory.limit_in_bytes", str(limits.memory_bytes))
            if (mem / "memory.memsw.limit_in_bytes").exists():
                _write(mem / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(quota))
        else:
            (d,) = self._dirs(name)
            _write(d / "pids.max", str(limits.pids))
            _write(d / "memory.max", str(limits.memory_bytes))
            if (d / "memory.swap.max").exists():
                _write(d / "memory.swap.max", "0")
            _write(d / "cpu.max", f"{quota} {CFS_PERIOD_US}")

    def join_prefix(self, name: str) -> list[str]:
        """Argv prefix that moves the process into the sandbox's cgroups, then execs the rest."""
        files = [str(d / "cgroup.procs") for d in self._dirs(name)]
        if not files:
            return []
        script = (
            f'while [ "$1" != "--" ]; do echo $$ > "$1" || exit {JOIN_FAILED_EXIT}; shift; done; '
            'shift; exec "$@"'
        )
        return ["/bin/sh", "-c", script, "swerl-cgjoin", *files, "--"]

    def pids(self, name: str) -> set[int]:
        out: set[int] = set()
        for d in self._dirs(name):
            try:
                out.update(int(p) for p in (d / "cgroup.procs").read_text().split())
            except FileNotFoundError:
                continue
        return out

    def kill_all(self, name: str, timeout_s: float = 5.0) -> None:
        """SIGKILL every process in the sandbox's cgroups until none is left."""
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids(name)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise CgroupError(f"processes {sorted(pids)} of {name} survive SIGKILL")
            time.sleep(0.02)

    def remove(self, name: str) -> None:
        """Kill what is left and remove the cgroup directories (idempotent)."""
        if not self.available:
            return
        self.kill_all(name)
        for d in self._dirs(name):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while the last killed task is being reaped
                    time.sleep(0.02)
            else:
                raise CgroupError(f"cannot remove cgroup {d}")

    def names(self, prefix: str) -> set[str]:
        """Sandbox cgroup names starting with ``prefix`` (for a node's cleanup)."""
        out: set[str] = set()
        parents = (
            [self.root / c / PARENT for c in V1_CONTROLLERS]
            if self.version == 1
            else [self.root / PARENT]
            if self.version == 2
            else []
        )
        for parent in parents:
            if parent.is_dir():
                out.update(
                    p.name for p in parent.iterdir() if p.is_dir() and p.name.startswith(prefix)
                )
        return out
