"""What the routes do, without HTTP: auth, submit, read, list, cancel, results, logs, metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from itertools import product
from typing import Any

import redis

from services.api.auth import Authenticator, AuthError, Principal
from services.api.config import ApiConfig, ApiToken, Scope
from services.api.metrics import CONTENT_TYPE, ApiMetrics
from services.api.paths import PathPolicy, PathRefused
from services.api.schemas import (
    EvalSpec,
    Job,
    JobKind,
    JobPage,
    JobState,
    LogPage,
    ResultPage,
    RolloutSpec,
    Spec,
    TrainSpec,
)
from services.api.store import IdempotencyConflict, JobStore, QuotaExceeded
from services.store.trajectories import TrajectoryNotFoundError, load_trajectory

STREAM_POLL_S = 0.5


class ApiError(Exception):
    """A 4xx answer: ``{"error": {"message", "type", "field"}}``."""

    def __init__(self, status: int, kind: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.field = status, kind, message, field


def task_count(spec: Spec) -> tuple[int, str] | None:
    """The tasks a job asks for and the field that sets them, or None when the API cannot
    know (an eval of a whole dataset: its size is bounded by the files under the roots).
    Rollout: instances x samples; train: trajectories per step (prompts x samples); eval:
    the instances selected."""
    if isinstance(spec, RolloutSpec):
        return len(spec.instance_ids) * spec.n_samples, "body.instance_ids"
    if isinstance(spec, TrainSpec):
        return spec.batch.prompts_per_step * spec.batch.samples_per_prompt, "body.batch"
    if isinstance(spec, EvalSpec):
        counts = [len(spec.instance_ids or ()) or None, spec.max_instances]
        known = [c for c in counts if c is not None]
        if known:
            field = "body.instance_ids" if spec.instance_ids else "body.max_instances"
            return min(known), field
    return None


class ApiService:
    def __init__(self, cfg: ApiConfig, client: redis.Redis) -> None:
        self.cfg = cfg
        self.redis = client
        self.store = JobStore(client, cfg.key_prefix, cfg.log_lines_kept)
        self.authn = Authenticator(cfg.tokens)
        self.paths = PathPolicy.from_config(cfg.paths)
        self._tokens: dict[str, ApiToken] = {t.name: t for t in cfg.tokens}
        self.metrics = ApiMetrics()
        self.metrics_content_type = CONTENT_TYPE

    def auth(self, authorization: str | None, scope: Scope) -> Principal:
        try:
            return self.authn.require(authorization, scope)
        except AuthError as exc:
            kind = "unauthorized" if exc.status == 401 else "forbidden"
            raise ApiError(exc.status, kind, exc.message, "header.Authorization") from exc

    def submit(
        self, kind: JobKind, spec: Spec, who: Principal, key: str | None
    ) -> tuple[Job, bool]:
        """Check the spec against the roots and the caller's quotas, then queue it. Nothing is
        written when a check refuses."""
        group = spec.trainer_group if isinstance(spec, TrainSpec) else "default"
        try:
            self.paths.check_spec(spec)
        except PathRefused as exc:
            raise ApiError(422, "path_not_allowed", str(exc), exc.field) from exc
        max_in_flight, max_tasks = self.quotas(who)
        tasks = task_count(spec)
        if tasks is not None and tasks[0] > max_tasks:
            raise ApiError(
                422, "quota_exceeded", f"{tasks[1]}: the job asks for {tasks[0]} tasks, over "
                f"the limit of {max_tasks} per job for token {who.name!r} "
                "(api.quotas.max_tasks_per_job): split it into smaller jobs", tasks[1],
            )  # fmt: skip
        try:
            done = self.store.submit(
                kind,
                spec.model_dump(mode="json"),
                who.name,
                group=group,
                idempotency_key=key,
                ttl_s=self.cfg.idempotency_ttl_s,
                max_in_flight=max_in_flight,
            )
        except IdempotencyConflict as exc:
            raise ApiError(409, "idempotency_conflict", str(exc), "header.Idempotency-Key") from exc
        except QuotaExceeded as exc:
            raise ApiError(
                429, "quota_exceeded", f"token {who.name!r} has {exc.in_flight} jobs in flight "
                f"(queued or running), its limit (api.quotas.max_jobs_in_flight is "
                f"{exc.limit}): wait for one to finish or cancel one", "header.Authorization",
            ) from exc  # fmt: skip
        if done.created:
            self.store.log(done.job_id, f"submitted by {who.name}")
        return self.job(done.job_id), done.created

    def quotas(self, who: Principal) -> tuple[int, int]:
        """(jobs in flight, tasks per job) allowed to ``who``: its token's own values, else
        ``api.quotas``."""
        token = self._tokens.get(who.name)
        base = self.cfg.quotas
        in_flight = token.max_jobs_in_flight if token else None
        tasks = token.max_tasks_per_job if token else None
        return (
            base.max_jobs_in_flight if in_flight is None else in_flight,
            base.max_tasks_per_job if tasks is None else tasks,
        )

    def job(self, job_id: str) -> Job:
        job = self.store.get(job_id)
        if job is None:
            raise ApiError(404, "not_found", f"no job {job_id!r}", "path.job_id")
        return job

    def list_jobs(
        self, kind: JobKind | None, state: JobState | None, limit: int, cursor: int | None
    ) -> JobPage:
        if limit > self.cfg.max_page_size:
            raise ApiError(
                422, "invalid", f"limit must be <= {self.cfg.max_page_size}", "query.limit"
            )
        jobs, next_cursor = self.store.list_jobs(kind, state, limit, cursor)
        return JobPage(jobs=jobs, next_cursor=str(next_cursor) if next_cursor else None)

    def cancel(self, job_id: str, who: Principal) -> Job:
        job = self.job(job_id)
        if job.submitted_by != who.name and not who.allows(Scope.ADMIN):
            raise ApiError(
                403, "forbidden", f"job {job_id} was submitted by {job.submitted_by!r}: "
                "only its submitter or an admin may cancel it", "path.job_id",
            )  # fmt: skip
        if job.state.terminal:
            raise ApiError(
                409, "finished", f"job {job_id} already {job.state.value}", "path.job_id"
            )
        self.store.cancel(job_id, who.name)
        self.store.log(job_id, f"cancel requested by {who.name}")
        return self.job(job_id)

    def results(self, job_id: str, offset: int, limit: int) -> ResultPage:
        limit = min(limit, self.cfg.max_page_size)
        rows, total = self.store.results(job_id, offset, limit)
        end = offset + len(rows)
        return ResultPage(results=rows, total=total, next_offset=end if end < total else None)

    def stream_results(
        self, job_id: str, offset: int, follow: bool, sse: bool = False
    ) -> Iterator[bytes]:
        """Results from ``offset`` as NDJSON lines, or with ``sse`` as server-sent events
        (``id:`` the row's offset, ``data:`` the row; ``follow`` ends with ``event: end``)."""
        for index, row in self._rows(job_id, offset, follow):
            text = json.dumps(row, separators=(",", ":"))
            yield f"id: {index}\ndata: {text}\n\n".encode() if sse else text.encode() + b"\n"
        if sse and follow:
            job = self.store.get(job_id)
            state = job.state.value if job else "unknown"
            yield f"event: end\ndata: {json.dumps({'state': state})}\n\n".encode()

    def _rows(self, job_id: str, offset: int, follow: bool) -> Iterator[tuple[int, dict[str, Any]]]:
        """(offset, row) from ``offset``; with ``follow`` until the job is finished."""
        while True:
            rows, total = self.store.results(job_id, offset, self.cfg.max_page_size)
            yield from enumerate(rows, offset)
            offset += len(rows)
            if rows and offset < total:
                continue
            if not follow:
                return
            job = self.store.get(job_id)
            if job is None or job.state.terminal:
                rest, _ = self.store.results(job_id, offset, 1_000_000)
                yield from enumerate(rest, offset)
                return
            time.sleep(STREAM_POLL_S)

    def trajectory(self, job_id: str, trajectory_id: str) -> dict[str, Any]:
        """The trajectory record (tokens, turns, outcome) of one of the job's results, from the
        trajectory store (which shares the rollout queue's key prefix)."""
        self.job(job_id)
        if not trajectory_id.startswith(f"{job_id}:"):  # task ids are <job id>:<i>:<sample>
            raise ApiError(
                404, "not_found", f"trajectory {trajectory_id!r} is not one of job {job_id}",
                "path.trajectory_id",
            )  # fmt: skip
        try:
            record = load_trajectory(self.redis, trajectory_id, self.cfg.queue.prefix)
        except TrajectoryNotFoundError as exc:
            raise ApiError(
                404, "not_found", f"no record of trajectory {trajectory_id!r} (the simulated "
                "runner and some aborted attempts write none)", "path.trajectory_id",
            ) from exc  # fmt: skip
        return record.to_json()

    def logs(self, job_id: str, offset: int, limit: int) -> LogPage:
        lines, next_offset = self.store.logs(job_id, offset, min(limit, self.cfg.max_page_size))
        return LogPage(lines=lines, next_offset=next_offset)

    def redis_problem(self) -> str:
        try:
            self.redis.ping()
        except redis.RedisError as exc:
            return f"Redis unreachable: {exc}"
        return ""

    def render_metrics(self) -> bytes:
        pairs = list(product(JobKind, JobState))
        pipe = self.redis.pipeline(transaction=False)
        for kind, state in pairs:
            pipe.zcard(self.store.key("idx", kind.value, state.value))
        try:
            counts = pipe.execute()
        except redis.RedisError:
            counts = None
        if counts is not None:
            self.metrics.set_jobs(dict(zip(pairs, (int(c) for c in counts), strict=True)))
        return self.metrics.render()
