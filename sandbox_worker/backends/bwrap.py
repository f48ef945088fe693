"""bubblewrap sandbox backend: the same root filesystem as the docker image, no daemon.

bwrap has no long-lived container, so here a *sandbox* is a set of host resources that every
command of the sandbox shares (docs/sandboxes.md, "bwrap"):

* a state dir ``<state_root>/<node>.<sandbox_id>/`` with ``owner.json`` (ownership marker),
  ``testbed/`` (a private, writable copy of the image's ``/testbed``), ``tmp/`` (``/tmp`` and
  ``$HOME``), ``ctl/`` (relay script and sockets: mounted at ``/swerl/ctl`` in the relays'
  own bwrap runs only, never in the sandbox's commands) and ``pids/``
  (one file per running bwrap process, so a restarted worker can kill strays); the state dir
  is a tmpfs of ``disk_mb`` / ``inodes`` (``_hostdir.mount_disk_quota``), a quota shared by
  the three writable places -- a per-command ``bwrap --tmpfs --size`` would not outlive the
  command;
* a persistent network namespace ``swerl.<node>.<sandbox_id>`` with only loopback (up), so the
  LLM relay, the agent server and tool commands of one sandbox see the same 127.0.0.1 --
  ``bwrap --unshare-all`` would give every command its own loopback;
* cgroups ``swerl/<node>.<sandbox_id>`` carrying the cpu, memory and pids limits of the whole
  sandbox (``prlimit`` per process only where no cgroup hierarchy is usable).

Every exec is one ``bwrap`` invocation inside that netns and cgroup: read-only root built from
the image's tree, the two writable binds, fresh ``/proc`` and ``/dev``, new user/pid/ipc/uts/
cgroup namespaces, all capabilities dropped, ``--die-with-parent``, ``--new-session``. A relay
(the LLM relay, ``expose``) is a bwrap run of its own in the same netns, with the control dir
bound and outside the sandbox's cgroups: no command of the sandbox shares its pid or mount
namespace, so none can signal it, unlink its socket or starve it of memory or pids.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import logging
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import IO

from pydantic import Field

from sandbox_worker import images
from sandbox_worker.backends import _common as common
from sandbox_worker.backends import _hostdir as hostdir
from sandbox_worker.backends.base import (
    CONTROL_DIR,
    BackgroundProcess,
    EnvVars,
    ExecResult,
    SandboxInfraError,
    SandboxSpec,
    validate_name,
    validate_sandbox_path,
)
from sandbox_worker.backends.cgroups import JOIN_FAILED_EXIT, CgroupError, CgroupLimits, Cgroups
from sandbox_worker.relay.host_relay import RelayHub
from services.config import StrictModel

log = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")
HOST_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# Exit codes of the in-sandbox file helpers (chosen to be unlike tar/cat's own).
_MISSING, _IS_DIR = 44, 45


class BwrapBackendConfig(StrictModel):
    # Per-sandbox state dirs: keep unix socket paths short (< 108 bytes).
    state_root: Path = Path("/var/lib/swerl/bwrap")
    rootfs_cache: Path = Field(default_factory=images.cache_dir)
    relay_python: str = "python3"  # interpreter inside the sandbox that runs the relay
    cgroups: str = Field(default="auto", pattern="^(auto|required|off)$")
    max_output_bytes: int = common.DEFAULT_MAX_OUTPUT_BYTES
    ready_timeout_s: float = 20.0


def _which(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")
    if path is None:
        raise SandboxInfraError(f"bwrap backend needs `{name}` on the host")
    return path


class _Tools:
    def __init__(self) -> None:
        self.bwrap = _which("bwrap")
        self.nsenter = _which("nsenter")
        self.ip = _which("ip")
        self.prlimit = _which("prlimit")


def _sandbox_name(node: str, sandbox_id: str) -> str:
    return f"{node}.{sandbox_id}"


def _netns_name(name: str) -> str:
    return f"swerl.{name}"


def _mount_plan(
    rootfs: Path, here: PurePosixPath, targets: set[PurePosixPath], skip: set[PurePosixPath]
) -> list[str]:
    """bwrap args that rebuild ``rootfs`` read-only on a tmpfs root, leaving room for mounts.

    A directory that is an ancestor of a mount target is recreated (``--dir``) and its entries
    bound one by one, so mount points can be made even where the image has no such path, while
    the rest of the tree is bound read-only as is.
    """
    args: list[str] = []
    try:
        entries = sorted(os.scandir(rootfs), key=lambda e: e.name)
    except OSError as exc:
        raise SandboxInfraError(f"cannot read root filesystem {rootfs}: {exc}") from exc
    for entry in entries:
        dest = here / entry.name
        if dest in skip or dest in targets:
            continue
        is_ancestor = any(dest in t.parents for t in targets)
        if entry.is_symlink():
            if is_ancestor:
                raise SandboxInfraError(f"mount target below a symlink in the image: {dest}")
            args += ["--symlink", os.readlink(entry.path), str(dest)]
        elif entry.is_dir():
            if is_ancestor:
                args += ["--dir", str(dest)]
                args += _mount_plan(Path(entry.path), dest, targets, skip)
            else:
                args += ["--ro-bind", entry.path, str(dest)]
        elif entry.is_file():
            args += ["--ro-bind", entry.path, str(dest)]
        # sockets, fifos and device nodes of the image are not carried over
    return args


class BwrapProcess(BackgroundProcess):
    def __init__(self, proc: subprocess.Popen[bytes], pid_file: Path) -> None:
        self._proc = proc
        self._pid_file = pid_file

    def is_running(self) -> bool:
        return self._proc.poll() is None

    def exit_code(self) -> int | None:
        code = self._proc.poll()
        if code is not None:
            self._pid_file.unlink(missing_ok=True)
        return code

    def kill(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(10)
        self._pid_file.unlink(missing_ok=True)


class BwrapSandbox(hostdir.HostDirSandbox):
    def __init__(
        self, backend: BwrapBackend, spec: SandboxSpec, state: Path, info: images.RootfsInfo
    ) -> None:
        super().__init__(
            spec,
            state,
            common.parse_image_env(list(info.env)),
            relay_python=backend.config.relay_python,
            ready_timeout_s=backend.config.ready_timeout_s,
        )
        self._backend = backend
        self._pids = state / "pids"
        self._name = _sandbox_name(spec.node, spec.sandbox_id)
        self._netns = _netns_name(self._name)
        self._info = info
        # The sandbox's commands: no control dir at all (base.py, "Filesystem policy").
        self._bwrap_args = self._namespace_args(
            info,
            [
                ("--bind", str(state / "testbed"), spec.workdir),
                ("--bind", str(state / "tmp"), "/tmp"),
                *self._ro_mounts(),
            ],
        )

    def _ro_mounts(self) -> list[tuple[str, str, str]]:
        items = sorted(self.spec.ro_mounts.items(), key=lambda kv: kv[1].count("/"))
        return [("--ro-bind", host, inside) for host, inside in items]

    @functools.cached_property
    def _relay_bwrap_args(self) -> list[str]:
        """The relays' bwrap arguments: the control dir read-write and the ``ro_mounts``
        (``relay_python`` may live there); made on first use, most sandboxes have no relay."""
        return self._namespace_args(
            self._info, [("--bind", str(self._ctl), CONTROL_DIR), *self._ro_mounts()]
        )

    @staticmethod
    def _namespace_args(info: images.RootfsInfo, mounts: list[tuple[str, str, str]]) -> list[str]:
        """bwrap's namespace, capability and filesystem arguments around ``mounts``."""
        targets = {PurePosixPath(m[2]) for m in mounts}
        skip = {PurePosixPath(p) for p in ("/proc", "/dev", "/sys")}
        return [
            "--unshare-user",
            "--unshare-ipc",
            "--unshare-pid",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--disable-userns",
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            "--tmpfs",
            "/",
            *_mount_plan(info.root, PurePosixPath("/"), targets, skip),
            *[a for m in mounts for a in m],
            "--dir",
            "/sys",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--remount-ro",
            "/",
        ]

    # -- process plumbing -----------------------------------------------------------------

    def _host_argv(
        self, inner: list[str], workdir: str | None, env: dict[str, str] | None, relay: bool
    ) -> list[str]:
        """The host command of one bwrap run: a sandbox command, or (``relay``) a relay, which
        gets the control dir and stays out of the sandbox's cgroups (its limits are the agent's
        to exhaust, not the relay's)."""
        if self._destroyed:
            raise SandboxInfraError(f"sandbox {self.spec.sandbox_id} was destroyed")
        wd = self._workdir(workdir)
        tools = self._backend.tools
        in_cgroups = self._backend.use_cgroups and not relay
        argv = self._backend.cgroups.join_prefix(self._name) if in_cgroups else []
        if not self._backend.use_cgroups and not relay:
            limits = self.spec.limits
            argv += [
                tools.prlimit,
                f"--as={limits.memory_mb * 1024 * 1024}",
                f"--nproc={limits.pids}",
                "--",
            ]
        argv += [tools.nsenter, f"--net={NETNS_DIR / self._netns}", "--"]
        # The sandbox's environment is given to bwrap as arguments, never to the host-side tools
        # (which run as root: LD_PRELOAD and friends must not reach them).
        env_args = ["--clearenv"]
        for key, value in common.exec_env(self.spec, self._image_env, env).items():
            env_args += ["--setenv", key, value]
        bwrap_args = self._relay_bwrap_args if relay else self._bwrap_args
        argv += [tools.bwrap, *bwrap_args, *env_args, "--chdir", wd, "--", *inner]
        return argv

    def _popen(
        self,
        inner: list[str],
        *,
        workdir: str | None,
        env: dict[str, str] | None,
        stdin: int | IO[bytes] | None = subprocess.DEVNULL,
        stdout: int | IO[bytes] | None = subprocess.PIPE,
        stderr: int | IO[bytes] | None = subprocess.STDOUT,
        relay: bool = False,
    ) -> tuple[subprocess.Popen[bytes], Path]:
        proc = subprocess.Popen(
            self._host_argv(inner, workdir, env, relay),
            env={"PATH": HOST_PATH, "LANG": "C.UTF-8"},
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        pid_file = self._pids / str(proc.pid)
        try:
            pid_file.write_text(str(self._state))
        except OSError as exc:
            # The state dir is the sandbox's quota'd tmpfs: an agent that filled it must not
            # make every later command (the patch extraction, the evaluation) an infra failure.
            # The pid file is only a fallback (--die-with-parent and the cgroups reach it too).
            if exc.errno != errno.ENOSPC:
                raise
            pid_file.unlink(missing_ok=True)
        return proc, pid_file

    @staticmethod
    def _start_failure(code: int, output: str) -> int | None:
        """Exit code for a command that could not start (as a shell would report it).

        bwrap reports these itself; they are results (like docker's OCI errors), not infra
        failures: 127 for a missing program, 126 for one not executable or a missing workdir.
        """
        if code == 0 or not output.startswith("bwrap: "):
            return None
        first = output.splitlines()[0]
        if first.startswith("bwrap: execvp ") and first.endswith("No such file or directory"):
            return 127
        if first.startswith("bwrap: execvp ") or first.startswith("bwrap: Can't chdir to"):
            return 126
        return None

    def _check_join(self, code: int, output: str) -> None:
        if code == JOIN_FAILED_EXIT and "cgroup.procs" in output:
            raise SandboxInfraError(f"cannot join sandbox cgroup: {output[-300:]}")
        if code != 0 and output.startswith("bwrap:"):
            raise SandboxInfraError(f"bwrap failed: {output[-500:]}")
        if code != 0 and output.startswith("nsenter:"):
            raise SandboxInfraError(f"sandbox network namespace missing: {output[-300:]}")

    def _exec_argv(
        self, argv: list[str], workdir: str | None, timeout_s: float | None, env: EnvVars | None
    ) -> ExecResult:
        buf = common.OutputBuffer(self._backend.config.max_output_bytes)
        started = time.monotonic()
        proc, pid_file = self._popen(argv, workdir=workdir, env=env)
        assert proc.stdout is not None
        reader = threading.Thread(target=_pump, args=(proc.stdout, buf), daemon=True)
        reader.start()
        timed_out = False
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
        finally:
            pid_file.unlink(missing_ok=True)
        reader.join(10)
        duration = time.monotonic() - started
        code = proc.returncode
        if timed_out:
            return ExecResult(124, buf.text(), timed_out=True, duration_s=duration)
        start_failure = self._start_failure(code, buf.text())
        if start_failure is not None:
            return ExecResult(start_failure, buf.text(), duration_s=duration)
        self._check_join(code, buf.text())
        return ExecResult(code if code >= 0 else 128 - code, buf.text(), duration_s=duration)

    def _run_bytes(
        self, script: str, args: list[str], data: bytes | None = None, timeout_s: float = 300
    ) -> tuple[int, bytes, str]:
        """Run a bash script in the sandbox with binary stdin/stdout (file transfers)."""
        proc, pid_file = self._popen(
            ["/bin/bash", "-c", script, "swerl-file", *args],
            workdir="/",
            env=None,
            stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            out, err = proc.communicate(data, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise SandboxInfraError(f"file transfer timed out after {timeout_s}s") from None
        finally:
            pid_file.unlink(missing_ok=True)
        text = err.decode("utf-8", "replace")
        self._check_join(proc.returncode, text)
        return proc.returncode, out, text

    def _spawn_argv(
        self, argv: list[str], workdir: str | None, env: EnvVars | None, log_path: str
    ) -> BackgroundProcess:
        return self._track(self._start_background(argv, workdir, env, log_path, relay=False))

    def _spawn_relay(self, argv: list[str], log_path: str) -> BackgroundProcess:
        return self._start_background(argv, "/", None, log_path, relay=True)

    def _start_background(
        self,
        argv: list[str],
        workdir: str | None,
        env: EnvVars | None,
        log_path: str,
        *,
        relay: bool,
    ) -> BwrapProcess:
        inner = ["/bin/bash", "-c", 'log="$1"; shift; exec "$@" >"$log" 2>&1', "swerl-bg"]
        inner += [log_path, *argv]
        proc, pid_file = self._popen(
            inner, workdir=workdir, env=env, stdout=subprocess.DEVNULL, relay=relay
        )
        return BwrapProcess(proc, pid_file)

    # -- files ----------------------------------------------------------------------------

    @staticmethod
    def _raise_for(code: int, err: str, path: str) -> None:
        if code == _MISSING:
            raise FileNotFoundError(f"{path} not found in sandbox")
        if code == _IS_DIR:
            raise IsADirectoryError(path)
        if "Read-only file system" in err or "Permission denied" in err:
            raise PermissionError(f"{path}: {err.strip()[-300:]}")
        if code != 0:
            hostdir.raise_if_out_of_space(err, path)
        if code != 0:
            raise SandboxInfraError(f"file operation on {path} failed ({code}): {err[-300:]}")

    def write_file(self, path: str, data: bytes, mode: int = 0o644) -> None:
        self._writable_root(path)
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" -- "$1"'
        code, _, err = self._run_bytes(script, [path, f"{mode:o}"], data)
        self._raise_for(code, err, path)

    def read_file(self, path: str) -> bytes:
        validate_sandbox_path(path)
        script = f'[ -e "$1" ] || exit {_MISSING}; [ -d "$1" ] && exit {_IS_DIR}; exec cat -- "$1"'
        code, out, err = self._run_bytes(script, [path])
        self._raise_for(code, err, path)
        return out

    def copy_in(self, host_path: Path, sandbox_path: str) -> None:
        self._writable_root(sandbox_path)
        p = PurePosixPath(sandbox_path)
        data = common.tar_host_path(Path(host_path), p.name)
        script = 'mkdir -p -- "$1" && exec tar -x --no-same-owner -C "$1" -f -'
        code, _, err = self._run_bytes(script, [str(p.parent)], data)
        self._raise_for(code, err, sandbox_path)

    def copy_out(self, sandbox_path: str, host_path: Path) -> None:
        p = PurePosixPath(validate_sandbox_path(sandbox_path))
        if p == PurePosixPath("/"):
            raise ValueError("cannot copy out the whole root filesystem")
        script = f'[ -e "$1/$2" ] || exit {_MISSING}; exec tar -c -C "$1" -f - -- "$2"'
        code, out, err = self._run_bytes(script, [str(p.parent), p.name])
        self._raise_for(code, err, sandbox_path)
        with tarfile.open(fileobj=io.BytesIO(out), mode="r:") as tar:
            common.extract_single_tree(tar, Path(host_path))

    # -- lifecycle ------------------------------------------------------------------------

    def _release(self, procs: list[BackgroundProcess]) -> None:
        """Kill the background processes, then tear down netns, cgroups and state dir."""
        for proc in procs:
            proc.kill()
        self._backend._teardown(self._state, self._name)


def _pump(stream: IO[bytes], buf: common.OutputBuffer) -> None:
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
        if not chunk:
            break
        buf.add(chunk)
    stream.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the bwrap process group, SIGKILL after a grace period; the pid namespace (and so
    every process of the command) dies with bwrap (``--die-with-parent``)."""
    for sig, wait in ((signal.SIGTERM, common.KILL_GRACE_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


class BwrapBackend(hostdir.HostDirBackend):
    name = "bwrap"

    def __init__(self, config: BwrapBackendConfig | None = None, hub: RelayHub | None = None):
        super().__init__(hub)
        self.config = config or BwrapBackendConfig()
        self.tools = _Tools()
        self.cgroups = Cgroups()
        if self.config.cgroups == "required" and not self.cgroups.available:
            raise SandboxInfraError("cgroups required but no usable cgroup hierarchy (root?)")
        self.use_cgroups = self.config.cgroups != "off" and self.cgroups.available
        if os.geteuid() != 0:
            raise SandboxInfraError("the bwrap backend runs as root (network namespaces)")

    def image_available(self, image: str) -> bool:
        try:
            images.rootfs_info(image, self.config.rootfs_cache)
        except images.ImageNotFoundError:
            return False
        return True

    def image_labels(self, image: str) -> dict[str, str] | None:
        """The image's ``swerl.*`` labels as its tree's stamp recorded them (None: no tree, or
        a stamp from before trees carried labels; ``images build`` adds them)."""
        try:
            return images.rootfs_info(image, self.config.rootfs_cache).labels
        except images.ImageNotFoundError:
            return None

    def _state_dir(self, name: str) -> Path:
        return self.config.state_root / name

    def create(self, spec: SandboxSpec) -> BwrapSandbox:
        info = images.rootfs_info(spec.image, self.config.rootfs_cache)  # ImageNotFoundError
        for host in spec.ro_mounts:
            if not Path(host).exists():
                raise SandboxInfraError(f"ro_mounts source does not exist: {host}")
        name = _sandbox_name(spec.node, spec.sandbox_id)
        state = self._state_dir(name)
        hostdir.claim_state_dir(state, spec)
        try:
            hostdir.fill_state_dir(state, spec)
            (state / "pids").mkdir()
            self._copy_testbed(info, spec, state / "testbed")
            self._make_netns(_netns_name(name))
            if self.use_cgroups:
                self.cgroups.create(
                    name,
                    CgroupLimits(
                        spec.limits.cpus, spec.limits.memory_mb * 1024 * 1024, spec.limits.pids
                    ),
                )
            sandbox = BwrapSandbox(self, spec, state, info)
        except BaseException as exc:
            self._teardown(state, name)
            if isinstance(exc, (OSError, CgroupError, subprocess.CalledProcessError)):
                raise SandboxInfraError(f"cannot create sandbox {spec.sandbox_id}: {exc}") from exc
            raise
        sandbox.open_network(lambda: self.hub)
        return sandbox

    @staticmethod
    def _copy_testbed(info: images.RootfsInfo, spec: SandboxSpec, dest: Path) -> None:
        src = info.testbed if info.testbed is not None else info.root / spec.workdir.lstrip("/")
        if src.is_dir():
            res = subprocess.run(
                ["cp", "-a", "--reflink=auto", "--", str(src), str(dest)],
                capture_output=True,
                text=True,
            )
            if res.returncode != 0:
                limits = spec.limits
                hint = (
                    f"the image's {spec.workdir} does not fit disk_mb={limits.disk_mb} / "
                    f"inodes={limits.inodes}"
                    if hostdir.out_of_space(res.stderr)
                    else f"copying {src} failed"
                )
                raise SandboxInfraError(f"{hint}: {res.stderr.strip()[-300:]}")
        else:
            dest.mkdir()

    def _make_netns(self, netns: str) -> None:
        subprocess.run([self.tools.ip, "netns", "add", netns], check=True, capture_output=True)
        subprocess.run(
            [self.tools.ip, "-n", netns, "link", "set", "lo", "up"],
            check=True,
            capture_output=True,
        )

    def _teardown(self, state: Path, name: str) -> None:
        """Kill every process of the sandbox, then remove cgroups, netns and state dir."""
        errors: list[str] = []
        pid_dir = state / "pids"
        if pid_dir.is_dir():
            for pid_file in pid_dir.iterdir():
                _kill_stray(pid_file, state)
        if self.cgroups.available:
            try:
                self.cgroups.remove(name)
            except CgroupError as exc:
                errors.append(str(exc))
        netns = _netns_name(name)
        if (NETNS_DIR / netns).exists():
            res = subprocess.run(
                [self.tools.ip, "netns", "delete", netns], capture_output=True, text=True
            )
            if res.returncode != 0:
                errors.append(f"ip netns delete {netns}: {res.stderr.strip()}")
        hostdir.release_state_dir(state)
        if state.exists():
            errors.append(f"cannot remove {state}")
        if errors:
            raise SandboxInfraError(f"teardown of {name}: {'; '.join(errors)}")

    def list_sandboxes(self, node: str) -> list[str]:
        validate_name("node", node)
        root = self.config.state_root
        if not root.is_dir():
            return []
        return sorted(p.name[len(node) + 1 :] for p in root.glob(f"{node}.*"))

    def cleanup_node(self, node: str) -> int:
        validate_name("node", node)
        prefix = f"{node}."
        names: set[str] = set()
        root = self.config.state_root
        if root.is_dir():
            names.update(p.name for p in root.glob(f"{prefix}*"))
        names.update(self.cgroups.names(prefix) if self.cgroups.available else set())
        if NETNS_DIR.is_dir():
            names.update(p.name[len("swerl.") :] for p in NETNS_DIR.glob(f"swerl.{prefix}*"))
        errors: list[str] = []
        for name in sorted(names):
            try:
                self._teardown(self._state_dir(name), name)
            except SandboxInfraError as exc:  # keep going: remove all that can be removed
                errors.append(str(exc))
        if errors:
            raise SandboxInfraError(f"cleanup_node {node}: {'; '.join(errors)}")
        if names:
            log.info("cleanup_node %s: removed %d sandboxes", node, len(names))
        return len(names)


def _kill_stray(pid_file: Path, state: Path) -> None:
    """Kill a recorded bwrap process if it still is ours (pid reuse is checked by argv)."""
    try:
        pid = int(pid_file.name)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (ValueError, OSError):
        pid_file.unlink(missing_ok=True)
        return
    if str(state).encode() in cmdline:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
