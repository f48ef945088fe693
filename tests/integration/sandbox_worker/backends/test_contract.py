"""The sandbox contract: both backends (docker, bwrap) must pass every test here.

Tests marked ``@WITH_LOCALDIR`` also run against the LocalDir test double
(:mod:`sandbox_worker.testing.local_sandbox`): the part of the contract it claims to honour
(exec results, timeouts and argument checks, ``diff``, missing images, duplicate ids, the
context manager). The rest it does not honour by design -- it runs the host's bash in a host
directory: no isolation or read-only root (file-permission errors, ``/tmp`` shared between
sandboxes, ``$HOME`` is its scratch directory), no network or relay, no limits or quotas, no
background processes or exposed ports, no output cap, no state outside the test process
(nothing for a restarted worker's ``cleanup_node`` to find).

Real dockerd (private socket), real bubblewrap, the tiny test instance image built from
debootstrap (tests/support). Containment tests check what the agent must not be able to do:
reach the network (except the adapter through the relay), write outside /testbed and /tmp, or
exceed its pids, memory and cpu limits.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox_worker.backends import (
    DiskQuotaError,
    ImageNotFoundError,
    LlmRelay,
    NetworkPolicy,
    Sandbox,
    SandboxBackend,
    SandboxInfraError,
    SandboxLimits,
    SandboxSpec,
)
from sandbox_worker.testing.local_sandbox import LocalDirBackend
from tests.integration.sandbox_worker.conftest import WITH_LOCALDIR, SessionEnv
from tests.support.paths import REPO_ROOT

pytestmark = [pytest.mark.docker, pytest.mark.timeout(180)]


def _sid() -> str:
    return f"s{uuid.uuid4().hex[:10]}"


@pytest.fixture
def spec(backend: SandboxBackend, node: str, sandbox_env: SessionEnv) -> object:
    """``spec(**spec_fields)``: a spec of this test's node and image (for the LocalDir double,
    with a host directory of its own as the workdir)."""

    def _spec(**fields: object) -> SandboxSpec:
        fields = {"image": sandbox_env.image, "node": node, "sandbox_id": _sid(), **fields}
        if isinstance(backend, LocalDirBackend):
            fields.setdefault("workdir", str(sandbox_env.root / "localdir" / fields["sandbox_id"]))
        return SandboxSpec(**fields)  # type: ignore[arg-type]

    return _spec


@pytest.fixture
def make(backend: SandboxBackend, spec) -> Iterator[object]:
    """``make(**spec_fields)`` creates a sandbox of this test; all are destroyed at the end."""
    made: list[Sandbox] = []

    def _make(**fields: object) -> Sandbox:
        sb = backend.create(spec(**fields))
        made.append(sb)
        return sb

    yield _make
    for sb in made:
        sb.destroy()


class _Adapter(http.server.BaseHTTPRequestHandler):
    """Stand-in for the LLM adapter: answers every GET with the path it saw."""

    def do_GET(self) -> None:
        body = json.dumps({"adapter": True, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def adapter() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Adapter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


# -- exec -------------------------------------------------------------------------------------


@WITH_LOCALDIR
def test_exec_exit_codes_and_merged_output(make) -> None:
    sb = make()
    res = sb.exec("echo to-out; echo to-err >&2; exit 7")
    assert res.exit_code == 7
    assert not res.timed_out
    assert res.output.splitlines() == ["to-out", "to-err"]
    assert sb.exec(["true"]).exit_code == 0
    assert sb.exec(["false"]).exit_code == 1
    listed = sb.exec(["python3", "-c", "import sys; print(sys.argv[1:])", "a b", "$HOME"])
    assert listed.output.strip() == "['a b', '$HOME']"
    assert sb.exec("pwd").output.strip() == sb.spec.workdir  # /testbed in real sandboxes
    assert sb.exec("pwd", workdir="/tmp").output.strip() == "/tmp"
    assert sb.exec("exit 300").exit_code == 300 % 256


@WITH_LOCALDIR
def test_exec_missing_binary_is_a_result_not_an_error(make) -> None:
    sb = make()
    res = sb.exec("no-such-command-xyz")
    assert res.exit_code == 127
    assert "not found" in res.output
    res = sb.exec(["no-such-command-xyz", "arg"])
    assert res.exit_code == 127
    assert "no-such-command-xyz" in res.output
    assert sb.exec([f"{sb.spec.workdir}/calc.py"]).exit_code == 126  # not executable
    assert sb.exec(["true"], workdir="/no/such/dir").exit_code == 126


@WITH_LOCALDIR
def test_exec_timeout_kills_the_command(make) -> None:
    sb = make()
    started = time.monotonic()
    res = sb.exec("echo started; sleep 60 & sleep 60; echo never", timeout_s=1.5)
    elapsed = time.monotonic() - started
    assert res.timed_out
    assert elapsed < 15
    assert "started" in res.output and "never" not in res.output
    # the sandbox is still usable after a timeout
    assert sb.exec("echo alive").output.strip() == "alive"
    quick = sb.exec("echo quick", timeout_s=30)
    assert not quick.timed_out and quick.exit_code == 0


def test_exec_environment(make) -> None:
    sb = make(env={"SPEC_VAR": "spec", "OVERRIDE": "spec"})
    out = sb.exec(
        'echo "$SPEC_VAR|$OVERRIDE|$CALL_VAR|$HOME|$LANG"',
        env={"OVERRIDE": "call", "CALL_VAR": "c"},
    ).output.strip()
    assert out == "spec|call|c|/tmp|C.UTF-8"
    assert "/usr/bin" in sb.exec("echo $PATH").output
    # the host's environment does not leak in
    assert sb.exec("env").output.count("PYTEST_CURRENT_TEST") == 0


@WITH_LOCALDIR
def test_exec_rejects_bad_arguments(make) -> None:
    sb = make()
    with pytest.raises(ValueError):
        sb.exec("")
    with pytest.raises(ValueError):
        sb.exec([])
    with pytest.raises(ValueError):
        sb.exec("true", timeout_s=0)
    with pytest.raises(ValueError):
        sb.exec("true", workdir="relative")


def test_exec_output_is_capped(make) -> None:
    res = make().exec("head -c 20000000 /dev/zero | tr '\\0' a; echo; echo END")
    assert res.exit_code == 0
    assert len(res.output) < 10_000_000
    assert "bytes of output dropped" in res.output
    assert res.output.rstrip().endswith("END")


# -- files ------------------------------------------------------------------------------------


def test_write_and_read_files(make) -> None:
    sb = make()
    payload = bytes(range(256)) * 10
    sb.write_file("/testbed/sub/dir/blob.bin", payload, mode=0o755)
    assert sb.read_file("/testbed/sub/dir/blob.bin") == payload
    assert sb.exec("stat -c %a /testbed/sub/dir/blob.bin").output.strip() == "755"
    sb.write_file("/tmp/note.txt", b"hello")
    assert sb.exec("cat /tmp/note.txt").output == "hello"
    assert sb.read_file("/testbed/calc.py").startswith(b"def add")
    # read-only places can be read
    assert b"bookworm" in sb.read_file("/etc/os-release")
    with pytest.raises(FileNotFoundError):
        sb.read_file("/testbed/missing.txt")
    with pytest.raises(IsADirectoryError):
        sb.read_file("/testbed")
    with pytest.raises(PermissionError):
        sb.write_file("/etc/evil", b"x")
    with pytest.raises(PermissionError):
        sb.write_file("/usr/bin/evil", b"x")
    with pytest.raises(ValueError):
        sb.write_file("relative.txt", b"x")


def test_copy_in_and_out(make, tmp_path: Path) -> None:
    sb = make()
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "nested" / "b.txt").write_text("B")
    sb.copy_in(src, "/testbed/incoming")
    assert sb.exec("cat incoming/a.txt incoming/nested/b.txt").output == "AB"
    single = tmp_path / "single.txt"
    single.write_text("one file")
    sb.copy_in(single, "/tmp/deep/renamed.txt")
    assert sb.read_file("/tmp/deep/renamed.txt") == b"one file"

    sb.exec("mkdir -p /tmp/out/x && echo made > /tmp/out/x/y.txt")
    dest = tmp_path / "back" / "out"
    sb.copy_out("/tmp/out", dest)
    assert (dest / "x" / "y.txt").read_text() == "made\n"
    sb.copy_out("/testbed/calc.py", tmp_path / "calc_copy.py")
    assert (tmp_path / "calc_copy.py").read_text().startswith("def add")
    with pytest.raises(FileNotFoundError):
        sb.copy_out("/testbed/nope", tmp_path / "nope")
    with pytest.raises(FileNotFoundError):
        sb.copy_in(tmp_path / "does-not-exist", "/tmp/x")
    with pytest.raises(PermissionError):
        sb.copy_in(single, "/opt/x.txt")


@WITH_LOCALDIR
def test_diff_against_base_includes_new_and_deleted_files(make) -> None:
    sb = make()
    base = sb.exec("git rev-parse HEAD").output.strip()
    assert len(base) == 40
    assert sb.diff(base) == ""
    sb.exec("sed -i 's/a + b/a - b/' calc.py && rm README.md && mkdir pkg && echo new > pkg/n.txt")
    patch = sb.diff(base)
    assert "-    return a + b\n+    return a - b" in patch
    assert "diff --git a/README.md b/README.md\ndeleted file mode" in patch
    assert "diff --git a/pkg/n.txt b/pkg/n.txt\nnew file mode 100644" in patch
    # the patch applies to a clean checkout of the base commit
    fresh = make()
    patch_file = f"/tmp/{fresh.spec.sandbox_id}.diff"  # the double's /tmp is the host's
    fresh.write_file(patch_file, patch.encode())
    applied = fresh.exec(f"git apply {patch_file} && cat pkg/n.txt && test ! -e README.md")
    fresh.exec(f"rm -f {patch_file}")
    assert applied.exit_code == 0, applied.output
    with pytest.raises(ValueError):
        sb.diff("HEAD; rm -rf /")


def test_sandboxes_are_isolated_from_each_other(make) -> None:
    one, two = make(), make()
    one.exec("echo mine > /testbed/calc.py && echo t > /tmp/t")
    assert two.read_file("/testbed/calc.py").startswith(b"def add")
    assert two.exec("test -e /tmp/t").exit_code == 1


# -- lifecycle --------------------------------------------------------------------------------


def test_destroy_is_idempotent_and_leaves_nothing(
    backend: SandboxBackend, node: str, sandbox_env: SessionEnv
) -> None:
    sb = backend.create(SandboxSpec(image=sandbox_env.image, node=node, sandbox_id=_sid()))
    sb.exec("echo x > /tmp/x")
    assert backend.list_sandboxes(node) == [sb.spec.sandbox_id]
    state_root = sandbox_env.root / backend.name
    assert any(state_root.iterdir())
    sb.destroy()
    sb.destroy()
    assert backend.list_sandboxes(node) == []
    assert not any(p.name.startswith(node) for p in state_root.iterdir())
    with pytest.raises(SandboxInfraError):
        sb.exec("true")


@WITH_LOCALDIR
def test_context_manager_destroys(backend: SandboxBackend, node: str, spec) -> None:
    with backend.create(spec()) as sb:
        assert sb.exec("true").exit_code == 0
    assert backend.list_sandboxes(node) == []


@WITH_LOCALDIR
def test_missing_image_is_image_not_found(backend: SandboxBackend, node: str, spec) -> None:
    assert backend.image_available("swerl/no-such-image:never") is False
    with pytest.raises(ImageNotFoundError) as err:
        backend.create(spec(image="swerl/no-such-image:never"))
    assert isinstance(err.value, SandboxInfraError)
    assert "no-such-image" in str(err.value)
    assert backend.list_sandboxes(node) == []


@WITH_LOCALDIR
def test_duplicate_sandbox_id_is_rejected(make, backend: SandboxBackend, spec) -> None:
    sb = make()
    with pytest.raises(SandboxInfraError):
        backend.create(spec(sandbox_id=sb.spec.sandbox_id))
    assert sb.exec("true").exit_code == 0  # the original is untouched


def test_cleanup_node_removes_only_that_nodes_sandboxes(
    backend: SandboxBackend, node: str, sandbox_env: SessionEnv
) -> None:
    crashed = f"{node}-crashed"
    leftovers = [
        backend.create(SandboxSpec(image=sandbox_env.image, node=crashed, sandbox_id=_sid()))
        for _ in range(2)
    ]
    leftovers[0].spawn("sleep 300")  # a running process must not block the cleanup
    survivor = backend.create(SandboxSpec(image=sandbox_env.image, node=node, sandbox_id=_sid()))
    try:
        assert backend.cleanup_node(crashed) == 2
        assert backend.list_sandboxes(crashed) == []
        assert backend.cleanup_node(crashed) == 0
        assert survivor.exec("echo ok").output.strip() == "ok"
    finally:
        survivor.destroy()
        for sb in leftovers:
            sb.destroy()  # already gone: must be a no-op


def test_invalid_specs_are_rejected(sandbox_env: SessionEnv) -> None:
    image = sandbox_env.image
    with pytest.raises(ValueError):
        SandboxSpec(image=image, node="Bad_Node", sandbox_id="s1")
    with pytest.raises(ValueError):
        SandboxSpec(image=image, node="n", sandbox_id="has.dot")
    with pytest.raises(ValueError):
        SandboxSpec(image=image, node="n", sandbox_id="s1", workdir="testbed")
    with pytest.raises(ValueError):
        SandboxSpec(image=image, node="n", sandbox_id="s1", network=NetworkPolicy.LLM_RELAY_ONLY)
    with pytest.raises(ValueError):
        SandboxSpec(image=image, node="n", sandbox_id="s1", ro_mounts={"rel": "/x"})
    with pytest.raises(ValueError):
        SandboxLimits(pids=1)
    for bad in ({"disk_mb": 0}, {"disk_mb": 15}, {"inodes": 100}, {"disk_mb": True}):
        with pytest.raises(ValueError):
            SandboxLimits(**bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        LlmRelay("127.0.0.1", 0, trajectory_id="t")
    with pytest.raises(ValueError):
        LlmRelay("127.0.0.1", 8100, trajectory_id="../other")


# -- background processes and exposed ports ---------------------------------------------------


def _http_get_unix(path: Path, url_path: str) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(10)
        s.connect(str(path))
        s.sendall(f"GET {url_path} HTTP/1.0\r\nHost: sandbox\r\n\r\n".encode())
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_spawn_and_expose_a_server(make) -> None:
    sb = make()
    server = sb.spawn("exec python3 -m http.server 8000 --bind 127.0.0.1", log_path="/tmp/http.log")
    deadline = time.monotonic() + 20
    while sb.exec(
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8000))'"
    ).exit_code:
        assert time.monotonic() < deadline, sb.exec("cat /tmp/http.log").output
        time.sleep(0.2)
    assert server.is_running() and server.exit_code() is None
    sock = sb.expose(8000)
    reply = _http_get_unix(sock, "/calc.py")
    assert reply.startswith(b"HTTP/1.0 200")
    assert reply.endswith(b"def add(a, b):\n    return a + b\n")
    server.kill()
    deadline = time.monotonic() + 10
    while server.is_running():
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert server.exit_code() is not None
    short = sb.spawn("exit 3")
    deadline = time.monotonic() + 10
    while short.exit_code() is None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert short.exit_code() == 3


# -- containment ------------------------------------------------------------------------------


_CONNECT = (
    "import socket, sys\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
    "    print('CONNECTED')\n"
    "except OSError as exc:\n"
    "    print('BLOCKED', type(exc).__name__)\n"
)


@pytest.mark.parametrize("network", [NetworkPolicy.NONE, NetworkPolicy.LLM_RELAY_ONLY])
def test_no_network_except_the_relay(make, adapter: int, network: NetworkPolicy) -> None:
    relay = (
        LlmRelay("127.0.0.1", adapter, trajectory_id="traj-1")
        if network is NetworkPolicy.LLM_RELAY_ONLY
        else None
    )
    sb = make(network=network, llm_relay=relay)
    # a server listening on the host's loopback is not reachable ...
    res = sb.exec(["python3", "-c", _CONNECT, "127.0.0.1", str(adapter)])
    assert res.output.startswith("BLOCKED"), res.output
    # ... nor is any other address
    res = sb.exec(["python3", "-c", _CONNECT, "192.0.2.1", "80"])
    assert res.output.startswith("BLOCKED"), res.output
    interfaces = sb.exec("cat /proc/net/dev").output
    assert [ln.split(":")[0].strip() for ln in interfaces.splitlines()[2:]] == ["lo"]
    if network is NetworkPolicy.NONE:
        assert sb.llm_base_url is None
        assert sb.exec("test -e /swerl/ctl/llm.sock").exit_code == 1


def test_llm_relay_reaches_exactly_the_adapter(make, adapter: int) -> None:
    sb = make(
        network=NetworkPolicy.LLM_RELAY_ONLY,
        llm_relay=LlmRelay("127.0.0.1", adapter, 18080, trajectory_id="traj-1"),
    )
    assert sb.llm_base_url == "http://127.0.0.1:18080"
    fetch = (
        "import sys, urllib.request\n"
        "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
    )
    res = sb.exec(["python3", "-c", fetch, f"{sb.llm_base_url}/t/traj-1/v1/models"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"adapter": True, "path": "/t/traj-1/v1/models"}
    # several sequential and concurrent requests go through
    many = (
        "import sys, urllib.request, concurrent.futures as cf\n"
        "get = lambda i: urllib.request.urlopen(sys.argv[1], timeout=10).read()\n"
        "with cf.ThreadPoolExecutor(8) as ex: print(len(list(ex.map(get, range(32)))))\n"
    )
    own_models = f"{sb.llm_base_url}/t/traj-1/v1/models"
    assert sb.exec(["python3", "-c", many, own_models]).output.strip() == "32"
    # only the sandbox's own trajectory routes pass (tests/e2e/test_sandbox_isolation.py has
    # the full list of refused requests against a real adapter)
    res = sb.exec(["python3", "-c", fetch, f"{sb.llm_base_url}/t/traj-2/v1/models"])
    assert "HTTP Error 403" in res.output, res.output
    # other loopback ports in the sandbox lead nowhere
    res = sb.exec(["python3", "-c", _CONNECT, "127.0.0.1", "18081"])
    assert res.output.startswith("BLOCKED"), res.output


def test_llm_relay_to_a_dead_adapter_fails_cleanly(make) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    sb = make(
        network=NetworkPolicy.LLM_RELAY_ONLY,
        llm_relay=LlmRelay("127.0.0.1", dead_port, trajectory_id="traj-1"),
    )
    fetch = (
        "import sys, urllib.request\n"
        "try:\n"
        "    urllib.request.urlopen(sys.argv[1], timeout=5)\n"
        "except Exception as exc:\n"
        "    print('FAILED', type(exc).__name__)\n"
    )
    res = sb.exec(["python3", "-c", fetch, f"{sb.llm_base_url}/t/traj-1/v1/models"], timeout_s=30)
    assert res.output.startswith("FAILED"), res.output


def test_cannot_write_outside_workspace(make) -> None:
    sb = make()
    for path in ("/usr/evil", "/etc/evil", "/evil", "/root/evil", "/var/evil", "/opt/evil"):
        res = sb.exec(f"echo x > {path}")
        assert res.exit_code != 0, path
        assert "Read-only file system" in res.output, res.output
    assert (
        sb.exec("echo ok > /testbed/ok && echo ok > /tmp/ok && echo ok > $HOME/ok").exit_code == 0
    )
    assert sb.exec("mount -o remount,rw / 2>&1").exit_code != 0
    assert sb.exec("echo x > /etc/passwd").exit_code != 0


# -- attribution: what the agent must not be able to turn into an infrastructure failure -----
#
# An infrastructure failure (SandboxInfraError, a dead relay) makes the trajectory `aborted`:
# retried and excluded from training. Whatever the agent does in its sandbox must therefore
# leave the relay and the sandbox itself working (docs/sandboxes.md, "Attribution").

_FETCH = (
    "import sys, urllib.request\n"
    "print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())\n"
)


def _relay_sandbox(make, adapter: int, **fields: object) -> Sandbox:
    relay = LlmRelay("127.0.0.1", adapter, trajectory_id="traj-1")
    return make(network=NetworkPolicy.LLM_RELAY_ONLY, llm_relay=relay, **fields)


def _assert_relay_works(sb: Sandbox) -> None:
    """An LLM call from inside the sandbox reaches the adapter through the relay."""
    res = sb.exec(["python3", "-c", _FETCH, f"{sb.llm_base_url}/t/traj-1/v1/models"], timeout_s=60)
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"adapter": True, "path": "/t/traj-1/v1/models"}


def _control_dir(sb: Sandbox) -> dict[str, str]:
    """The host side of the sandbox's control dir: each entry's kind, or a file's content."""
    ctl = sb._state / "ctl"  # type: ignore[attr-defined]
    out = {}
    for entry in sorted(ctl.iterdir()):
        if entry.is_socket():
            out[entry.name] = "socket"
        elif not entry.name.endswith(".log"):  # a relay may log a refused connection
            out[entry.name] = entry.read_text(errors="replace")
    return out


