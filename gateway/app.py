"""The HTTP API (aiohttp): create jobs, read jobs and their runs, health.

Handlers are thin: decode with msgspec, call the domain, encode with msgspec. One middleware
maps errors to RFC 9457 problem bodies (``application/problem+json``) with a stable ``code``
and the request id; a client never sees a stack trace or a 500 for bad input.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web

from bus.nats import Bus
from core import schedule as schedules
from core.clock import Clock
from core.errors import (
    BusUnavailable,
    FieldError,
    InvalidRequest,
    JobschedError,
    MalformedRequest,
    PayloadTooLarge,
    Unavailable,
)
from core.ids import new_job_id, partition_of
from core.model import (
    ExecutionStatus,
    Health,
    Job,
    JobCreate,
    JobNotice,
    JobStatus,
    Problem,
    ProblemField,
)
from core.ports import JobQuery, JobStore
from core.tasks import TaskCatalog, validation_field_error
from gateway.auth import user_from_authorization

log = logging.getLogger(__name__)

PROBLEM_BASE = "https://jobsched.dev/problems/"
JSON = "application/json"
PROBLEM_JSON = "application/problem+json"
MAX_PAGE = 500

encoder = msgspec.json.Encoder()
job_create_decoder = msgspec.json.Decoder(JobCreate)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Gateway settings.

    Attributes:
        auth_secret: HS256 key of bearer tokens.
        partitions: number of partitions (to assign a new job its partition).
        max_body_bytes: largest accepted request body.
        max_attempts_limit: the work consumers' max deliveries; ``maxAttempts`` may not exceed it.
        misfire_grace_s: a once job up to this many seconds in the past runs at once.
    """

    auth_secret: str
    partitions: int = 64
    max_body_bytes: int = 64 * 1024
    max_attempts_limit: int = 20
    misfire_grace_s: float = schedules.DEFAULT_MISFIRE_GRACE_S


@dataclass(frozen=True, slots=True)
class GatewayDeps:
    store: JobStore
    bus: Bus | None
    catalog: TaskCatalog
    clock: Clock
    config: GatewayConfig


DEPS = web.AppKey("deps", GatewayDeps)
USER = web.RequestKey("user", str)
REQUEST_ID = web.RequestKey("request_id", str)
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(deps: GatewayDeps) -> web.Application:
    """The gateway application. The store and bus are opened and closed by the caller."""
    app = web.Application(
        middlewares=[problem_middleware, auth_middleware],
        client_max_size=deps.config.max_body_bytes,
    )
    app[DEPS] = deps
    app.router.add_post("/jobs", create_job)
    app.router.add_get("/jobs", list_jobs)
    app.router.add_get("/jobs/{job_id}", get_job)
    app.router.add_get("/jobs/{job_id}/executions", list_executions)
    app.router.add_get("/tasks", list_tasks)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


# --- middlewares -----------------------------------------------------------------------------


def problem_response(
    status: int,
    code: str,
    title: str,
    detail: str | None,
    request: web.Request,
    errors: list[FieldError] | None = None,
) -> web.Response:
    """An RFC 9457 problem response."""
    body = Problem(
        type=PROBLEM_BASE + code,
        title=title,
        status=status,
        detail=detail,
        instance=request.path,
        code=code,
        request_id=request.get(REQUEST_ID),
        errors=[ProblemField(field=e.field, reason=e.reason) for e in errors] if errors else None,
    )
    resp = web.Response(status=status, body=encoder.encode(body), content_type=PROBLEM_JSON)
    if status == 401:
        resp.headers["WWW-Authenticate"] = 'Bearer realm="jobsched"'
    if status == 503:
        resp.headers["Retry-After"] = "1"
    return resp


