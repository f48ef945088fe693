"""The one image of every CPU service of compose.yaml's ``cpu`` profile, without a registry.

``python deploy/cpu_image.py build [--env-out FILE]`` makes two images:

* ``swerl/cpu-runtime:<r>``: one tar streamed into ``docker import``: the sandbox base root
  filesystem (``deploy/images/build_base.sh``'s debootstrap tree), the set-up Python runtime and
  venv (``deploy/dev/setup.sh python``) at their host paths (the venv's ``bin/python`` and
  ``pyvenv.cfg`` name the runtime by absolute path, and the sandbox worker hands the same paths
  to the host's Docker as the agent-server bundle), and ``redis-server`` with the shared
  libraries the base tree lacks. Gigabytes (torch): imported only when ``<r>`` changes, a hash of
  the base image's id, the runtime's file list (names, sizes, times), the venv's identity (its
  directory is named by the hash of the dependency files; plus its completion stamp) and
  redis-server's bytes.
* ``swerl/cpu:<r>-<c>``: the repository's files (git's tracked and unignored ones) at
  ``/opt/swerl/src``, a thin ``docker build`` layer on the runtime (``FROM`` a local image, so
  no registry), ``<c>`` a hash of every file's name and bytes.

Both live in the Docker engine, outside the clone: a rerun with the same inputs (CI) reuses them,
a code change costs seconds, an environment change one import. The tiny model is not copied in:
the services mount the model cache (``SWERL_MODELS_DIR``) at ``/models`` as on a cluster.
``prune`` removes the images a newer build superseded (older runtimes, older code layers) unless
a container uses them; ``tag`` prints the service image's tag without building; ``env`` prints
the compose variables;
``--env-out FILE`` writes ``deploy/nodes/cpu.env`` with this machine's values (image tag, runtime
and venv paths, the model cache) for ``docker-compose --env-file FILE up -d``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SRC_IN_IMAGE = "/opt/swerl/src"
REPOSITORY = "swerl/cpu"
RUNTIME_REPOSITORY = "swerl/cpu-runtime"
_CODE_TAG = re.compile(r"^[0-9a-f]+-[0-9a-f]+$")  # <runtime>-<code>: the tags build() makes
BASE_IMAGE = os.environ.get("SWERL_BASE_IMAGE", "swerl/base:bookworm")
BASE_ROOTFS = Path(os.environ.get("SWERL_CACHE", "/var/cache/swerl")) / "rootfs/base-bookworm"
CPU_ENV = REPO / "deploy" / "nodes" / "cpu.env"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LDD_PATH = re.compile(r"=>\s*(/\S+)|^\s*(/\S+)\s+\(", re.MULTILINE)


class ImageBuildError(RuntimeError):
    """An input of the image is missing or the import failed; the message says which."""


@dataclass(frozen=True)
class Inputs:
    """Everything the image is made of (host paths)."""

    rootfs: Path
    base_image: str
    python_root: Path
    venv: Path
    redis_server: Path
    repo: Path
    models: Path

    @classmethod
    def from_environment(cls, venv: Path | None = None) -> Inputs:
        venv = (venv or REPO / ".venv").resolve()
        cfg = venv / "pyvenv.cfg"
        if not cfg.is_file():
            raise ImageBuildError(f"no venv at {venv} (run deploy/dev/setup.sh python)")
        home = _pyvenv_home(cfg.read_text())
        redis = Path(_which("redis-server"))
        cache = Path(os.environ.get("SWERL_CACHE_DIR", Path.home() / ".cache" / "swerl"))
        inputs = cls(BASE_ROOTFS, BASE_IMAGE, home.parent.resolve(), venv, redis, REPO, cache)
        for name, path in (("base rootfs", inputs.rootfs), ("python runtime", inputs.python_root)):
            if not path.is_dir():
                raise ImageBuildError(f"{name} missing: {path} (run deploy/dev/setup.sh all)")
        return inputs


def _pyvenv_home(text: str) -> Path:
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home":
            return Path(value.strip())
    raise ImageBuildError("pyvenv.cfg has no 'home' line")


def _which(program: str) -> str:
    for part in os.environ.get("PATH", SYSTEM_PATH).split(os.pathsep) + SYSTEM_PATH.split(":"):
        candidate = Path(part) / program
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ImageBuildError(f"{program} not found (run deploy/dev/setup.sh system)")


def repo_files(repo: Path) -> list[str]:
    """The repository's tracked and unignored files, relative, sorted."""
    out = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return sorted(name for name in out.split("\0") if name and (repo / name).is_file())


