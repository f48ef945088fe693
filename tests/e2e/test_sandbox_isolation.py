"""What an agent inside a sandbox can reach of the adapter (issue 8, "The relay hands a sandbox
the adapter's whole API"), tried from inside real docker and bwrap sandboxes.

The stack is real: the trajectory runner's own agent sandbox (``runner.agent_spec``), the relay
(in-sandbox script + the host's HTTP filter), the adapter in training mode and the tiny model's
reference engine. A script inside the sandbox speaks raw HTTP/1.1 to the relay's loopback port,
as a hostile agent could, and tries every way to another trajectory's record or to an outcome:
read another record, write turns into another trajectory, close another trajectory with reward
1, close its own as ``aborted``, open records, untracked completions, admin and health routes,
plus path, header and framing tricks. Each must be answered 403/400 by the relay and change
nothing; its own ``/t/<id>/v1`` calls must work and be recorded. The trajectory token must not
be anywhere in the sandbox (environment, command lines, files).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest

from sandbox_worker.config import WorkerConfig
from sandbox_worker.factory import build_runner
from sandbox_worker.sandbox_runner import SandboxTrajectoryRunner
from services.protocol.trajectory import Outcome, OutcomeStatus, TrajectoryMeta
from tests.e2e.conftest import WORKER_TOKEN, AdapterProcess, RolloutStack
from tests.e2e.test_rollout_docker import SCRIPTED_INSTANCE, task

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(600)]

# Runs inside the sandbox with the image's python3: sends each raw request on its own
# connection and prints {name: status line or error}.
PROBE = r"""
import base64, json, socket, sys
out = {}
for name, raw in json.loads(sys.argv[1]).items():
    s = socket.create_connection(("127.0.0.1", 18080), timeout=60)
    try:
        s.sendall(base64.b64decode(raw))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        out[name] = data.split(b"\r\n", 1)[0].decode("latin-1")
    except OSError as exc:
        out[name] = "error " + type(exc).__name__
    finally:
        s.close()
