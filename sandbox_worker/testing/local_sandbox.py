"""TEST MACHINERY: ``LocalDirBackend`` / ``LocalDirSandbox``, a double of the sandbox backends.

Stands for the docker and bwrap backends (:class:`sandbox_worker.backends.SandboxBackend`). A
"sandbox" is a fresh copy of a template git checkout in a host directory, and commands run
there with the host's bash (no isolation at all). It lets the reward evaluation's logic (scripts,
patch fallbacks, restoration of protected files, grading) and the trajectory runner's pipeline
run in unit tests without docker or bwrap; the real acceptance runs through the real backends
(tests/integration/sandbox_worker/evaluation).

The backend contract suite (tests/integration/sandbox_worker/backends/test_contract.py) runs the
part of the contract this double honours against it: ``exec`` (exit codes, merged output,
missing binaries and directories as results, timeouts, argument checks), ``diff``, missing
images, duplicate ids, the context manager. It does NOT honour the rest, by design: no
isolation or filesystem policy (host paths, a shared host ``/tmp``, ``$HOME`` is the scratch
directory), no network namespace or relay, no limits or quotas, no background processes or
exposed ports, no output cap, and its sandboxes live only in this process's memory (nothing for
``cleanup_node`` to find after a crash).

Paths: the evaluation is configured with ``EvalConfig(workdir=<host dir>, scratch_dir=<host
dir>)``, so the commands it builds address host paths directly; ``create`` copies the template
named by ``spec.image`` into ``spec.workdir`` and ``destroy`` removes both directories.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from sandbox_worker.backends.base import (
    BackgroundProcess,
    ExecResult,
    ImageNotFoundError,
    Sandbox,
    SandboxBackend,
    SandboxInfraError,
    SandboxSpec,
    check_timeout,
    command_argv,
    validate_sandbox_path,
)

ISOLATED_GIT_ENV: dict[str, str] = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}
"""git without the host's system/global config, with a fixed identity (so commits work)."""


class LocalDirSandbox(Sandbox):
    def __init__(self, spec: SandboxSpec, scratch: Path, backend: LocalDirBackend) -> None:
        self.spec = spec
        self.scratch = scratch
        self._backend = backend
        self.destroyed = False
        self.commands: list[str] = []

    def exec(
        self,
        cmd: str | list[str],
        *,
        workdir: str | None = None,
        timeout_s: float | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        argv = command_argv(cmd)
        check_timeout(timeout_s)
        cwd = validate_sandbox_path(workdir) if workdir is not None else self.spec.workdir
        self.commands.append(cmd if isinstance(cmd, str) else " ".join(cmd))
        if not Path(cwd).is_dir():  # what the real backends' exec wrapper answers
            return ExecResult(exit_code=126, output=f"cannot enter {cwd}: no such directory\n")
        run_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.scratch),
            "LANG": "C.UTF-8",
            **ISOLATED_GIT_ENV,
            **self.spec.env,
            **(env or {}),
        }
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=run_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except (FileNotFoundError, PermissionError) as exc:  # a result, as in a real sandbox
            code = 127 if isinstance(exc, FileNotFoundError) else 126
            return ExecResult(exit_code=code, output=f"{argv[0]}: {exc.strerror}\n")
        try:
            out, _ = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            timed_out = True
        return ExecResult(
            exit_code=proc.returncode if not timed_out else -9,
            output=out.decode("utf-8", "replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
        )

    def spawn(
        self,
        cmd: str | list[str],
        *,
        workdir: str | None = None,
        env: dict[str, str] | None = None,
        log_path: str = "/dev/null",
    ) -> BackgroundProcess:
        raise NotImplementedError("LocalDirSandbox does not run background processes")

    def expose(self, sandbox_port: int) -> Path:
        raise NotImplementedError("LocalDirSandbox has no network namespace")

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)

    def read_file(self, path: str) -> bytes:
        return Path(path).read_bytes()

    def copy_in(self, host_path: Path, sandbox_path: str) -> None:
        shutil.copytree(host_path, sandbox_path) if host_path.is_dir() else shutil.copy(
            host_path, sandbox_path
        )

    def copy_out(self, sandbox_path: str, host_path: Path) -> None:
        # Symlinks stay symlinks, as the real backends' tar streams keep them.
        source = Path(sandbox_path)
        if source.is_dir() and not source.is_symlink():
            shutil.copytree(source, host_path, symlinks=True)
        else:
            shutil.copy(source, host_path, follow_symlinks=False)

    def destroy(self) -> None:
        shutil.rmtree(self.spec.workdir, ignore_errors=True)
        shutil.rmtree(self.scratch, ignore_errors=True)
        self.destroyed = True
        self._backend.live.pop(self.spec.sandbox_id, None)


class LocalDirBackend(SandboxBackend):
    """Images are template checkouts: ``{image name: host directory}``."""

    name = "localdir"

    def __init__(self, templates: dict[str, Path], scratch_dir: Path) -> None:
        self.templates = templates
        self.scratch_dir = scratch_dir
        self.live: dict[str, LocalDirSandbox] = {}
        self.created: list[LocalDirSandbox] = []
        self.labels: dict[str, dict[str, str]] = {}  # image -> its labels (none by default)

    def create(self, spec: SandboxSpec) -> Sandbox:
        template = self.templates.get(spec.image)
        if template is None:
            raise ImageNotFoundError(f"no template for image {spec.image!r}")
        if spec.sandbox_id in self.live:
            raise SandboxInfraError(f"sandbox {spec.sandbox_id!r} already exists")
        workdir = Path(spec.workdir)
        if workdir.exists():
            raise RuntimeError(f"{workdir} still exists: a previous sandbox was not destroyed")
        shutil.copytree(template, workdir, symlinks=True)
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        sandbox = LocalDirSandbox(spec, self.scratch_dir, self)
        self.live[spec.sandbox_id] = sandbox
        self.created.append(sandbox)
        return sandbox

    def image_available(self, image: str) -> bool:
        return image in self.templates

    def image_labels(self, image: str) -> dict[str, str] | None:
        return self.labels.get(image)

    def cleanup_node(self, node: str) -> int:
        doomed = [s for s in self.live.values() if s.spec.node == node]
        for sandbox in doomed:
            sandbox.destroy()
        return len(doomed)

    def list_sandboxes(self, node: str) -> list[str]:
        return [sid for sid, s in self.live.items() if s.spec.node == node]