def shared_libraries(binary: Path) -> list[Path]:
    """The shared libraries ``binary`` loads (ldd), resolved to real files."""
    text = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    found = {m.group(1) or m.group(2) for m in _LDD_PATH.finditer(text)}
    return sorted(Path(p) for p in found)


def _stat_digest(h: hashlib._Hash, root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            st = path.lstat()
            h.update(f"{path}\0{st.st_size}\0{int(st.st_mtime)}\n".encode())


def _docker(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, **kw)  # type: ignore[call-overload]


def runtime_hash(inputs: Inputs) -> str:
    """Hash of the heavy layer: base tree, Python runtime, venv, redis-server."""
    h = hashlib.sha256(b"swerl-cpu-runtime-v1\n")
    base = _docker("image", "inspect", "--format", "{{.Id}}", inputs.base_image)
    if base.returncode != 0:
        raise ImageBuildError(f"base image {inputs.base_image} missing (setup.sh images)")
    h.update(f"base {base.stdout.strip()}\n".encode())
    _stat_digest(h, inputs.python_root)
    stamp = inputs.venv / ".swerl-ok"
    stamp_time = int(stamp.stat().st_mtime) if stamp.exists() else 0
    h.update(f"venv {inputs.venv} {stamp_time}\n".encode())
    h.update(hashlib.sha256(inputs.redis_server.read_bytes()).digest())
    return h.hexdigest()[:16]


def code_hash(inputs: Inputs) -> str:
    """Hash of the code layer: every repository file's name and bytes."""
    h = hashlib.sha256(b"swerl-cpu-code-v1\n")
    for name in repo_files(inputs.repo):
        h.update(f"src {name}\0".encode())
        h.update(hashlib.sha256((inputs.repo / name).read_bytes()).digest())
    return h.hexdigest()[:16]


def image_tags(inputs: Inputs) -> tuple[str, str]:
    """(runtime image, service image): ``swerl/cpu-runtime:<r>``, ``swerl/cpu:<r>-<c>``."""
    runtime = runtime_hash(inputs)
    return f"{RUNTIME_REPOSITORY}:{runtime}", f"{REPOSITORY}:{runtime[:10]}-{code_hash(inputs)}"


def _runtime_members(inputs: Inputs) -> Iterator[tuple[Path, str]]:
    """(host path, path in the image) of every top-level entry of the runtime tar."""
    for entry in sorted(inputs.rootfs.iterdir()):
        yield entry, entry.name
    for path in (inputs.python_root, inputs.venv):
        yield path, str(path).lstrip("/")
    for path in [inputs.redis_server, *shared_libraries(inputs.redis_server)]:
        # Under the real directory (bookworm's /lib is a link to usr/lib), by the name the
        # loader looks for; libraries the base tree already has are left alone.
        inside = path.parent.resolve() / path.name
        if not (inputs.rootfs / str(inside).lstrip("/")).exists():
            yield path.resolve(), str(inside).lstrip("/")


def import_changes(inputs: Inputs, digest: str) -> list[str]:
    """``docker import --change`` instructions: PATH with the venv first, workdir, label."""
    return [
        f"ENV PATH={inputs.venv}/bin:{SYSTEM_PATH}",
        "ENV PYTHONDONTWRITEBYTECODE=1",
        "ENV PYTHONUNBUFFERED=1",
        f"WORKDIR {SRC_IN_IMAGE}",
        f"LABEL swerl.runtime={digest}",
    ]


def _stream_into(args: list[str], members: Iterator[tuple[Path, str]], what: str) -> None:
    """Run ``args`` (docker import / build reading a tar on stdin) on a tar of ``members``."""
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            for host, arcname in members:
                tar.add(str(host), arcname=arcname, recursive=True)
    except BrokenPipeError:
        pass
    finally:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()
    if proc.wait() != 0:
        raise ImageBuildError(f"{what} failed (exit {proc.returncode})")


def _code_context(inputs: Inputs, runtime_tag: str, work: Path) -> Path:
    """The build context of the code layer: a Dockerfile and a copy of the repository's files."""
    (work / "Dockerfile").write_text(f"FROM {runtime_tag}\nCOPY src/ {SRC_IN_IMAGE}/\n")
    for name in repo_files(inputs.repo):
        target = work / "src" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(inputs.repo / name, target)
    return work


def build(inputs: Inputs, log: Callable[[str], object] = print) -> str:
    """Build what is missing of the two images; return the service image's tag.

    The runtime (gigabytes: the venv holds torch) is a ``docker import``, redone only when the
    environment changes; the code is a thin ``docker build`` layer on it (no registry: its
    ``FROM`` is the local runtime image).
    """
    runtime_tag, tag = image_tags(inputs)
    if _docker("image", "inspect", tag).returncode == 0:
        log(f"cpu image {tag} cached")
        return tag
    if _docker("image", "inspect", runtime_tag).returncode != 0:
        log(f"importing {runtime_tag}: base tree, Python runtime, venv, redis (minutes)")
        args = ["docker", "import"]
        for change in import_changes(inputs, runtime_tag.rsplit(":", 1)[1]):
            args += ["--change", change]
        _stream_into([*args, "-", runtime_tag], _runtime_members(inputs), "docker import")
    log(f"building {tag}: the repository's code on {runtime_tag}")
    with tempfile.TemporaryDirectory() as work:
        context = _code_context(inputs, runtime_tag, Path(work))
        res = _docker("build", "-q", "-t", tag, str(context))
        if res.returncode != 0:
            raise ImageBuildError(f"docker build of {tag} failed: {res.stderr.strip()[-2000:]}")
    return tag


def stale_tags(tags: list[str], runtime_tag: str, tag: str) -> list[str]:
    """The images a build of ``tag`` on ``runtime_tag`` supersedes: other runtimes, and code
    images of other runtimes or of this runtime's earlier code (each costs disk: a runtime holds
    gigabytes). ``tags`` are ``repository:tag`` names of the engine."""
    stale = []
    for name in tags:
        repo, _, version = name.partition(":")
        ours = repo == RUNTIME_REPOSITORY or _CODE_TAG.match(version) is not None
        if ours and repo in (REPOSITORY, RUNTIME_REPOSITORY) and name not in (tag, runtime_tag):
            stale.append(name)
    return sorted(set(stale))


def prune(inputs: Inputs, log: Callable[[str], object] = print) -> list[str]:
    """Remove the images :func:`stale_tags` names; one still used by a container stays (the
    engine refuses), so a concurrent run of another checkout keeps its image."""
    runtime_tag, tag = image_tags(inputs)
    listing = _docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}")
    tags = [t for t in listing.stdout.split() if t.startswith((REPOSITORY, RUNTIME_REPOSITORY))]
    removed = []
    for name in stale_tags(tags, runtime_tag, tag):
        if _docker("image", "rm", name).returncode == 0:
            removed.append(name)
            log(f"removed {name}")
    return removed