print(json.dumps(out))
"""

# Whatever a process in the sandbox can read about itself and its neighbours.
SECRETS_SURVEY = (
    "env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'; "
    "find /swerl /tmp -type f 2>/dev/null | xargs -r cat 2>/dev/null; "
    "ls -la /swerl/ctl; mount"
)


def _post(target: str, body: dict[str, Any] | None = None, extra: str = "") -> bytes:
    data = json.dumps(body or {}).encode()
    return (
        f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1:18080\r\n{extra}"
        f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + data


def _get(target: str, extra: str = "") -> bytes:
    head = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:18080\r\n{extra}Connection: close\r\n\r\n"
    return head.encode()


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
REWARD_1 = {"outcome": {"status": "completed", "reward": 1.0}}
ABORTED = {"outcome": {"status": "aborted", "abort_reason": "infrastructure, honest"}}


def attacks(mine: str, other: str, adapter_port: int) -> dict[str, bytes]:
    own = f"/t/{mine}/v1"
    return {
        "read other record": _get(f"/trajectories/{other}"),
        "read other raw": _get(f"/trajectories/{other}/raw"),
        "read own record": _get(f"/trajectories/{mine}"),
        "inject into other": _post(f"/t/{other}/v1/chat/completions", CHAT),
        "close other with reward 1": _post(f"/trajectories/{other}/close", REWARD_1),
        "close own as aborted": _post(f"/trajectories/{mine}/close", ABORTED),
        "close own with reward 1": _post(f"/trajectories/{mine}/close", REWARD_1),
        "create record": _post("/trajectories", {"trajectory_id": f"{mine}.forged"}),
        "untracked completion": _post("/v1/chat/completions", CHAT),
        "admin versions": _get("/admin/versions"),
        "health": _get("/health"),
        "dot segments": _post(f"{own}/../../{other}/v1/chat/completions", CHAT),
        "dot segments to close": _post(f"/t/{mine}/../../trajectories/{other}/close", REWARD_1),
        "percent-encoded dots": _post(f"/t/{mine}/%2e%2e/%2e%2e/trajectories/{other}/close"),
        "percent-encoded slash": _post(f"/t/{mine}%2F..%2F..%2Ftrajectories%2F{other}%2Fclose"),
        "absolute form": _post(f"http://127.0.0.1:{adapter_port}/trajectories/{other}/close"),
        "query string": _post(f"{own}/chat/completions?trajectory={other}", CHAT),
        "host header game": _post(
            f"/trajectories/{other}/close", REWARD_1, extra="X-Forwarded-Host: adapter\r\n"
        ).replace(b"Host: 127.0.0.1:18080", f"Host: 127.0.0.1:{adapter_port}".encode()),
        "duplicate host": _post(f"{own}/chat/completions", CHAT, extra="Host: other\r\n"),
        "smuggling CL+TE": (
            f"POST {own}/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n"
            "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            f"POST /trajectories/{other}/close HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n{{}}"
        ).encode(),
    }


def own_calls(mine: str) -> dict[str, bytes]:
    own = f"/t/{mine}/v1"
    return {
        "own models": _get(f"{own}/models"),
        # whatever the agent sends as its credential is replaced by the trajectory's token
        "own chat": _post(f"{own}/chat/completions", CHAT, extra="Authorization: Bearer x\r\n"),
    }


def worker_open(adapter: AdapterProcess, tid: str) -> str:
    r = httpx.post(
        f"{adapter.url}/trajectories",
        json={"trajectory_id": tid},
        headers={"authorization": f"Bearer {WORKER_TOKEN}"},
        timeout=30,
    )
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


@pytest.mark.parametrize("backend", ["docker", "bwrap"])
def test_a_sandbox_reaches_only_its_own_trajectory(
    rollout_stack: RolloutStack, backend: str
) -> None:
    stack = rollout_stack
    adapter = stack.random
    cfg = WorkerConfig(
        backend=backend, rollout={"adapter_url": adapter.url, "adapter_token": WORKER_TOKEN}
    )
    router, _ = build_runner(
        cfg, backend=stack.backends[backend], hub=stack.hub, instances=stack.instances
    )
    runner = router.runner_for("swe")  # type: ignore[attr-defined]
    assert isinstance(runner, SandboxTrajectoryRunner)
    node = stack.node()
    t = task(f"e2e-isolation-{backend}", SCRIPTED_INSTANCE)
    mine = t.trajectory_id
    other = f"e2e-isolation-victim-{backend}.a1"
    # the victim: another trajectory of the same adapter with one recorded turn
    victim_token = worker_open(adapter, other)
    turn = httpx.post(
        f"{adapter.url}/t/{other}/v1/chat/completions",
        json=CHAT,
        headers={"authorization": f"Bearer {victim_token}"},
        timeout=120,
    )
    assert turn.status_code == 200, turn.text
    victim_before = adapter.record(other)
    # the attacker: the runner opens its trajectory and creates its agent sandbox
    token = runner.adapter.open(TrajectoryMeta(trajectory_id=mine))
    assert token is not None
    spec = runner.agent_spec(t, node, runner.image_for(SCRIPTED_INSTANCE), token)
    tries = {**attacks(mine, other, adapter.port), **own_calls(mine)}
    encoded = json.dumps({k: base64.b64encode(v).decode() for k, v in tries.items()})
    with stack.backends[backend].create(spec) as sandbox:
        res = sandbox.exec(["python3", "-c", PROBE, encoded], timeout_s=300)
        survey = sandbox.exec(SECRETS_SURVEY, timeout_s=60)
    assert res.exit_code == 0, res.output
    answers: dict[str, str] = json.loads(res.output.strip().splitlines()[-1])
    for name in attacks(mine, other, adapter.port):
        status = answers[name].split(" ")[1] if answers[name].startswith("HTTP/") else ""
        assert status in ("400", "403"), f"{name}: {answers[name]}"
    assert answers["own models"].startswith("HTTP/1.1 200"), answers
    assert answers["own chat"].startswith("HTTP/1.1 200"), answers
    # the token never entered the sandbox
    # the relay's socket is out of the sandbox's reach (the relay runs beside it)
    assert survey.exit_code == 0 and "/testbed" in survey.output, survey.output[-2000:]
    assert "llm.sock" not in survey.output, survey.output[-2000:]
    assert token not in survey.output and victim_token not in survey.output
    # nothing of the victim changed: same turns, still open, no outcome
    victim_after = adapter.record(other)
    assert victim_after["segments"] == victim_before["segments"]
    assert victim_after["status"] == "open" and victim_after["outcome"] is None
    # no record was forged
    forged = httpx.get(
        f"{adapter.url}/trajectories/{mine}.forged",
        headers={"authorization": f"Bearer {WORKER_TOKEN}"},
        timeout=30,
    )
    assert forged.status_code == 404
    # the attacker's own call is recorded, its record is still open, and the worker's outcome
    # (a 0) is the one kept: the sandbox could not close it as "aborted" first
    mine_record = adapter.record(mine)
    assert mine_record["status"] == "open" and mine_record["counters"]["turns"] == 1
    kept = runner.adapter.close(mine, Outcome(status=OutcomeStatus.COMPLETED, reward=0.0))
    assert kept.outcome is not None
    assert (kept.outcome.status, kept.outcome.reward) == (OutcomeStatus.COMPLETED, 0.0)
    runner.adapter.close(other)
    assert stack.backends[backend].list_sandboxes(node) == []
