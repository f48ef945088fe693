"""The rollout pool: what the loop has requested, what has landed, and which batch it takes.

Pure bookkeeping (no Redis): :class:`~trainer.loop.collector.Collector` feeds it requests and
results; :meth:`RolloutPool.select` decides the next batch.

* Aborted results are dropped and counted, never scored; a trainable result whose record is
  missing from the trajectory store is dropped and counted too (``missing_record``).
* Policy lag (LI2SAO_SPEC "Staleness"): ``v_l - min_t v_t`` over the trajectory's action
  tokens, the oldest token deciding; members lagging more than ``max_policy_lag`` are dropped
  and counted when a batch is selected (stragglers that are still within it train later).
* Group shape (``group_size > 1``): only complete groups (every member has a result) enter a
  batch, the first ``prompts`` to complete; a group keeps its members that were not dropped.
* Single shape: any ``prompts`` landed members, in landing order; no group barrier.
* A batch takes members of requests of its own group size only: the shapes never mix.
* DAPO's dynamic sampling (``mixed_only``): complete groups with equal rewards are dropped
  (``trainer.algorithms.dynamic_sampling_filter``) and counted; the budget they free is
  refilled, so more groups are drawn until ``P`` mixed ones complete.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from services.protocol import TaskResult, TrajectoryRecord
from trainer.algorithms import dynamic_sampling_filter
from trainer.loop.phases import BatchShape


def group_of(task_id: str) -> str:
    """The group of a task: ids are ``<batch_id>:<prompt index>:<sample>`` and the default
    group id is ``<batch_id>:<prompt index>`` (services.manager.client.tasks_for_request)."""
    return task_id.rsplit(":", 1)[0]


def oldest_version(record: TrajectoryRecord) -> int | None:
    """The weight version of the trajectory's oldest action token (None: no action token)."""
    versions = [v for s in record.segments for t in s.turns for v in t.token_versions()]
    return min(versions) if versions else None


@dataclass
class Member:
    """One landed, trainable trajectory."""

    result: TaskResult
    record: TrajectoryRecord
    group_id: str
    oldest: int | None
    order: int

    def lag(self, trainer_version: int) -> int:
        # LI2SAO_SPEC "Staleness": v_l - min_t v_t (the oldest action token decides)
        return 0 if self.oldest is None else trainer_version - self.oldest


@dataclass
class _Group:
    batch_id: str
    expected: int
    finished: int = 0
    members: list[Member] = field(default_factory=list)
    completed: int | None = None


@dataclass
class _Request:
    batch_id: str
    prompts: int
    group_size: int
    gone: int = 0  # trajectories that left the pool: consumed or dropped

    @property
    def total(self) -> int:
        return self.prompts * self.group_size


@dataclass(frozen=True)
class Selection:
    """A batch: its members (group by group), and each member's lag at selection."""

    members: tuple[Member, ...]
    group_size: int
    lags: tuple[int, ...]

    @property
    def group_sizes(self) -> list[int]:
        return list(Counter(m.group_id for m in self.members).values())