def compose_env(inputs: Inputs, tag: str, data: Path | None = None) -> dict[str, str]:
    """The compose variables of this machine's cpu profile; ``data`` (default
    ``<model cache>/compose``) holds the checkpoints and weights volumes' directories and the
    evaluator's inputs."""
    data = data or inputs.models / "compose"
    return {
        "SWERL_IMAGE": tag,
        "SWERL_SRC": SRC_IN_IMAGE,
        "SWERL_PYTHON_ROOT": str(inputs.python_root),
        "SWERL_VENV": str(inputs.venv),
        "SWERL_MODELS_DIR": str(inputs.models),
        "SWERL_CHECKPOINT_DIR": str(data / "checkpoints"),
        "SWERL_WEIGHTS_DIR": str(data / "weights"),
        "SWERL_EVAL_INPUTS_DIR": str(data / "eval-inputs"),
        "SWERL_RUNS_DIR": str(data / "runs"),
        "SWERL_EVAL_RUNS_DIR": str(data / "eval-runs"),
        "SWERL_TASKSETS_DIR": str(inputs.models / "tasksets"),  # images add's registry
    }


BIND_DIRS = (
    "SWERL_CHECKPOINT_DIR",
    "SWERL_WEIGHTS_DIR",
    "SWERL_EVAL_INPUTS_DIR",
    "SWERL_RUNS_DIR",
    "SWERL_EVAL_RUNS_DIR",
    "SWERL_SANDBOX_STATE",
)