# Every way a root shell deletes, moves, overwrites or locks a file, tried on each socket,
# relay script, pid and ready file it can find anywhere, and on the old control dir's paths.
_DESTROY_CONTROL_FILES = r"""
found=$(find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o \
  \( -type s -o -name inner_relay.py -o -name '*.pid' -o -name '*.ready' \) -print 2>/dev/null)
for f in /swerl/ctl/llm.sock /swerl/ctl/inner_relay.py /swerl/ctl/bg-0.pid /swerl/ctl/llm.ready \
         $found; do
  chmod 000 "$f"; echo x > "$f"; mv -f "$f" /tmp/moved; rm -f "$f"
done
mkdir -p /swerl/ctl; echo evil > /swerl/ctl/llm.sock; rm -rf /swerl/ctl /swerl/ctl/*
echo "FOUND: $found"
"""


def test_the_agent_cannot_touch_the_control_dir_or_the_relay_socket(make, adapter: int) -> None:
    sb = _relay_sandbox(make, adapter)
    sb.spawn("sleep 300")  # its bookkeeping (a pid file, once) must be out of reach too
    sb.expose(8000)  # and the sockets of exposed ports
    before = _control_dir(sb)
    assert before["llm.sock"] == "socket" and "port-8000.sock" in before, before
    res = sb.exec(_DESTROY_CONTROL_FILES, timeout_s=120)
    found = [ln for ln in res.output.splitlines() if ln.startswith("FOUND:")]
    assert len(found) == 1, res.output
    # nothing of the control dir is visible inside the sandbox ...
    assert "llm.sock" not in found[0] and "inner_relay" not in found[0], found
    # ... nor changed on the host, and the LLM relay still answers
    assert _control_dir(sb) == before
    _assert_relay_works(sb)


