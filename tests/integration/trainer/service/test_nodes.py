"""The node keys of a multi-node trainer group on real Redis: presence with a TTL and one holder
per rank, the assignment only its writer can extend or withdraw, malformed payloads refused,
and follower exits per attempt."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis

from trainer.service.nodes import Assignment, NodeDirectory, NodeError

PREFIX = "swerl:api:"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_presence_has_one_holder_per_rank_and_runs_out(client: redis.Redis) -> None:
    nodes = NodeDirectory(client, PREFIX, "g")
    assert nodes.missing(3) == [1, 2] and nodes.missing(1) == []
    assert nodes.announce(1, "node-a", ttl_s=0.5) is None
    assert nodes.announce(1, "node-a", ttl_s=0.5) is None  # its own key: refreshed
    assert nodes.announce(1, "node-b", ttl_s=0.5) == "node-a"  # a second node with rank 1
    assert nodes.missing(3) == [2]
    nodes.leave(1, "node-b")  # not its key: nothing happens
    assert nodes.missing(3) == [2]
    time.sleep(0.7)  # node-a stopped refreshing
    assert nodes.missing(3) == [1, 2]
    assert nodes.announce(1, "node-b", ttl_s=5) is None
    nodes.leave(1, "node-b")
    assert nodes.missing(2) == [1]
    # groups do not see each other's nodes
    NodeDirectory(client, PREFIX, "other").announce(1, "x", ttl_s=5)
    assert nodes.missing(2) == [1]


def test_only_the_assignments_writer_extends_or_withdraws_it(client: redis.Redis) -> None:
    nodes = NodeDirectory(client, PREFIX, "g")
    assert nodes.assignment() is None
    first = Assignment(job_id="job-1", attempt=1, config="train: {}\n", resume=False)
    value = nodes.assign(first, ttl_s=0.5)
    assert nodes.assignment() == first
    assert nodes.refresh(value, ttl_s=5)
    time.sleep(0.7)
    assert nodes.assignment() == first  # the refresh held it past its first TTL
    second = Assignment(job_id="job-1", attempt=2, config="train: {}\n", resume=True)
    newer = nodes.assign(second, ttl_s=5)  # a new leader's attempt replaced it
    assert not nodes.refresh(value, ttl_s=5)  # the old leader cannot keep it alive ...
    nodes.clear(value)  # ... nor withdraw it
    assert nodes.assignment() == second
    nodes.clear(newer)
    assert nodes.assignment() is None
    nodes.assign(first, ttl_s=0.3)
    time.sleep(0.5)
    assert nodes.assignment() is None  # a dead leader's assignment runs out


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (b"not json", "malformed assignment"),
        (b'{"job_id": "../x", "attempt": 1, "config": "a: 1"}', "job_id"),
        (b'{"job_id": "j", "attempt": 0, "config": "a: 1"}', "attempt"),
        (b'{"job_id": "j", "attempt": 1, "config": ""}', "config"),
        (b'{"job_id": "j", "attempt": 1, "config": "a", "argv": ["sh"]}', "argv"),
    ],
)
def test_a_malformed_assignment_is_refused(
    client: redis.Redis, payload: bytes, problem: str
) -> None:
    client.set(f"{PREFIX}trainer:g:assignment", payload)
    with pytest.raises(NodeError, match=problem):
        NodeDirectory(client, PREFIX, "g").assignment()


def test_follower_exits_are_kept_per_attempt(client: redis.Redis) -> None:
    nodes = NodeDirectory(client, PREFIX, "g")
    # ids may hold ':' -- "a:1" attempt 2 must not read as job "a" attempt 1
    tricky = Assignment(job_id="a:1", attempt=2, config="x: 1")
    plain = Assignment(job_id="a", attempt=1, config="x: 1")
    nodes.report_exit(tricky, 1, 3)
    nodes.report_exit(tricky, 2, 0)
    nodes.report_exit(plain, 1, 0)
    assert nodes.failed_followers("a:1", 2) == {1: 3}
    assert nodes.failed_followers("a", 1) == {}
    assert nodes.failed_followers("a:1", 1) == {}
    client.hset(f"{PREFIX}trainer:g:exits", "a:1/2/x", "junk")  # ignored, not a crash
    assert nodes.failed_followers("a:1", 2) == {1: 3}