def template_values(template: Path = CPU_ENV) -> dict[str, str]:
    """The assignments of an env file (comments and blank lines left out)."""
    out = {}
    for line in template.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            out[key.strip()] = value
    return out


def make_volume_dirs(values: dict[str, str], template: Path = CPU_ENV) -> list[Path]:
    """Create every directory the cpu profile binds (compose refuses to start without them):
    checkpoints, weights, the evaluator's inputs, the runs and the sandbox state dir, from
    ``values`` or else the template's defaults. Returns them."""
    merged = {**template_values(template), **values}
    dirs = [Path(merged[key]) for key in BIND_DIRS if merged.get(key)]
    for path in dirs:
        path.mkdir(parents=True, exist_ok=True)
    return dirs


def is_shared_mount(path: Path, mountinfo: str) -> bool:
    """Whether the mount ``path`` lies on (the longest mount point above it in
    /proc/self/mountinfo's text) propagates shared: the worker's per-sandbox tmpfs mounts in the
    state dir must reach the host's Docker engine."""
    best, shared = "", False
    target = str(path.resolve())
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 7 or "-" not in fields:
            continue
        point = fields[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best = point
            shared = any(f.startswith("shared:") for f in fields[6 : fields.index("-")])
    return shared


def shared_mount_advice(state: Path) -> str:
    """The commands that make the sandbox state dir a shared mount (docs/deploy.md step 6)."""
    return (
        f"warning: {state} is not on a shared mount, so the sandbox worker's per-sandbox "
        "tmpfs mounts would not reach the Docker engine; as root run once (after each reboot):\n"
        f"  mount --bind {state} {state} && mount --make-rshared {state}"
    )


def write_env(path: Path, values: dict[str, str], template: Path = CPU_ENV) -> None:
    """``template`` with ``values`` replacing (or appended to) its assignments."""
    lines, seen = [], set()
    for line in template.read_text().splitlines():
        key = line.split("=", 1)[0]
        if "=" in line and not line.startswith("#") and key in values:
            line, _ = f"{key}={values[key]}", seen.add(key)
        lines.append(line)
    lines += [f"{k}={v}" for k, v in values.items() if k not in seen]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python deploy/cpu_image.py",
        description="Build (docker import, cached by content hash) the image of every CPU "
        "service of compose.yaml's cpu profile from the set-up environment.",
    )
    parser.add_argument(
        "command",
        choices=("build", "tag", "env", "prune"),
        help="build the images / print the tag / print the compose variables / remove the "
        "images this build supersedes",
    )
    parser.add_argument("--venv", type=Path, help="the venv to ship (default: .venv's target)")
    parser.add_argument("--env-out", type=Path, help="build: write the cpu env file here")
    args = parser.parse_args(argv)
    try:
        inputs = Inputs.from_environment(args.venv)
        if args.command == "prune":
            prune(inputs, log=lambda m: print(m, file=sys.stderr))
            return 0
        if args.command == "build":
            tag = build(inputs, log=lambda m: print(m, file=sys.stderr))
        else:
            tag = image_tags(inputs)[1]
    except (ImageBuildError, subprocess.CalledProcessError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.command == "env":
        print("\n".join(f"{k}={v}" for k, v in compose_env(inputs, tag).items()))
    elif args.env_out:
        values = compose_env(inputs, tag)
        make_volume_dirs(values)
        write_env(args.env_out, values)
        state = Path(template_values()["SWERL_SANDBOX_STATE"])
        with contextlib.suppress(OSError):
            if not is_shared_mount(state, Path("/proc/self/mountinfo").read_text()):
                print(shared_mount_advice(state), file=sys.stderr)
        print(args.env_out)
    else:
        print(tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