_KILL_EVERY_VISIBLE_PROCESS = (
    'for p in /proc/[0-9]*; do p=${p#/proc/}; [ "$p" = "$$" ] || kill -9 "$p"; done; kill -9 -1'
)


def test_killing_every_process_the_agent_can_see_leaves_the_relay_working(
    make, adapter: int
) -> None:
    sb = _relay_sandbox(make, adapter)
    sb.expose(8000)
    sb.spawn("sleep 300")
    for _ in range(2):  # twice: a relay restarted by the first round would die in the second
        sb.exec(_KILL_EVERY_VISIBLE_PROCESS, timeout_s=60)
    assert sb.exec("true").exit_code == 0
    _assert_relay_works(sb)


# Attaches to PID 1 with ptrace and resumes it with SIGKILL, which even an init cannot ignore.
_PTRACE_KILL_PID1 = r"""python3 - <<'EOF'
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
if libc.ptrace(16, 1, None, None) == 0:  # PTRACE_ATTACH
    os.waitpid(1, 0)
    libc.ptrace(7, 1, None, ctypes.c_void_p(9))  # PTRACE_CONT delivering SIGKILL
print("ATTACH", os.strerror(ctypes.get_errno()))
EOF"""


@pytest.mark.parametrize(
    "attack",
    [
        "kill -9 1; kill -STOP 1; kill -9 -1",
        "kill -TERM 1",
        "for s in $(seq 1 64); do kill -$s 1; done",
        _PTRACE_KILL_PID1,
    ],
    ids=["kill-9", "term-pid1", "every-signal-pid1", "ptrace-pid1"],
)
def test_the_agent_cannot_end_its_sandbox(make, attack: str) -> None:
    """The agent (root in its sandbox) signals or traces PID 1: its own processes may
    die, the sandbox must not -- it still runs commands and serves files, so that the patch
    can be extracted and the outcome is the policy's (docker: a container ends with its PID 1;
    bwrap: each command has a pid namespace of its own)."""
    sb = make(limits=SandboxLimits(memory_mb=256, pids=128))
    sb.spawn("sleep 300")
    sb.exec(attack, timeout_s=60)
    time.sleep(0.5)  # a container whose PID 1 died takes a moment to stop
    assert sb.exec("true").exit_code == 0
    assert sb.exec(["echo", "alive"]).output == "alive\n"
    assert sb.read_file("/testbed/calc.py").startswith(b"def add")


