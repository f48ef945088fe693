"""The process harness with real child processes (small Python programs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.processes import (
    ManagedProcess,
    ProcessError,
    free_port,
    launch,
    start_in_parallel,
    tcp_open,
)
from tests.support.paths import REPO_ROOT


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def http_server(port: int) -> list[str]:
    return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]


def alive(pid: int) -> bool:
    """The pid exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_waits_for_the_url_and_logs_the_output(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "logs" / "web.log"
    with launch("web", http_server(port), log, ready=f"http://127.0.0.1:{port}/") as web:
        assert web.running()
        assert httpx.get(f"http://127.0.0.1:{port}/").status_code == 200  # ready means serving
    assert not web.running()
    assert web.returncode == -signal.SIGTERM  # a well-behaved child ends on SIGTERM
    assert '"GET / HTTP/1.1" 200' in log.read_text()  # the server's stderr is in its log


def test_a_predicate_can_say_ready(tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    code = (
        f"import pathlib, time; time.sleep(0.3); pathlib.Path({str(flag)!r}).touch(); "
        "time.sleep(60)"
    )
    with launch("flagger", python(code), tmp_path / "f.log", ready=flag.exists) as proc:
        assert flag.exists() and proc.running()


def test_a_crash_before_ready_is_an_error_with_the_log_tail(tmp_path: Path) -> None:
    code = "import sys; print('x' * 5000); print('bad flag --frobnicate', flush=True); sys.exit(3)"
    with pytest.raises(ProcessError) as caught:
        launch("crasher", python(code), tmp_path / "c.log", ready=tcp_open(free_port()))
    message = str(caught.value)
    assert message.startswith("crasher exited with 3 before it was ready")
    assert "bad flag --frobnicate" in message
    assert str(tmp_path / "c.log") in message
    assert len(message) < 3500  # the tail, not the whole log


def test_not_ready_in_time_is_an_error_and_the_process_is_stopped(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    with pytest.raises(ProcessError, match=r"sleeper was not ready after 1s"):
        launch("sleeper", python(code), tmp_path / "s.log", ready=lambda: False, timeout_s=1)
    assert wait_gone(int(pid_file.read_text()))


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    log = tmp_path / "stubborn.log"
    proc = launch("stubborn", python(code), log, ready=lambda: "up" in log.read_text())
    assert proc.stop(grace_s=0.5) == -signal.SIGKILL
    assert proc.stop() == -signal.SIGKILL  # idempotent


def test_stop_takes_the_childs_own_children_with_it(tmp_path: Path) -> None:
    grandchild = tmp_path / "grandchild"
    code = (
        "import subprocess, sys; "
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        f"open({str(grandchild)!r}, 'w').write(str(p.pid)); p.wait()"
    )
    proc = launch("parent", python(code), tmp_path / "p.log", ready=grandchild.exists)
    time.sleep(0.1)
    pid = int(grandchild.read_text())
    assert alive(pid)
    proc.stop()
    assert wait_gone(pid)


def test_the_port_is_free_again_after_stop(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    first = launch("first", http_server(port), tmp_path / "1.log", ready=url)
    first.stop()
    # A restart on the same port (as a restarted Redis keeps its port) finds it free.
    with launch("second", http_server(port), tmp_path / "2.log", ready=url) as second:
        assert httpx.get(url).status_code == 200
        assert second.pid != first.pid


def test_a_caller_that_exits_without_stopping_leaves_nothing_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    caller = (
        "import sys, pathlib\n"
        "from services.processes import launch\n"
        f"p = launch('orphan', [sys.executable, '-c', 'import time; time.sleep(60)'], "
        f"pathlib.Path({str(tmp_path / 'o.log')!r}))\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid))\n"
        "raise SystemExit('the caller fails without stopping its child')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(python(caller), env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "fails without stopping" in done.stderr
    assert wait_gone(int(pid_file.read_text()), timeout_s=1)


def test_start_in_parallel_stops_the_started_ones_when_one_fails(tmp_path: Path) -> None:
    port = free_port()
    started: list[ManagedProcess] = []

    def good() -> ManagedProcess:
        proc = launch("good", http_server(port), tmp_path / "g.log", ready=tcp_open(port))
        started.append(proc)
        return proc

    def bad() -> ManagedProcess:
        return launch("bad", python("raise SystemExit(7)"), tmp_path / "b.log", ready=lambda: False)

    with pytest.raises(ProcessError, match="bad exited with 7"):
        start_in_parallel([good, bad], ManagedProcess.stop)
    assert len(started) == 1 and not started[0].running()


def test_start_in_parallel_returns_results_in_the_launchers_order() -> None:
    def slow() -> str:
        time.sleep(0.3)
        return "slow"

    assert start_in_parallel([slow, lambda: "fast"], lambda _: None) == ["slow", "fast"]
