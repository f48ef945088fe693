"""Outcomes of aborted and graded runs, and the sandbox names the runner derives (the
agent-ending -> status table is tested with :class:`EndReason`, tests/unit/sandbox_worker/
openhands/test_result.py)."""

from __future__ import annotations

import pytest

from sandbox_worker.backends.base import validate_name
from sandbox_worker.openhands.result import EndReason
from sandbox_worker.outcomes import abort_reason_of_end, aborted, graded
from sandbox_worker.sandbox_names import MAX_NODE_CHARS, agent_sandbox_id, sandbox_node_name
from services.protocol.trajectory import OutcomeStatus


def test_abort_reasons() -> None:
    assert abort_reason_of_end(EndReason.LLM_UNAVAILABLE, "503") == "llm_unavailable: 503"
    assert abort_reason_of_end(EndReason.AGENT_SERVER_ERROR, None) == (
        "agent_server_error: no detail"
    )
    assert abort_reason_of_end(EndReason.CANCELLED, None, "worker shutdown") == "worker shutdown"
    assert abort_reason_of_end(EndReason.CANCELLED, None) == "cancelled"


def test_aborted_has_no_reward_and_a_bounded_reason() -> None:
    out = aborted("x" * 5000, patch="p")
    assert out.status is OutcomeStatus.ABORTED and out.reward is None and not out.trainable
    assert len(out.abort_reason or "") == 2000 and out.patch == "p"


def test_graded_refuses_aborted_and_non_binary_rewards() -> None:
    kw = {"patch": "", "test_report": {}, "durations": {}}
    assert graded(OutcomeStatus.TIMEOUT, 0.0, **kw).reward == 0.0  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="completed, timeout and error"):
        graded(OutcomeStatus.ABORTED, 0.0, **kw)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="0 or 1"):
        graded(OutcomeStatus.COMPLETED, 0.5, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("node", ["node3", "a", "n-1-2"])
def test_valid_short_node_names_are_kept(node: str) -> None:
    assert sandbox_node_name(node) == node


@pytest.mark.parametrize(
    "node", ["Node3", "gpu_node.7", "ip-10-0-0-1.ec2.internal", "x" * 100, "-lead", "..."]
)
def test_other_node_names_are_mapped_validly_and_stably(node: str) -> None:
    mapped = sandbox_node_name(node)
    assert validate_name("node", mapped) == mapped
    assert len(mapped) <= MAX_NODE_CHARS
    assert sandbox_node_name(node) == mapped  # a restarted worker finds its sandboxes


def test_distinct_nodes_stay_distinct() -> None:
    names = ["Node3", "node3", "NODE3", "node.3", "node_3", "node-3"]
    assert len({sandbox_node_name(n) for n in names}) == len(names)


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_node_names_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="invalid node name"):
        sandbox_node_name(bad)  # type: ignore[arg-type]


def test_agent_sandbox_ids_are_short_valid_and_fresh() -> None:
    ids = {agent_sandbox_id("batch-1:0:3.a2") for _ in range(50)}
    assert len(ids) == 50
    for sid in ids:
        assert validate_name("sandbox_id", sid) == sid
        assert sid.startswith("agent-") and len(sid) == 18
    with pytest.raises(ValueError, match="invalid trajectory id"):
        agent_sandbox_id("")
