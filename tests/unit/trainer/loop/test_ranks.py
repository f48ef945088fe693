"""Rank 0's backend announces every collective call before making it, the followers make the
same calls in the same order, and a failure never leaves a follower waiting on a call that
will not come (or rank 0 on a follower stuck in a collective)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.backends import StepObjective
from trainer.loop.cli import main as train_main
from trainer.loop.ranks import (
    ABORT,
    SET_VERSION,
    STOP,
    Call,
    LeaderBackend,
    RankError,
    follow,
    init_ranks,
    launcher_world,
)


class RecordingBackend:
    """A backend that logs each call it receives (and can fail one)."""

    def __init__(self, log: list[tuple[str, tuple]], fail: str | None = None) -> None:
        self.calls = log
        self.fail = fail
        self.version = 0
        self.steps = 3
        self.pad_id = 9

    def _record(self, op: str, *args: Any) -> None:
        self.calls.append(("call", (op, *args)))
        if op == self.fail:
            raise RuntimeError(f"{op} failed")

    def train_step(self, batch: Any, objective: StepObjective) -> dict[str, float]:
        self._record("train_step", batch, objective)
        self.version += 1
        return {"actor/loss": 0.5}

    def logprobs_and_values(self, batch: Any) -> Any:
        self._record("logprobs_and_values", batch)
        return "forward"

    def export_hf(self, directory: str) -> Path:
        self._record("export_hf", directory)
        return Path(directory)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in ("a", "b"):
            self._record("named_weights", name)
            yield name, torch.zeros(1)

    def save(self, directory: str, extra: dict | None = None) -> Path:
        self._record("save", directory, extra)
        return Path(directory)

    def load(self, directory: str) -> dict:
        self._record("load", directory)
        return {"loop": {}}


class ListChannel:
    """Rank 0's sends appended to a shared log; a follower receives from a list."""

    def __init__(self, log: list[tuple[str, Any]], incoming: list[Call] | None = None) -> None:
        self.rank = 0 if incoming is None else 1
        self.log = log
        self.incoming = list(incoming or [])

    def send(self, call: Call) -> None:
        self.log.append(("send", call))

    def receive(self) -> Call:
        return self.incoming.pop(0)


def test_each_collective_call_is_sent_before_rank_0_makes_it() -> None:
    log: list[tuple[str, Any]] = []
    leader = LeaderBackend(RecordingBackend(log), ListChannel(log))  # type: ignore[arg-type]
    objective = StepObjective()
    assert leader.train_step("B", objective) == {"actor/loss": 0.5}
    assert leader.logprobs_and_values("B") == "forward"
    leader.export_hf(Path("/w/v1"))
    leader.save(Path("/c/step-3"), {"loop": {"step": 3}})
    assert leader.load("/c/step-3") == {"loop": {}}
    sent = [entry[1] for entry in log if entry[0] == "send"]
    assert [c.op for c in sent] == [
        "train_step",
        "logprobs_and_values",
        "export_hf",
        "save",
        "load",
    ]
    # paths travel as strings (picklable, the same on every rank), extra as a plain dict
    assert sent[2].args == ("/w/v1",) and sent[3].args == ("/c/step-3", {"loop": {"step": 3}})
    assert sent[0].args == ("B", objective)
    # strictly alternating: every call announced right before it is made
    kinds = [entry[0] for entry in log]
    assert kinds == ["send", "call"] * 5
    # non-collective reads go straight through, and the version is the backend's
    assert (leader.steps, leader.pad_id, leader.version) == (3, 9, 1)


def test_the_version_assignment_and_named_weights_reach_the_followers() -> None:
    log: list[tuple[str, Any]] = []
    backend = RecordingBackend(log)
    leader = LeaderBackend(backend, ListChannel(log))  # type: ignore[arg-type]
    leader.version = 7
    assert backend.version == 7 and log == [("send", Call(SET_VERSION, (7,)))]
    log.clear()
    weights = leader.named_weights()
    assert log == []  # lazy: nothing is sent for an iterator nobody reads
    assert [name for name, _ in weights] == ["a", "b"]
    assert [entry[0] for entry in log] == ["send", "call", "call"]
    with pytest.raises(AttributeError, match="sets only 'version'"):
        leader.steps = 4