def _until_oserror(statement: str, attempts: int) -> str:
    """A Python program running ``statement`` (one line; ``n`` counts) up to ``attempts``
    times; it prints ``STOPPED <n> <errno name>`` at the first OSError, else ``UNBOUNDED <n>``."""
    return (
        "import errno, os, time\n"
        "n = 0\n"
        "try:\n"
        f"    while n < {attempts}:\n"
        f"        {statement}\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print('STOPPED', n, errno.errorcode.get(exc.errno, exc.errno))\n"
        "else:\n"
        "    print('UNBOUNDED', n)\n"
    )


def test_pids_limit_bounds_a_fork_bomb(make) -> None:
    limit = 48
    sb = make(limits=SandboxLimits(pids=limit, memory_mb=512))
    bomb = "if os.fork() == 0: os.close(1); os.close(2); time.sleep(30); os._exit(0)"
    res = sb.exec(["python3", "-c", _until_oserror(bomb, 1000)], timeout_s=60)
    words = res.output.split()
    assert words[0] == "STOPPED", res.output
    forked = int(words[1])
    assert limit // 2 < forked < limit
    sb.exec("pkill -KILL -f 'time.sleep' || true")


def test_memory_limit_is_enforced(make) -> None:
    sb = make(limits=SandboxLimits(memory_mb=128, pids=64))
    hog = (
        "import sys\n"
        "blocks = []\n"
        "for i in range(int(sys.argv[1])):\n"
        "    blocks.append(bytearray(16 * 1024 * 1024))\n"
        "print('ALLOCATED', len(blocks) * 16, 'MB')\n"
    )
    small = sb.exec(["python3", "-c", hog, "2"])
    assert small.output.strip() == "ALLOCATED 32 MB", small.output
    big = sb.exec(["python3", "-c", hog, "32"], timeout_s=60)
    assert big.exit_code != 0
    assert "ALLOCATED" not in big.output
    assert sb.exec("echo still-alive").output.strip() == "still-alive"