class RolloutPool:
    """Requests in flight and landed trajectories (see the module docstring)."""

    def __init__(self) -> None:
        self.requests: dict[str, _Request] = {}
        self.groups: dict[str, _Group] = {}
        self.counts: Counter[str] = Counter()
        self._order = 0

    # -- requests ---------------------------------------------------------------------------
    def register(self, batch_id: str, prompts: int, group_size: int) -> None:
        if batch_id in self.requests:
            raise ValueError(f"request {batch_id} is already in the pool")
        self.requests[batch_id] = _Request(batch_id, prompts, group_size)
        for i in range(prompts):
            self.groups[f"{batch_id}:{i}"] = _Group(batch_id, group_size)
        self.counts["submitted"] += prompts * group_size

    @property
    def in_flight(self) -> int:
        """Trajectories submitted that have not left the pool (running or landed, untrained)."""
        return sum(r.total - r.gone for r in self.requests.values())

    def discard(self, batch_id: str) -> int:
        """Forget a (cancelled) request: its landed members are discarded; returns how many
        trajectories it still had in flight. Its later results are ignored."""
        request = self.requests.pop(batch_id, None)
        if request is None:
            return 0
        for gid in [g for g, group in self.groups.items() if group.batch_id == batch_id]:
            self.counts["discarded_landed"] += len(self.groups.pop(gid).members)
        left = request.total - request.gone
        self.counts["discarded"] += left
        return left

    # -- results ----------------------------------------------------------------------------
    def add(self, result: TaskResult, record: TrajectoryRecord | None) -> None:
        """A result as it lands (``record`` None: not loaded, aborted or missing)."""
        request = self.requests.get(result.batch_id)
        group = self.groups.get(group_of(result.task_id))
        if request is None or group is None:
            self.counts["ignored_results"] += 1  # a cancelled or foreign request's result
            return
        group.finished += 1
        if not result.outcome.trainable:
            self.counts["aborted"] += 1
            request.gone += 1
        elif record is None:
            self.counts["missing_record"] += 1
            request.gone += 1
        else:
            self._order += 1
            member = Member(
                result, record, group_of(result.task_id), oldest_version(record), self._order
            )
            group.members.append(member)
            self.counts["landed"] += 1
        if group.finished >= group.expected and group.completed is None:
            self._order += 1
            group.completed = self._order
            if not group.members:  # every member aborted or missing: nothing to train
                self.counts["empty_groups"] += 1
                del self.groups[group_of(result.task_id)]
        self._retire(request)

    def _retire(self, request: _Request) -> None:
        if request.gone >= request.total:
            self.requests.pop(request.batch_id, None)

    def _leave(self, members: list[Member], what: str) -> None:
        for m in members:
            self.counts[what] += 1
            request = self.requests[m.result.batch_id]
            request.gone += 1
        for batch_id in {m.result.batch_id for m in members}:
            self._retire(self.requests[batch_id])

    # -- selection --------------------------------------------------------------------------
    def drop_over_lag(self, trainer_version: int, max_policy_lag: int) -> int:
        """Drop (and count) landed members lagging more than ``max_policy_lag``, and members
        sampled by a version newer than the trainer's (``future_version``: a resumed run whose
        engines were ahead); returns how many were dropped."""
        dropped = 0
        for group in self.groups.values():
            keep, stale, future = [], [], []
            for m in group.members:
                lag = m.lag(trainer_version)
                (future if lag < 0 else stale if lag > max_policy_lag else keep).append(m)
            group.members = keep
            self._leave(stale, "over_lag")
            self._leave(future, "future_version")
            dropped += len(stale) + len(future)
        return dropped

    def select(
        self,
        shape: BatchShape,
        trainer_version: int,
        max_policy_lag: int,
        *,
        mixed_only: bool = False,
    ) -> Selection | None:
        """The next batch of ``shape`` if the pool holds one, else None (see the module).
        ``mixed_only`` (DAPO's dynamic sampling): complete groups whose rewards are all equal
        are dropped (``uniform_groups``), so the budget refills and more groups are drawn."""
        self.drop_over_lag(trainer_version, max_policy_lag)
        sizes = {self.requests[g.batch_id].group_size for g in self._live_groups()}
        if sizes - {shape.group_size}:
            raise RuntimeError(
                f"the pool holds requests of group sizes {sorted(sizes)}; a batch of group size "
                f"{shape.group_size} must not mix them (cancel the other shape's requests first)"
            )
        if shape.group_size > 1:
            if mixed_only:
                self._drop_uniform_groups()
            members = self._complete_groups(shape.prompts)
        else:
            members = self._singles(shape.prompts)
        if members is None:
            return None
        lags = tuple(m.lag(trainer_version) for m in members)
        self._leave(members, "trained")
        return Selection(tuple(members), shape.group_size, lags)

    def _live_groups(self) -> list[_Group]:
        return [g for g in self.groups.values() if g.batch_id in self.requests]

    def _complete_groups(self, count: int) -> list[Member] | None:
        complete = sorted(
            (g for g in self.groups.values() if g.completed is not None),
            key=lambda g: g.completed or 0,
        )
        for group in [g for g in complete if not g.members]:
            self.counts["empty_groups"] += 1
            self._pop_group(group)
        ready = [g for g in complete if g.members][:count]
        if len(ready) < count:
            return None
        members = []
        for group in ready:
            members.extend(group.members)
            self._pop_group(group)
        return members

    def _drop_uniform_groups(self) -> None:
        complete = [g for g in self.groups.values() if g.completed is not None and g.members]
        if not complete:
            return
        members = [m for g in complete for m in g.members]
        rewards = torch.tensor([float(m.result.outcome.reward or 0.0) for m in members])
        ids = torch.tensor([n for n, g in enumerate(complete) for _ in g.members])
        kept = dynamic_sampling_filter(rewards, ids, len(complete)).kept
        mixed = {int(ids[i]) for i in kept.tolist()}
        for n, group in enumerate(complete):
            if n not in mixed:
                self.counts["uniform_groups"] += 1
                self._leave(group.members, "filtered_uniform")
                self._pop_group(group)

    def _pop_group(self, group: _Group) -> None:
        gid = next(k for k, g in self.groups.items() if g is group)
        del self.groups[gid]

    def _singles(self, count: int) -> list[Member] | None:
        landed = sorted((m for g in self.groups.values() for m in g.members), key=lambda m: m.order)
        if len(landed) < count:
            return None
        chosen = landed[:count]
        for m in chosen:
            group = self.groups[m.group_id]
            group.members.remove(m)
            if group.completed is not None and not group.members:
                del self.groups[m.group_id]
        return chosen
