"""The HTTP API (aiohttp): create jobs, read jobs and their runs, health.

Handlers are thin: decode with msgspec, call the domain, encode with msgspec. One middleware
maps errors to RFC 9457 problem bodies (``application/problem+json``) with a stable ``code``
and the request id; a client never sees a stack trace or a 500 for bad input.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry

from actors.health import Check, health_response, healthz, readiness
from actors.metrics import Metrics, metrics_handler
from core import schedule as schedules
from core.access import Principal
from core.audit import AuditQuery
from core.clock import Clock
from core.errors import (
    ExecutionNotFound,
    FieldError,
    InvalidRequest,
    JobschedError,
    MalformedRequest,
    PayloadTooLarge,
    QuotaExceeded,
    Unavailable,
)
from core.model import (
    ExecutionStatus,
    Job,
    JobCreate,
    JobPatch,
    JobStatus,
)
from core.ports import CancelRequests, GatewayBus, JobQuery, JobStore, StatusStream
from core.settings import GatewayConfig
from core.tasks import TaskCatalog, validation_field_error
from gateway import apidocs, dashboard
from gateway.auth import principal_from_authorization
from gateway.cors import enable_cors, is_preflight
from gateway.http_metrics import http_metrics_middleware
from gateway.live import LiveStatus
from gateway.openapi import openapi_document
from gateway.problems import TITLES, describe, problem
from gateway.service import JobService
from gateway.strict import strict_input_middleware
from gateway.ws import websocket

log = logging.getLogger(__name__)

JSON = "application/json"
MAX_PAGE = 500

encoder = msgspec.json.Encoder()
job_create_decoder = msgspec.json.Decoder(JobCreate)
job_patch_decoder = msgspec.json.Decoder(JobPatch)
MAX_PREVIEW = 1000


@dataclass(frozen=True, slots=True)
class GatewayDeps:
    """What the gateway uses (the ports of :mod:`core.ports`; ``jobsched/runtime.py`` passes the
    NATS adapters); ``bus`` None runs it without NATS (notices and triggers off).

    ``bus`` is the gateway's API connection (notices, manual triggers); ``markers`` the
    cancellation markers on it; ``live_status`` the status stream on its live-status connection
    (``GET /ws``: the status feed and replays), kept apart so that WebSocket traffic can never
    delay or cost the API's (None: no live status).
    """

    store: JobStore
    bus: GatewayBus | None
    catalog: TaskCatalog
    clock: Clock
    config: GatewayConfig
    markers: CancelRequests | None = None
    registry: CollectorRegistry | None = None
    live_status: StatusStream | None = None
    metrics: Metrics | None = None


DEPS = web.AppKey("deps", GatewayDeps)
SERVICE = web.AppKey("service", JobService)
PRINCIPAL = web.RequestKey("principal", Principal)
LIVE = web.AppKey("live", LiveStatus)
REQUEST_ID = web.RequestKey("request_id", str)
PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/ws", "/openapi.json", "/docs", "/metrics"})
"""No bearer token needed: health, the API description, and /ws (which authenticates itself)."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def create_app(deps: GatewayDeps) -> web.Application:
    """The gateway application. The store and bus are opened and closed by the caller."""
    app = web.Application(
        middlewares=[
            *([http_metrics_middleware(deps.metrics)] if deps.metrics else []),
            problem_middleware,
            auth_middleware,
            strict_input_middleware,
        ],
        client_max_size=deps.config.max_body_bytes,
    )
    app[DEPS] = deps
    app[SERVICE] = JobService(
        deps.store,
        deps.bus,
        deps.catalog,
        deps.clock,
        deps.config,
        deps.markers,
    )
    app.router.add_post("/jobs", create_job)
    app.router.add_get("/jobs", list_jobs)
    app.router.add_get("/jobs/{job_id}", get_job)
    app.router.add_patch("/jobs/{job_id}", patch_job)
    app.router.add_delete("/jobs/{job_id}", delete_job)
    app.router.add_post("/jobs/{job_id}/pause", control(JobService.pause))
    app.router.add_post("/jobs/{job_id}/resume", control(JobService.resume))
    app.router.add_post("/jobs/{job_id}/cancel", control(JobService.cancel))
    app.router.add_post("/jobs/{job_id}/trigger", trigger_job)
    app.router.add_get("/jobs/{job_id}/executions", list_executions)
    app.router.add_get("/jobs/{job_id}/executions/{execution_id}", get_execution)
    app.router.add_get("/jobs/{job_id}/upcoming", upcoming)
    app.router.add_get("/jobs/{job_id}/audit", job_audit)
    app.router.add_get("/audit", list_audit)
    app.router.add_get("/schedules/preview", preview)
    app.router.add_get("/tasks", list_tasks)
    app[LIVE] = LiveStatus(
        deps.live_status,
        replay_concurrency=deps.config.ws_replay_concurrency,
        replay_events_per_second=deps.config.ws_replay_events_per_second,
        metrics=deps.metrics,
    )
    app.cleanup_ctx.append(_live_status_feed)
    app.router.add_get("/ws", live_status)
    app.router.add_get("/openapi.json", openapi_json)
    if deps.registry is not None:
        app.router.add_get("/metrics", metrics_handler(deps.registry))
    app.router.add_get("/docs", docs)
    apidocs.add_routes(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    dashboard.add_routes(app)
    enable_cors(app, deps.config)
    return app


async def _live_status_feed(app: web.Application) -> AsyncIterator[None]:
    """Run the live-status feed for the life of the app (it starts reading on first use)."""
    feed = asyncio.create_task(app[LIVE].run(), name="gateway live-status feed")
    yield
    feed.cancel()
    try:
        await feed
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise


# --- middlewares -----------------------------------------------------------------------------


def problem_response(
    status: int,
    code: str,
    title: str,
    detail: str | None,
    request: web.Request,
    errors: list[FieldError] | None = None,
    quota: QuotaExceeded | None = None,
) -> web.Response:
    """An RFC 9457 problem response about ``request`` (its path, its request id)."""
    return problem(
        status,
        code,
        detail,
        title=title,
        instance=request.path,
        request_id=request.get(REQUEST_ID),
        errors=errors,
        quota=quota,
    )


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
        elif e.status >= 500:  # e.g. StoreRejected: a value the validation let through
            log.error("%d for %s %s (request %s): %s", e.status, request.method, request.path,
                      request_id, e)  # fmt: skip
        quota = e if isinstance(e, QuotaExceeded) else None
        resp = problem_response(
            e.status, e.code, TITLES.get(e.status, "Error"), e.message, request, errors, quota
        )
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[DEPS].config.max_body_bytes
        e2 = PayloadTooLarge(f"the body exceeds the limit of {limit} bytes")
        resp = problem_response(413, e2.code, TITLES[413], e2.message, request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        resp = http_exception_problem(e, request)
    except web.RequestPayloadError as e:
        detail = f"the body cannot be read: {describe(e)}"
        resp = problem_response(400, "malformed_request", TITLES[400], detail, request)
    except ConnectionError:
        if not _client_gone(request):
            resp = internal_error(request)
        else:
            log.info(
                "%s %s: the client closed the connection before the request was complete "
                "(request %s)",
                request.method,
                request.path,
                request_id,
            )
            detail = "the connection closed before the request was complete"
            resp = problem_response(400, "incomplete_request", TITLES[400], detail, request)
    except Exception:
        resp = internal_error(request)
    resp.headers["X-Request-Id"] = request_id
    return resp


def http_exception_problem(e: web.HTTPException, request: web.Request) -> web.Response:
    """aiohttp's own 4xx (unknown route, method not allowed …) as a problem; a 405 lists the
    path's methods in ``Allow`` (RFC 9110 §15.5.6)."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status, "http_error")
    if not isinstance(e, web.HTTPMethodNotAllowed):
        return problem_response(e.status, code, TITLES.get(e.status, e.reason), e.reason, request)
    allowed = ", ".join(sorted(e.allowed_methods))
    detail = f"{request.method} is not allowed on {request.path}; allowed: {allowed}"
    resp = problem_response(405, code, TITLES[405], detail, request)
    resp.headers["Allow"] = allowed
    return resp


def internal_error(request: web.Request) -> web.Response:
    """A 500 problem for the exception being handled, logged with its traceback."""
    log.exception(
        "500 for %s %s (request %s)", request.method, request.path, request.get(REQUEST_ID)
    )
    detail = "an unexpected error; see the server log"
    return problem_response(500, "internal_error", TITLES[500], detail, request)


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    public = (
        request.path in PUBLIC_PATHS
        or dashboard.is_public(request)
        or apidocs.is_public(request)
        or is_preflight(request)
    )
    if not public:
        secret = request.app[DEPS].config.auth_secret
        header = request.headers.get("Authorization")
        request[PRINCIPAL] = principal_from_authorization(header, secret)
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
    except RecursionError:
        raise MalformedRequest("the body nests objects or arrays too deeply") from None


async def create_job(request: web.Request) -> web.Response:
    """``POST /jobs``: validate, store durably, notify the owning scheduler, answer 201.

    With an ``Idempotency-Key`` header already used for the same body, answers 200 with the
    original job and ``Idempotent-Replayed: true``; used for another body, 409.
    """
    body: JobCreate = await read_json(request, job_create_decoder)
    key = request.headers.get("Idempotency-Key")
    job, replayed = await request.app[SERVICE].create(request[PRINCIPAL], body, idempotency_key=key)
    headers = {"Location": f"/jobs/{job.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return json_response(job, status=200 if replayed else 201, headers=headers)


async def patch_job(request: web.Request) -> web.Response:
    """``PATCH /jobs/{id}``: change schedule, parameters or options."""
    patch: JobPatch = await read_json(request, job_patch_decoder)
    job = await request.app[SERVICE].patch(request[PRINCIPAL], request.match_info["job_id"], patch)
    return json_response(job)


def control(operation: Callable[[JobService, Principal, str], Awaitable[Job]]) -> Handler:
    """A ``POST /jobs/{id}/<action>`` handler answering the job after the action."""

    async def handler(request: web.Request) -> web.StreamResponse:
        job = await operation(
            request.app[SERVICE], request[PRINCIPAL], request.match_info["job_id"]
        )
        return json_response(job)

    return handler


async def trigger_job(request: web.Request) -> web.Response:
    """``POST /jobs/{id}/trigger``: an extra run now; answers 201 with the run."""
    run = await request.app[SERVICE].trigger(request[PRINCIPAL], request.match_info["job_id"])
    return json_response(run, status=201, headers={"Location": f"/jobs/{run.job_id}/executions"})


async def delete_job(request: web.Request) -> web.Response:
    """``DELETE /jobs/{id}``: cancel its runs, delete it and its history; 204."""
    await request.app[SERVICE].delete(request[PRINCIPAL], request.match_info["job_id"])
    return web.Response(status=204)


async def upcoming(request: web.Request) -> web.Response:
    """``GET /jobs/{id}/upcoming?count=N``: the job's next scheduled times (UTC)."""
    _only(request.query, {"count"})
    count = _int_param(request.query, "count", default=10, low=1, high=MAX_PREVIEW)
    times = await request.app[SERVICE].upcoming(
        request[PRINCIPAL], request.match_info["job_id"], count
    )
    return json_response({"fireTimes": times})


PREVIEW_PARAMS = frozenset({"expression", "timezone", "after", "count", "gap", "fold"})


async def preview(request: web.Request) -> web.Response:
    """``GET /schedules/preview``: the next fire times of a cron expression (UTC)."""
    q = request.query
    _only(q, PREVIEW_PARAMS)
    if "expression" not in q:
        raise InvalidRequest(FieldError("expression", "required query parameter is missing"))
    times = request.app[SERVICE].preview(
        q["expression"],
        q.get("timezone") or "UTC",
        _time_param(q, "after"),
        _int_param(q, "count", default=10, low=1, high=MAX_PREVIEW),
        gap=q.get("gap") or "shift",
        fold=q.get("fold") or "once",
    )
    return json_response({"fireTimes": times})


LIST_PARAMS = frozenset(
    {
        "status",
        "lastRunStatus",
        "startTime",
        "endTime",
        "taskId",
        "limit",
        "cursor",
        "owner",
        "allUsers",
    }
)


async def list_jobs(request: web.Request) -> web.Response:
    """``GET /jobs``: the caller's jobs, newest first, filtered, cursor-paginated; an admin's
    choice of ``owner``'s or (``allUsers=true``) everyone's."""
    q = request.query
    _only(q, LIST_PARAMS)
    query = JobQuery(
        status=_enum_param(q, "status", JobStatus),
        last_run_status=_enum_param(q, "lastRunStatus", ExecutionStatus),
        created_from=_time_param(q, "startTime"),
        created_to=_time_param(q, "endTime"),
        task_id=q.get("taskId") or None,
    )
    page = await request.app[SERVICE].list_jobs(
        request[PRINCIPAL],
        query,
        limit=_limit_param(q),
        cursor=q.get("cursor") or None,
        owner=q.get("owner") or None,
        all_users=_bool_param(q, "allUsers"),
    )
    return json_response(page)


async def get_job(request: web.Request) -> web.Response:
    job = await request.app[SERVICE].get(request[PRINCIPAL], request.match_info["job_id"])
    return json_response(job)


EXECUTION_LIST_PARAMS = frozenset({"limit", "cursor"})


async def list_executions(request: web.Request) -> web.Response:
    q = request.query
    _only(q, EXECUTION_LIST_PARAMS)
    page = await request.app[SERVICE].list_executions(
        request[PRINCIPAL],
        request.match_info["job_id"],
        limit=_limit_param(q),
        cursor=q.get("cursor") or None,
    )
    return json_response(page)


async def get_execution(request: web.Request) -> web.Response:
    """``GET /jobs/{id}/executions/{execution_id}``: one run of the job, attempts included.

    Raises:
        JobNotFound: no such job for the caller. ExecutionNotFound: no such run of that job.
    """
    job = await request.app[SERVICE].get(request[PRINCIPAL], request.match_info["job_id"])
    execution_id = request.match_info["execution_id"]
    run = await request.app[DEPS].store.get_execution(execution_id)
    if run is None or run.job_id != job.id:
        raise ExecutionNotFound(f"execution {execution_id} of job {job.id} not found")
    return json_response(run)


AUDIT_PARAMS = frozenset({"limit", "cursor"})
AUDIT_LIST_PARAMS = frozenset({"owner", "actor", "jobId", "allUsers", "limit", "cursor"})


async def job_audit(request: web.Request) -> web.Response:
    """``GET /jobs/{id}/audit``: the job's audit records, newest first (they outlive the job)."""
    q = request.query
    _only(q, AUDIT_PARAMS)
    page = await request.app[SERVICE].job_audit(
        request[PRINCIPAL],
        request.match_info["job_id"],
        limit=_limit_param(q),
        cursor=q.get("cursor") or None,
    )
    return json_response(page)


async def list_audit(request: web.Request) -> web.Response:
    """``GET /audit``: audit records of the caller's jobs, newest first; an admin's of
    ``owner``'s or (``allUsers=true``) everyone's; ``actor`` and ``jobId`` narrow them."""
    q = request.query
    _only(q, AUDIT_LIST_PARAMS)
    page = await request.app[SERVICE].list_audit(
        request[PRINCIPAL],
        AuditQuery(
            owner=q.get("owner") or None,
            actor=q.get("actor") or None,
            job_id=q.get("jobId") or None,
        ),
        limit=_limit_param(q),
        cursor=q.get("cursor") or None,
        all_users=_bool_param(q, "allUsers"),
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


async def live_status(request: web.Request) -> web.StreamResponse:
    """``GET /ws``: WebSocket of live job and run events (see :mod:`gateway.ws`)."""
    deps = request.app[DEPS]
    return await websocket(
        request,
        live=request.app[LIVE],
        secret=deps.config.auth_secret,
        max_buffer=deps.config.ws_buffer_events,
        stall_seconds=deps.config.ws_stall_seconds,
    )


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the OpenAPI 3.1 description of this API."""
    return json_response(openapi_document(task_ids=_task_ids(request)))


async def docs(request: web.Request) -> web.Response:
    """``GET /docs``: the API description as an HTML page (Swagger UI; see gateway/apidocs.py)."""
    return apidocs.page(openapi_document(task_ids=_task_ids(request)))


def _task_ids(request: web.Request) -> list[str]:
    return [t.name for t in request.app[DEPS].catalog]


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: NATS and the store answer (503 with the failing check otherwise)."""
    deps = request.app[DEPS]
    checks: dict[str, Check] = {"store": deps.store.ping}
    if deps.bus is not None:
        checks["nats"] = deps.bus.ping
    return health_response(await readiness(checks))


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
    return schedules.checked_instant(t, name)


def _bool_param(q: Any, name: str) -> bool:
    raw = q.get(name)
    if raw in (None, "", "false"):
        return False
    if raw == "true":
        return True
    raise InvalidRequest(FieldError(name, "must be true or false"))


def _limit_param(q: Any) -> int:
    return _int_param(q, "limit", default=50, low=1, high=MAX_PAGE)


def _int_param(q: Any, name: str, *, default: int, low: int, high: int) -> int:
    raw = q.get(name)
    if raw is None or raw == "":
        return default
    try:
        n = int(raw)
    except ValueError:
        raise InvalidRequest(FieldError(name, "must be an integer")) from None
    if not low <= n <= high:
        raise InvalidRequest(FieldError(name, f"must be between {low} and {high}"))
    return n


def _only(q: Any, known: frozenset[str] | set[str]) -> None:
    unknown = sorted(set(q) - set(known))
    if unknown:
        listed = ", ".join(sorted(known))
        raise InvalidRequest(
            [FieldError(u, f"unknown query parameter; known: {listed}") for u in unknown]
        )