TITLES = {
    400: "Malformed request",
    401: "Unauthorized",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request body too large",
    422: "Invalid request",
    503: "Service unavailable",
}


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    try:
        resp = await handler(request)
    except JobschedError as e:
        errors = e.errors if isinstance(e, InvalidRequest) else None
        if isinstance(e, Unavailable):
            log.warning("503 for %s %s: %s", request.method, request.path, e)
        resp = problem_response(
            e.status, e.code, TITLES.get(e.status, "Error"), e.message, request, errors
        )
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[DEPS].config.max_body_bytes
        e2 = PayloadTooLarge(f"the body exceeds the limit of {limit} bytes")
        resp = problem_response(413, e2.code, TITLES[413], e2.message, request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
        resp = problem_response(e.status, code, TITLES.get(e.status, e.reason), e.reason, request)
    except Exception:
        log.exception("500 for %s %s (request %s)", request.method, request.path, request_id)
        resp = problem_response(
            500,
            "internal_error",
            "Internal error",
            "an unexpected error; see the server log",
            request,
        )
    resp.headers["X-Request-Id"] = request_id
    return resp


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path not in PUBLIC_PATHS:
        secret = request.app[DEPS].config.auth_secret
        request[USER] = user_from_authorization(request.headers.get("Authorization"), secret)
    return await handler(request)


# --- handlers --------------------------------------------------------------------------------


def json_response(
    obj: Any, status: int = 200, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(status=status, body=encoder.encode(obj), content_type=JSON, headers=headers)


async def read_json(request: web.Request, decoder: msgspec.json.Decoder[Any]) -> Any:
    """Decode the body with ``decoder``.

    Raises:
        MalformedRequest: not JSON (400). InvalidRequest: wrong shape (422), naming the field.
    """
    body = await request.read()
    if not body:
        raise MalformedRequest("the request body is empty; send a JSON object")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        raise InvalidRequest(validation_field_error(e)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise MalformedRequest(f"the body is not valid JSON: {e}") from None


async def create_job(request: web.Request) -> web.Response:
    """``POST /jobs``: validate, store durably, notify the owning scheduler, answer 201."""
    deps = request.app[DEPS]
    body: JobCreate = await read_json(request, job_create_decoder)
    job = build_job(body, owner=request[USER], deps=deps)
    job = await deps.store.create_job(job)
    await notify(deps.bus, job)
    log.info(
        "job %s created (%s)",
        job.id,
        job.task_id,
        extra={"job_id": job.id, "partition": job.partition},
    )
    return json_response(job, status=201, headers={"Location": f"/jobs/{job.id}"})


def build_job(body: JobCreate, *, owner: str, deps: GatewayDeps) -> Job:
    """The new job for a create request.

    Raises:
        InvalidRequest: unknown task, parameters of the wrong shape, invalid schedule, options
            beyond this deployment's limits.
    """
    spec = deps.catalog.get(body.task_id)
    spec.decode_params(body.parameters)
    now = deps.clock.now()
    sched = schedules.normalize(body.schedule, now, grace_s=deps.config.misfire_grace_s)
    max_attempts = body.max_attempts or spec.max_attempts
    if max_attempts > deps.config.max_attempts_limit:
        raise InvalidRequest(
            FieldError("maxAttempts", f"must be at most {deps.config.max_attempts_limit} here")
        )
    job_id = new_job_id()
    return Job(
        id=job_id,
        owner=owner,
        task_id=body.task_id,
        schedule=sched,
        parameters=body.parameters,
        queue=body.queue,
        max_attempts=max_attempts,
        timeout_seconds=body.timeout_seconds or spec.timeout_seconds,
        status=JobStatus.SCHEDULED,
        partition=partition_of(job_id, deps.config.partitions),
        created_at=now,
        updated_at=now,
        next_run_at=schedules.first_run_at(sched, now),
    )


async def notify(bus: Bus | None, job: Job) -> None:
    """Tell the partition's scheduler (best effort: its safety scan finds the job anyway)."""
    if bus is None:
        return
    try:
        await bus.notify(
            JobNotice(job_id=job.id, partition=job.partition, next_run_at=job.next_run_at)
        )
    except BusUnavailable as e:
        log.warning(
            "job %s stored; notice not sent (%s); the scheduler's scan will find it", job.id, e
        )


LIST_PARAMS = frozenset({"status", "lastRunStatus", "startTime", "endTime", "limit", "cursor"})


async def list_jobs(request: web.Request) -> web.Response:
    """``GET /jobs``: the caller's jobs, newest first, filtered, cursor-paginated."""
    q = request.query
    unknown = sorted(set(q) - LIST_PARAMS)
    if unknown:
        raise InvalidRequest(
            [
                FieldError(u, f"unknown query parameter; known: {', '.join(sorted(LIST_PARAMS))}")
                for u in unknown
            ]
        )
    query = JobQuery(
        status=_enum_param(q, "status", JobStatus),
        last_run_status=_enum_param(q, "lastRunStatus", ExecutionStatus),
        created_from=_time_param(q, "startTime"),
        created_to=_time_param(q, "endTime"),
    )
    page = await request.app[DEPS].store.list_jobs(
        request[USER], query, limit=_limit_param(q), cursor=q.get("cursor") or None
    )
    return json_response(page)


async def get_job(request: web.Request) -> web.Response:
    job = await request.app[DEPS].store.get_job(request[USER], request.match_info["job_id"])
    return json_response(job)


async def list_executions(request: web.Request) -> web.Response:
    q = request.query
    page = await request.app[DEPS].store.list_executions(
        request[USER],
        request.match_info["job_id"],
        limit=_limit_param(q),
        cursor=q.get("cursor") or None,
    )
    return json_response(page)


async def list_tasks(request: web.Request) -> web.Response:
    """``GET /tasks``: the task catalog (name, kind, defaults, parameters' JSON Schema)."""
    catalog = request.app[DEPS].catalog
    return json_response(
        {
            "items": [
                {
                    "taskId": t.name,
                    "kind": t.kind,
                    "description": t.description,
                    "timeoutSeconds": t.timeout_seconds,
                    "maxAttempts": t.max_attempts,
                    "parameters": msgspec.json.schema(t.params_type),
                }
                for t in catalog
            ]
        }
    )


async def healthz(request: web.Request) -> web.Response:
    """``GET /healthz``: the process is alive."""
    return json_response(Health(status="ok"))


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: NATS and the store answer (503 with the failing check otherwise)."""
    deps = request.app[DEPS]
    checks: dict[str, str] = {}
    try:
        await deps.store.ping()
        checks["store"] = "ok"
    except Unavailable as e:
        checks["store"] = e.message
    if deps.bus is not None:
        try:
            await deps.bus.ping()
            checks["nats"] = "ok"
        except Unavailable as e:
            checks["nats"] = e.message
    ok = all(v == "ok" for v in checks.values())
    return json_response(
        Health(status="ok" if ok else "unavailable", checks=checks), status=200 if ok else 503
    )


# --- query parameters ------------------------------------------------------------------------


def _enum_param(q: Any, name: str, enum: type[JobStatus] | type[ExecutionStatus]) -> Any:
    raw = q.get(name)
    if raw is None or raw == "":
        return None
    try:
        return enum(raw.upper())
    except ValueError:
        allowed = ", ".join(m.value for m in enum)
        raise InvalidRequest(FieldError(name, f"unknown value {raw!r}; one of {allowed}")) from None


def _time_param(q: Any, name: str) -> datetime | None:
    raw = q.get(name)
    if raw is None or raw == "":
        return None
    try:
        t = msgspec.convert(raw, datetime)
    except msgspec.ValidationError:
        raise InvalidRequest(
            FieldError(name, "must be an RFC 3339 timestamp with an offset")
        ) from None
    if t.tzinfo is None:
        raise InvalidRequest(FieldError(name, "must include a UTC offset, e.g. Z or +02:00"))
    return t


def _limit_param(q: Any) -> int:
    raw = q.get("limit")
    if raw is None or raw == "":
        return 50
    try:
        n = int(raw)
    except ValueError:
        raise InvalidRequest(FieldError("limit", "must be an integer")) from None
    if not 1 <= n <= MAX_PAGE:
        raise InvalidRequest(FieldError("limit", f"must be between 1 and {MAX_PAGE}"))
    return n
