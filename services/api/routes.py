"""The job API's routes (``/v1`` jobs, health, metrics). Handlers are plain ``def``: FastAPI runs
them in its thread pool, so their (synchronous, short) Redis calls never block the event loop."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from services.api.auth import Principal
from services.api.config import Scope
from services.api.paths import Access, PathRefused
from services.api.schemas import (
    ErrorBody,
    EvalSpec,
    Health,
    Job,
    JobKind,
    JobPage,
    JobState,
    LogPage,
    ProgressPage,
    ResultPage,
    RolloutSpec,
    Spec,
    TrainSpec,
)
from services.api.service import ApiError, ApiService
from services.api.store import SERVING_WINDOW_S
from services.datasets import DatasetError
from services.datasets.loader import load_instances_collect
from services.protocol.ids import ID_MAX_LENGTH, ID_PATTERN
from services.store.progress import STREAM_ID_PATTERN, ProgressStore

JobId = Annotated[str, Path(pattern=ID_PATTERN, min_length=1, max_length=ID_MAX_LENGTH)]


def service(request: Request) -> ApiService:
    return request.app.state.service  # type: ignore[no-any-return]


BEARER = HTTPBearer(auto_error=False, description="an API token (api.tokens)")


def _caller(scope: Scope) -> Callable[..., Awaitable[Principal]]:
    """A dependency: the caller, who must hold ``scope``. Dependencies run before the body is
    validated, so a request without the right token is a 401/403 whatever its body."""

    async def caller(  # async: no I/O here, and a sync dependency costs a thread-pool hop
        request: Request, creds: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]
    ) -> Principal:
        return service(request).auth(f"Bearer {creds.credentials}" if creds else None, scope)

    return caller


# Declared as a security scheme (not a header parameter) in /openapi.json.
Reader = Annotated[Principal, Depends(_caller(Scope.READ))]
Submitter = Annotated[Principal, Depends(_caller(Scope.SUBMIT))]
IdemKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$"),
]
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 403, 404, 409, 422)
}
NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
# Submissions may also be over the body cap (413) or the token's jobs in flight (429).
SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERRORS,
    413: {"model": ErrorBody, "description": "the body is over api.max_body_bytes"},
    429: {"model": ErrorBody, "description": "the token has api.quotas.max_jobs_in_flight"},
    200: {"model": Job, "description": "the job this Idempotency-Key already made"},
}

router = APIRouter()


# Who claims a job of each kind whose absence a submission warns about (rollout jobs are
# claimed by the API's own runner threads).
SERVED_BY = {
    JobKind.TRAIN: "trainer service (python -m trainer serve, compose profile train)",
    JobKind.EVAL: "evaluator service (python -m services.eval serve)",
}
SHOWN_UNKNOWN = 5  # unknown instance ids named in the error


def _submit(
    request: Request, kind: JobKind, spec: Spec, who: Principal, key: str | None
) -> JSONResponse:
    job, created = service(request).submit(kind, spec, who, key)
    group = spec.trainer_group if isinstance(spec, TrainSpec) else "default"
    job.warnings = unserved_warnings(service(request), kind, group)
    return JSONResponse(job.model_dump(mode="json"), status_code=201 if created else 200)


def unserved_warnings(svc: ApiService, kind: JobKind, group: str) -> list[str]:
    """A warning when no service of ``kind`` and ``group`` announced itself lately (the job is
    accepted: one may start later, and it then claims the job)."""
    if kind not in SERVED_BY or svc.store.serving(kind, group):
        return []
    what = f"{SERVED_BY[kind]} of group {group!r}" if kind is JobKind.TRAIN else SERVED_BY[kind]
    return [
        f"no {what} has been seen in the last {SERVING_WINDOW_S:.0f} s: the job stays queued "
        "until one starts" + (" (or resubmit with the group of a running trainer)"
                               if kind is JobKind.TRAIN else "")
    ]  # fmt: skip


@lru_cache(maxsize=8)
def _dataset_ids(path: str, mtime_ns: int, size: int) -> frozenset[str]:
    """Every instance id in a dataset file (of good rows and bad ones: the evaluator names
    bad rows itself); cached while the file is unchanged."""
    instances, errors = load_instances_collect(path)
    ids = {inst.instance_id for inst in instances}
    return frozenset(ids | {e.instance_id for e in errors if e.instance_id})


def check_eval_instances(svc: ApiService, spec: EvalSpec) -> None:
    """An eval job's ``instance_ids`` must be in its dataset, when the API can read the file
    (it may live only on the evaluator's host: then the evaluator checks); 422 naming the
    unknown ids. The path is checked against the roots first: nothing outside them is read."""
    if not spec.instance_ids:
        return
    try:
        path = svc.paths.check(spec.dataset, Access.INPUT, "body.dataset")
        stat = os.stat(path)
        known = _dataset_ids(path, stat.st_mtime_ns, stat.st_size)
    except (PathRefused, OSError, DatasetError):
        return  # refused by the submission's own path check, or not readable here
    unknown = [i for i in dict.fromkeys(spec.instance_ids) if i not in known]
    if unknown:
        shown = ", ".join(map(repr, unknown[:SHOWN_UNKNOWN]))
        more = f" and {len(unknown) - SHOWN_UNKNOWN} more" if len(unknown) > SHOWN_UNKNOWN else ""
        raise ApiError(
            422, "unknown_instances", f"body.instance_ids: {len(unknown)} id(s) not in the "
            f"dataset {spec.dataset}: {shown}{more}; give ids of that file (its instance_id "
            "field) or the dataset that holds them", "body.instance_ids",
        )  # fmt: skip


@router.post("/v1/jobs/train", status_code=201, response_model=Job, responses=SUBMIT_RESPONSES)
def submit_train(
    request: Request, spec: TrainSpec, who: Submitter, key: IdemKey = None
) -> JSONResponse:
    """Queue a training run for a trainer of ``spec.trainer_group``."""
    return _submit(request, JobKind.TRAIN, spec, who, key)


@router.post("/v1/jobs/rollout", status_code=201, response_model=Job, responses=SUBMIT_RESPONSES)
def submit_rollout(
    request: Request, spec: RolloutSpec, who: Submitter, key: IdemKey = None
) -> JSONResponse:
    """Queue a rollout: instances x samples trajectories; results carry rewards."""
    return _submit(request, JobKind.ROLLOUT, spec, who, key)


@router.post("/v1/jobs/eval", status_code=201, response_model=Job, responses=SUBMIT_RESPONSES)
def submit_eval(
    request: Request, spec: EvalSpec, who: Submitter, key: IdemKey = None
) -> JSONResponse:
    """Queue an evaluation for an evaluator service (python -m services.eval serve)."""
    check_eval_instances(service(request), spec)
    return _submit(request, JobKind.EVAL, spec, who, key)


@router.get("/v1/jobs", response_model=JobPage, responses=ERRORS)
def list_jobs(
    request: Request,
    _: Reader,
    kind: JobKind | None = None,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 50,
    cursor: Annotated[int | None, Query(ge=0, le=2**53)] = None,
) -> JobPage:
    """Jobs, newest first, filtered by kind and/or state; follow ``next_cursor`` for more."""
    svc = service(request)
    return svc.list_jobs(kind, state, limit, cursor)


@router.get("/v1/jobs/{job_id}", response_model=Job, responses=ERRORS)
def get_job(request: Request, job_id: JobId, _: Reader) -> Job:
    svc = service(request)
    return svc.job(job_id)


@router.get(
    "/v1/jobs/{job_id}/results",
    response_model=ResultPage,
    responses={**ERRORS, 200: {"content": {NDJSON: {}, SSE: {}}}},
)
def job_results(
    request: Request,
    _: Reader,
    job_id: JobId,
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    format: Literal["json", "ndjson", "sse"] = "json",
    follow: bool = False,
) -> Response:
    """One result per trajectory (reward, status, patch...). ``format=ndjson`` streams them one
    JSON object per line from ``offset``, ``format=sse`` as server-sent events (``id:`` the
    row's offset); ``follow=true`` streams until the job ends."""
    svc = service(request)
    svc.job(job_id)  # 404 for an unknown job
    if format != "json":
        sse = format == "sse"
        stream = svc.stream_results(job_id, offset, follow, sse=sse)
        return StreamingResponse(stream, media_type=SSE if sse else NDJSON)
    page = svc.results(job_id, offset, limit)
    return JSONResponse(page.model_dump(mode="json"))


@router.get("/v1/jobs/{job_id}/trajectories/{trajectory_id}", responses=ERRORS)
def job_trajectory(
    request: Request, job_id: JobId, trajectory_id: JobId, _: Reader
) -> dict[str, Any]:
    """The record of one trajectory of the job (a result's ``trajectory_id``): its segments
    with token ids and logprobs, and its outcome."""
    return service(request).trajectory(job_id, trajectory_id)


@router.get("/v1/jobs/{job_id}/logs", response_model=LogPage, responses=ERRORS)
def job_logs(
    request: Request,
    _: Reader,
    job_id: JobId,
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> LogPage:
    """The job's log lines from ``offset``; poll with ``next_offset`` to follow."""
    svc = service(request)
    svc.job(job_id)
    return svc.logs(job_id, offset, limit)


@router.get("/v1/jobs/{job_id}/progress", response_model=ProgressPage, responses=ERRORS)
def job_progress(
    request: Request,
    _: Reader,
    job_id: JobId,
    after: Annotated[str | None, Query(pattern=STREAM_ID_PATTERN, max_length=39)] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> ProgressPage:
    """What each trajectory of a rollout job is doing: phase, turn, tokens, elapsed time and
    the tool running now (``latest``: one event per trajectory). ``after=0`` also returns the
    kept event history (``events``), ``after=<next_after>`` the events since. Events are kept
    for a day after the job's last one; other job kinds have none."""
    svc = service(request)
    svc.job(job_id)  # 404 for an unknown job
    store = ProgressStore(svc.redis, svc.cfg.queue.prefix)  # a rollout job's batch is its id
    page = ProgressPage(latest=store.latest(job_id))
    if after is not None:
        page.next_after, page.events = store.events(job_id, after, limit)
    return page


@router.post("/v1/jobs/{job_id}/cancel", response_model=Job, responses=ERRORS)
def cancel_job(request: Request, job_id: JobId, who: Submitter) -> Job:
    """Cancel: a queued job at once; a running one goes ``cancelling`` until its runner stops.
    Submitters may cancel their own jobs, admins any. A finished job is a 409."""
    return service(request).cancel(job_id, who)


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(request: Request) -> JSONResponse:
    """Readiness: Redis answers."""
    problem = service(request).redis_problem()
    if problem:
        return JSONResponse(Health(status="unavailable", detail=problem).model_dump(), 503)
    return JSONResponse(Health(status="ok").model_dump())


@router.get("/metrics", response_class=Response)
def metrics(request: Request) -> Response:
    svc = service(request)
    return Response(svc.render_metrics(), media_type=svc.metrics_content_type)