def test_cpu_limit_is_enforced(make) -> None:
    sb = make(limits=SandboxLimits(cpus=0.25))
    spin = (
        "import time\n"
        "w0, c0 = time.monotonic(), time.process_time()\n"
        "while time.monotonic() - w0 < 2.0:\n"
        "    pass\n"
        "print(time.process_time() - c0)\n"
    )
    cpu_s = float(sb.exec(["python3", "-c", spin], timeout_s=60).output.strip())
    # 0.25 cpus over 2 s is 0.5 cpu-seconds; unthrottled it would be close to 2.0
    assert cpu_s < 0.9, cpu_s


# -- disk and inode quota ---------------------------------------------------------------------


def _mount_of(path: Path) -> tuple[str, str]:
    """(filesystem type, super options) of the mount at exactly ``path`` (mountinfo)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(path):
            sep = fields.index("-")
            return fields[sep + 1], fields[sep + 3]
    raise AssertionError(f"{path} is not a mount point")


def test_disk_quota_gives_enospc_and_spares_the_host_disk(make) -> None:
    quota_mb = 32
    sb = make(limits=SandboxLimits(disk_mb=quota_mb, memory_mb=512))
    state = sb._state  # the per-sandbox host dir that holds /testbed, /tmp and the control dir
    fstype, options = _mount_of(state)
    assert fstype == "tmpfs" and f"size={quota_mb * 1024}k" in options, (fstype, options)
    # /tmp first: 48 MiB do not fit in 32 MiB, and the sandbox says so with ENOSPC.
    res = sb.exec("dd if=/dev/zero of=/tmp/big bs=1M count=48 2>&1", timeout_s=60)
    assert res.exit_code != 0 and "No space left on device" in res.output, res.output
    # The quota is shared: /testbed is full too.
    res = sb.exec("dd if=/dev/zero of=/testbed/more bs=1M count=8 2>&1", timeout_s=60)
    assert res.exit_code != 0 and "No space left on device" in res.output, res.output
    res = sb.exec("du -sm --total /tmp /testbed | tail -1", timeout_s=60)
    assert int(res.output.split()[0]) <= quota_mb, res.output
    # What the sandbox wrote filled its own tmpfs, so none of it is on the host's disk.
    fs = os.statvfs(state)
    assert fs.f_blocks * fs.f_frsize == quota_mb * 1024 * 1024
    assert fs.f_bavail * fs.f_frsize < 1024 * 1024, fs
    # The file helpers report it as the quota (ENOSPC), not as an infrastructure failure.
    with pytest.raises(DiskQuotaError) as info:
        sb.write_file("/tmp/helper", b"x" * (4 * 1024 * 1024))
    assert info.value.errno == errno.ENOSPC
    # The sandbox still works, and deleting frees the space again.
    assert sb.exec("rm -f /tmp/big /testbed/more && echo freed").output.strip() == "freed"
    assert sb.exec("dd if=/dev/zero of=/tmp/again bs=1M count=8 2>&1").exit_code == 0


def test_inode_quota_bounds_the_number_of_files(make) -> None:
    inodes = 2048
    sb = make(limits=SandboxLimits(inodes=inodes, memory_mb=512))
    flood = _until_oserror("open(f'/tmp/f{n}', 'w').close()", 20000)
    res = sb.exec(["python3", "-c", flood], timeout_s=120)
    words = res.output.split()
    assert words[0] == "STOPPED" and words[2] == "ENOSPC", res.output
    assert 0 < int(words[1]) < inodes
    assert sb.exec("echo still-alive").output.strip() == "still-alive"


def test_a_sandbox_whose_quota_a_background_process_filled_still_works(make) -> None:
    """Bytes and inodes exhausted by a process that stays alive (an agent's shell, say): later
    commands, file reads and the patch extraction still run -- a full disk is graded, never
    turned into an infrastructure failure."""
    sb = make(limits=SandboxLimits(disk_mb=24, inodes=1024, memory_mb=512))
    sb.exec("echo change >> README.md || echo change > new.txt", timeout_s=30)
    base = sb.exec("git rev-parse HEAD").output.strip()
    sb.write_file("/tmp/flood.py", _until_oserror("open(f'/tmp/f{n}', 'w').close()", 5000).encode())
    sb.spawn("dd if=/dev/zero of=/tmp/big bs=1M count=64; python3 /tmp/flood.py; sleep 600")

    def full() -> bool:
        fs = os.statvfs(sb._state)
        return fs.f_favail == 0 and fs.f_bavail * fs.f_frsize < 64 * 1024

    deadline = time.monotonic() + 60
    while not full() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert full(), os.statvfs(sb._state)
    assert sb.exec("echo ok").output.strip() == "ok"
    assert sb.read_file("/testbed/.git/HEAD").startswith(b"ref:")
    try:
        patch = sb.diff(base)
    except SandboxInfraError as exc:  # git cannot write its index: the runner's empty patch
        assert "git diff failed" in str(exc)
    else:
        assert "change" in patch
    res = sb.exec("touch /tmp/one-more 2>&1")
    assert res.exit_code != 0 and "No space left on device" in res.output, res.output


# -- the read-only Python bundle the OpenHands agent server will run from ---------------------


def test_host_python_bundle_runs_from_read_only_mounts(make) -> None:
    runtime = Path(sys.base_prefix)  # $(pyenv root)/versions/3.12.x
    venv = Path(sys.prefix)  # the project's .venv
    assert runtime != venv, "tests must run from the project venv"
    sb = make(ro_mounts={str(runtime): str(runtime), str(venv): str(venv)})
    probe = "import ssl, sqlite3, sys; print(sys.version_info[:2], ssl.OPENSSL_VERSION[:7])"
    res = sb.exec([str(venv / "bin" / "python"), "-c", probe])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"({sys.version_info[0]}, {sys.version_info[1]}) OpenSSL")
    # pydantic (a compiled dependency of the venv) imports too
    res = sb.exec([str(venv / "bin" / "python"), "-c", "import pydantic; print('ok')"])
    assert res.output.strip() == "ok", res.output
    assert sb.exec(f"touch {venv}/evil").exit_code != 0
    assert sb.exec(f"touch {runtime}/evil").exit_code != 0


# -- crash recovery ---------------------------------------------------------------------------

_CRASHING_WORKER = """
import sys, time
from pathlib import Path
from sandbox_worker.backends import make_backend, SandboxSpec
name, state_root, image, node, sid = sys.argv[1:6]
backend = make_backend(name, state_root=Path(state_root))
sb = backend.create(SandboxSpec(image=image, node=node, sandbox_id=sid))
sb.spawn("sleep 300")
sb.exec("echo leftover > /tmp/mark")
print("READY", flush=True)
time.sleep(300)
"""


def test_sandboxes_of_a_killed_worker_are_removed_by_cleanup_node(
    backend: SandboxBackend, node: str, sandbox_env: SessionEnv
) -> None:
    sid = _sid()
    state_root = sandbox_env.root / backend.name
    args = [backend.name, str(state_root), sandbox_env.image, node, sid]
    worker = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_WORKER, *args],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().strip() == "READY"
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
    assert backend.list_sandboxes(node) == [sid]  # the crash left the sandbox behind
    assert backend.cleanup_node(node) == 1
    assert backend.list_sandboxes(node) == []
    assert not any(p.name.startswith(f"{node}.") for p in state_root.iterdir())