def test_followers_make_the_same_calls_in_the_same_order_and_stop() -> None:
    objective = StepObjective(phase="switched")
    calls = [
        Call("train_step", ("B", objective)),
        Call(SET_VERSION, (5,)),
        Call("named_weights"),
        Call("export_hf", ("/w/v5",)),
        Call("save", ("/c/step-1", {"loop": {"step": 1}})),
        Call(STOP),
        Call("train_step", ("never",)),
    ]
    log: list[tuple[str, Any]] = []
    backend = RecordingBackend(log)
    channel = ListChannel([], calls)
    assert follow(backend, channel) is True  # type: ignore[arg-type]
    assert [entry[1] for entry in log] == [
        ("train_step", "B", objective),
        ("named_weights", "a"),
        ("named_weights", "b"),  # iterated to the end: each tensor is a gather
        ("export_hf", "/w/v5"),
        ("save", "/c/step-1", {"loop": {"step": 1}}),
    ]
    assert backend.version == 5
    assert channel.incoming == [Call("train_step", ("never",))]  # nothing after stop


def test_a_follower_stops_failed_on_abort_and_refuses_an_unknown_call() -> None:
    backend = RecordingBackend([])
    assert follow(backend, ListChannel([], [Call(ABORT)])) is False  # type: ignore[arg-type]
    with pytest.raises(RankError, match="unknown call 'shutdown_engines'"):
        follow(backend, ListChannel([], [Call("shutdown_engines")]))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="save failed"):  # the rank exits non-zero
        follow(RecordingBackend([], fail="save"), ListChannel([], [Call("save", ("/c",))]))  # type: ignore[arg-type]


def test_stop_sends_stop_or_abort_but_nothing_after_a_call_failed_half_way() -> None:
    log: list[tuple[str, Any]] = []
    leader = LeaderBackend(RecordingBackend(log), ListChannel(log))  # type: ignore[arg-type]
    leader.stop()
    leader.stop(failed=True)
    assert [entry[1].op for entry in log] == [STOP, ABORT]
    log.clear()
    failing = LeaderBackend(RecordingBackend(log, fail="train_step"), ListChannel(log))  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="train_step failed"):
        failing.train_step("B", StepObjective())
    failing.stop(failed=True)  # the followers may be inside train_step's collectives
    assert [entry[1].op for entry in log if entry[0] == "send"] == ["train_step"]
    log.clear()
    weights = LeaderBackend(RecordingBackend(log), ListChannel(log))  # type: ignore[arg-type]
    next(iter(weights.named_weights()))  # a consumer that stops early: peers mid-gather
    weights.stop(failed=True)
    assert [entry[1].op for entry in log if entry[0] == "send"] == ["named_weights"]


def test_launcher_environment_is_checked() -> None:
    assert launcher_world({}) == 1
    assert init_ranks("cpu", {}) is None  # one process: no group
    with pytest.raises(RankError, match="WORLD_SIZE must be an integer, got 'two'"):
        launcher_world({"WORLD_SIZE": "two"})
    with pytest.raises(RankError, match="WORLD_SIZE must be >= 1"):
        launcher_world({"WORLD_SIZE": "0"})
    with pytest.raises(RankError, match="RANK, MASTER_PORT is not"):
        init_ranks("cpu", {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})


def test_train_exits_2_on_a_malformed_launcher_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = Path(__file__).parents[4] / "trainer" / "configs" / "toy_li2sao.yaml"
    monkeypatch.setenv("WORLD_SIZE", "2")
    for key in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert train_main(["--config", str(config)]) == 2
    assert "WORLD_SIZE is set but RANK, MASTER_ADDR, MASTER_PORT is not" in capsys.readouterr().err


def test_a_rank_dies_with_its_launcher(tmp_path: Path) -> None:
    """torchrun gives each rank its own session: only PR_SET_PDEATHSIG reaches an orphan."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "rank.pid"
    rank = (
        "import os, sys, time\n"
        "from trainer.loop.ranks import die_with_launcher\n"
        "die_with_launcher()\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "time.sleep(120)\n"
    )
    launcher = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {rank!r}], start_new_session=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", launcher], cwd=Path(__file__).parents[4])
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()):
        assert time.monotonic() < deadline and parent.poll() is None, "the rank did not start"
        time.sleep(0.1)
    child = int(pid_file.read_text())
    os.kill(parent.pid, signal.SIGKILL)  # the launcher dies hard; the rank is in its own session
    parent.wait()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child}").exists() and "Z" not in _state(child):
        assert time.monotonic() < deadline, "the rank outlived its launcher"
        time.sleep(0.1)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
