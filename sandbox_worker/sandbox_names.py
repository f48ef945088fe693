"""Names the trajectory runner gives sandboxes: node names and sandbox ids in the backends'
alphabet, kept short.

A worker's node name may hold ``[A-Za-z0-9._-]`` (up to 100 characters), but sandbox node names
and ids become parts of container, network-namespace, cgroup and directory names and are limited
to ``[a-z0-9-]`` (1-63 characters, see :func:`sandbox_worker.backends.base.validate_name`).
:func:`sandbox_node_name` maps one to the other deterministically (a restarted worker must find
the sandboxes of its crashed predecessor) and injectively in practice: a name that is not already
valid gets a hash suffix of the original, so ``Node1`` and ``node1`` stay apart.

Both are kept **short** because the backends put ``<state_root>/<node>.<sandbox_id>/ctl/
port-NNNNN.sock`` in a unix socket path, which may not exceed 107 bytes: with the default
``/var/lib/swerl/sandboxes`` that leaves 62 bytes for ``<node>.<sandbox_id>``, shared with the
evaluation sandbox's id. Node names longer than :data:`MAX_NODE_CHARS` are therefore shortened
(with the hash), and agent sandbox ids are ``agent-`` + 12 hex digits.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from sandbox_worker.backends.base import validate_name

MAX_NODE_CHARS = 20
_VALID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_INVALID_RUN = re.compile(r"[^a-z0-9]+")


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _slug(text: str, max_len: int) -> str:
    return _INVALID_RUN.sub("-", text.lower())[:max_len].strip("-")


def sandbox_node_name(node: str) -> str:
    """The backends' node name for worker node ``node`` (itself when valid and short)."""
    if not isinstance(node, str) or not node:
        raise ValueError(f"invalid node name {node!r}")
    if _VALID.match(node) and len(node) <= MAX_NODE_CHARS:
        return node
    slug = _slug(node, MAX_NODE_CHARS - 11) or "node"
    return validate_name("node", f"{slug}-{_digest(node, 10)}")


def agent_sandbox_id(trajectory_id: str) -> str:
    """A fresh sandbox id for the agent sandbox of one trajectory run.

    A digest of the trajectory id plus random bits, so even a re-run of the same attempt never
    collides with a sandbox not yet removed. (The trajectory id itself is in the sandbox's
    ``swerl.trajectory`` label.)
    """
    if not isinstance(trajectory_id, str) or not trajectory_id:
        raise ValueError(f"invalid trajectory id {trajectory_id!r}")
    return validate_name("sandbox_id", f"agent-{_digest(trajectory_id, 6)}{uuid.uuid4().hex[:6]}")
