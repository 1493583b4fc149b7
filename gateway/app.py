"""The HTTP API (aiohttp): create jobs, read jobs and their runs, health.

Handlers are thin: decode with msgspec, call the domain, encode with msgspec. One middleware
maps errors to RFC 9457 problem bodies (``application/problem+json``) with a stable ``code``
and the request id; a client never sees a stack trace or a 500 for bad input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry

from actors.health import Check, health_response, healthz, readiness
from actors.metrics import Metrics, metrics_handler
from core import heatmap
from core import schedule as schedules
from core.access import Principal
from core.audit import AuditQuery
from core.backfill import BackfillRequest
from core.bulk import MAX_ERROR_FILTER, AlreadyReplayed, BulkCreate, BulkKind, RunQuery
from core.clock import Clock
from core.cluster import ClusterSource
from core.errors import (
    FieldError,
    InvalidRequest,
    JobschedError,
    MalformedRequest,
    NameTaken,
    PayloadTooLarge,
    QuotaExceeded,
    Unavailable,
)
from core.labels import parse_selector
from core.model import (
    ExecutionStatus,
    Job,
    JobCreate,
    JobPatch,
    JobStatus,
)
from core.notifications import NotificationDefaultIn
from core.ports import CancelRequests, GatewayBus, JobQuery, JobStore, RunInspector, StatusStream
from core.settings import GatewayConfig
from core.tasks import TaskCatalog, validation_field_error
from gateway import apidocs, dashboard, notifications, stats
from gateway.auth import principal_from_authorization
from gateway.bulk import BulkRunner
from gateway.cors import enable_cors, is_preflight
from gateway.http_metrics import http_metrics_middleware
from gateway.inputs import (
    check_duplicate_keys,
    check_json_media_type,
    check_single_values,
    check_time_range,
)
from gateway.live import LiveStatus
from gateway.openapi import openapi_document
from gateway.problems import TITLES, describe, problem
from gateway.runs import RunService
from gateway.service import JobService
from gateway.ws import close_all, websocket

log = logging.getLogger(__name__)

JSON = "application/json"
MAX_PAGE = 500

encoder = msgspec.json.Encoder()
job_create_decoder = msgspec.json.Decoder(JobCreate)
job_patch_decoder = msgspec.json.Decoder(JobPatch)
notification_default_decoder = msgspec.json.Decoder(NotificationDefaultIn)
backfill_decoder = msgspec.json.Decoder(BackfillRequest)
bulk_decoder = msgspec.json.Decoder(BulkCreate)
MAX_PREVIEW = 1000


@dataclass(frozen=True, slots=True)
class GatewayDeps:
    """What the gateway uses (the ports of :mod:`core.ports`; ``jobsched/runtime.py`` passes the
    NATS adapters); ``bus`` None runs it without NATS (notices and triggers off).

    ``bus`` is the gateway's API connection (notices, manual triggers); ``markers`` the
    cancellation markers on it; ``live_status`` the status stream on its live-status connection
    (``GET /ws``: the status feed and replays), kept apart so that WebSocket traffic can never
    delay or cost the API's (None: no live status); ``inspector`` the read-only looks at
    queues and leases of ``GET /jobs/{id}/explain`` (None: reported unavailable); ``cluster``
    reads the leases and work consumers for ``GET /cluster`` (None: that page shows the
    store's side only).
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
    inspector: RunInspector | None = None
    cluster: ClusterSource | None = None


DEPS = web.AppKey("deps", GatewayDeps)
SERVICE = web.AppKey("service", JobService)
RUNS = web.AppKey("runs", RunService)
BULK_RUNNER = web.AppKey("bulk_runner", BulkRunner)
PRINCIPAL = web.RequestKey("principal", Principal)
LIVE = web.AppKey("live", LiveStatus)
SOCKETS = web.AppKey("sockets", weakref.WeakSet[web.WebSocketResponse])
OPENAPI = web.AppKey("openapi", dict[str, dict[str, Any]])
"""The app's OpenAPI document, under ``"doc"`` once the first request built it."""
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
        deps.inspector,
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
    app.router.add_get("/jobs/{job_id}/explain", explain_job)
    app.router.add_get("/jobs/{job_id}/audit", job_audit)
    app.router.add_get("/audit", list_audit)
    app.router.add_get("/schedules/preview", preview)
    app.router.add_get("/tasks", list_tasks)
    app.router.add_get("/me/notifications", get_notification_default)
    app.router.add_put("/me/notifications", put_notification_default)
    app.router.add_get(
        "/jobs/{job_id}/executions/{execution_id}/notifications", list_notification_attempts
    )
    app[RUNS] = RunService(app[SERVICE])
    app[BULK_RUNNER] = BulkRunner(app[RUNS], holder=f"gateway-{uuid.uuid4().hex[:12]}")
    app.cleanup_ctx.append(_bulk_runner)
    app.router.add_get("/executions", list_runs)
    app.router.add_post("/jobs/{job_id}/executions/{execution_id}/replay", replay_run)
    app.router.add_post("/jobs/{job_id}/backfill", backfill)
    app.router.add_post("/bulk/replay", bulk_action(BulkKind.REPLAY))
    app.router.add_post("/bulk/cancel", bulk_action(BulkKind.CANCEL))
    app.router.add_get("/bulk/{bulk_id}", get_bulk)
    app[LIVE] = LiveStatus(
        deps.live_status,
        replay_concurrency=deps.config.ws_replay_concurrency,
        replay_events_per_second=deps.config.ws_replay_events_per_second,
        metrics=deps.metrics,
    )
    app.cleanup_ctx.append(_live_status_feed)
    app[SOCKETS] = weakref.WeakSet()
    app[OPENAPI] = {}
    app.on_shutdown.append(_close_websockets)
    app.router.add_get("/ws", live_status)
    app.router.add_get("/openapi.json", openapi_json)
    if deps.registry is not None:
        app.router.add_get("/metrics", metrics_handler(deps.registry))
    app.router.add_get("/docs", docs)
    apidocs.add_routes(app)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    dashboard.add_routes(app)
    stats.add_routes(app)
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


async def _close_websockets(app: web.Application) -> None:
    """On shutdown, before aiohttp waits for the handlers: close the live-status WebSockets
    (1001 Going Away), so their clients reconnect elsewhere at once."""
    await close_all(app[SOCKETS])


async def _bulk_runner(app: web.Application) -> AsyncIterator[None]:
    """Run this gateway's bulk runner (:mod:`gateway.bulk`) for the life of the app."""
    runner = app[BULK_RUNNER]
    task = asyncio.create_task(runner.run(), name=runner.name)
    yield
    runner.stop()
    try:
        async with asyncio.timeout(10):
            await task
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# --- middlewares -----------------------------------------------------------------------------


def problem_response(
    status: int,
    code: str,
    title: str,
    detail: str | None,
    request: web.Request,
    errors: list[FieldError] | None = None,
    quota: QuotaExceeded | None = None,
    replay_id: str | None = None,
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
        replay_id=replay_id,
    )


@web.middleware
async def problem_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    try:
        resp = await handler(request)
    except JobschedError as e:
        errors = e.errors if isinstance(e, InvalidRequest | NameTaken) else None
        if isinstance(e, Unavailable):
            log.warning("503 for %s %s: %s", request.method, request.path, e)
        elif e.status >= 500:  # e.g. StoreRejected: a value the validation let through
            log.error("%d for %s %s (request %s): %s", e.status, request.method, request.path,
                      request_id, e)  # fmt: skip
        quota = e if isinstance(e, QuotaExceeded) else None
        replay_id = e.replay_id if isinstance(e, AlreadyReplayed) else None
        resp = problem_response(
            e.status,
            e.code,
            TITLES.get(e.status, "Error"),
            e.message,
            request,
            errors,
            quota,
            replay_id,
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
    body = encoder.encode(notifications.public(obj))
    return web.Response(status=status, body=body, content_type=JSON, headers=headers)


async def read_json(request: web.Request, decoder: msgspec.json.Decoder[Any]) -> Any:
    """Decode the body with ``decoder``.

    Raises:
        UnsupportedMediaType: a ``Content-Type`` that is not JSON (415). MalformedRequest: not
            JSON (400). InvalidRequest: wrong shape, or a key repeated in an object (422),
            naming the field.
    """
    body = await request.read()
    if not body:
        raise MalformedRequest("the request body is empty; send a JSON object")
    check_json_media_type(request.headers.get("Content-Type"))
    check_duplicate_keys(body)
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
    """``GET /jobs/{id}/upcoming?count=N``: the job's next scheduled times (UTC), and ``marks``:
    those a DST transition shifts, doubles or drops, with the rule that applied
    (:func:`core.heatmap.marks_of`)."""
    _only(request.query, {"count"})
    count = _int_param(request.query, "count", default=10, low=1, high=MAX_PREVIEW)
    service, who, job_id = request.app[SERVICE], request[PRINCIPAL], request.match_info["job_id"]
    times = await service.upcoming(who, job_id, count)
    marks = heatmap.marks_of((await service.get(who, job_id)).schedule, times) if times else []
    return json_response({"fireTimes": times, "marks": marks})


async def explain_job(request: web.Request) -> web.Response:
    """``GET /jobs/{id}/explain``: why the job's next run has not started, or why its last
    expected run did not happen (:mod:`core.explain`); 404 for another user's job."""
    _only(request.query, frozenset())
    explanation = await request.app[SERVICE].explain(
        request[PRINCIPAL], request.match_info["job_id"]
    )
    return json_response(explanation)


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
        "name",
        "labels",
        "idempotencyKey",
        "limit",
        "cursor",
        "owner",
        "allUsers",
    }
)


async def list_jobs(request: web.Request) -> web.Response:
    """``GET /jobs``: the caller's jobs, newest first, filtered, cursor-paginated; an admin's
    choice of ``owner``'s or (``allUsers=true``) everyone's. ``labels`` is a label selector
    (:func:`core.labels.parse_selector`); every filter given must hold."""
    q = request.query
    _only(q, LIST_PARAMS)
    times = {name: _time_param(q, name) for name in ("startTime", "endTime")}
    check_time_range(times)
    query = JobQuery(
        status=_enum_param(q, "status", JobStatus),
        last_run_status=_enum_param(q, "lastRunStatus", ExecutionStatus),
        created_from=times["startTime"],
        created_to=times["endTime"],
        task_id=q.get("taskId") or None,
        name=q.get("name") or None,
        labels=parse_selector(q.get("labels", ""), "labels"),
        idempotency_key=q.get("idempotencyKey") or None,
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
    run = await request.app[SERVICE].get_execution(
        request[PRINCIPAL], request.match_info["job_id"], request.match_info["execution_id"]
    )
    return json_response(run)


async def get_notification_default(request: web.Request) -> web.Response:
    """``GET /me/notifications``: the caller's default webhook (``{"notify": null}``: none)."""
    _only(request.query, set())
    return json_response(
        await notifications.get_default(request.app[DEPS].store, request[PRINCIPAL])
    )


async def put_notification_default(request: web.Request) -> web.Response:
    """``PUT /me/notifications``: set (``{"notify": null}``: remove) the caller's default."""
    body: NotificationDefaultIn = await read_json(request, notification_default_decoder)
    return json_response(
        await notifications.put_default(request.app[DEPS].store, request[PRINCIPAL], body)
    )


async def list_notification_attempts(request: web.Request) -> web.Response:
    """``GET /jobs/{id}/executions/{eid}/notifications``: the run's webhook delivery attempts."""
    _only(request.query, set())
    m = request.match_info
    attempts = await notifications.list_attempts(
        request.app[SERVICE], request[PRINCIPAL], m["job_id"], m["execution_id"]
    )
    return json_response(attempts)


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
                    "concurrency": None
                    if t.concurrency is None
                    else {
                        "key": t.concurrency.key,
                        "maxConcurrent": t.concurrency.max_concurrent,
                        "policy": t.concurrency.policy,
                    },
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
        sockets=request.app[SOCKETS],
    )


async def openapi_json(request: web.Request) -> web.Response:
    """``GET /openapi.json``: the OpenAPI 3.1 description of this API."""
    return json_response(_document(request))


async def docs(request: web.Request) -> web.Response:
    """``GET /docs``: the API description as an HTML page (Swagger UI; see gateway/apidocs.py)."""
    return apidocs.page(_document(request))


def _document(request: web.Request) -> dict[str, Any]:
    """The OpenAPI document of this app, built once (about 0.15 s of CPU: not per request)."""
    cache = request.app[OPENAPI]
    if "doc" not in cache:
        cache["doc"] = openapi_document(task_ids=[t.name for t in request.app[DEPS].catalog])
    return cache["doc"]


async def readyz(request: web.Request) -> web.Response:
    """``GET /readyz``: NATS and the store answer (503 with the failing check otherwise)."""
    deps = request.app[DEPS]
    checks: dict[str, Check] = {"store": deps.store.ping}
    if deps.bus is not None:
        checks["nats"] = deps.bus.ping
    return health_response(await readiness(checks))


RUN_LIST_PARAMS = frozenset(
    {"status", "taskId", "from", "to", "error", "labels", "limit", "cursor", "owner", "allUsers"}
)


async def list_runs(request: web.Request) -> web.Response:
    """``GET /executions``: runs across the caller's jobs (default ``status=FAILED``: the dead
    letters), newest scheduled first, cursor-paginated; ``taskId``, ``from`` / ``to`` (their
    ``scheduledFor``), ``error`` (a case-insensitive substring), ``labels`` (a label selector
    over their jobs, :func:`core.labels.parse_selector`) narrow them; an admin's choice of
    ``owner``'s or (``allUsers=true``) everyone's."""
    q = request.query
    _only(q, RUN_LIST_PARAMS)
    error = q.get("error") or None
    if error is not None and len(error) > MAX_ERROR_FILTER:
        raise InvalidRequest(FieldError("error", f"must be at most {MAX_ERROR_FILTER} characters"))
    query = RunQuery(
        status=_enum_param(q, "status", ExecutionStatus) or ExecutionStatus.FAILED,
        task_id=q.get("taskId") or None,
        scheduled_from=_time_param(q, "from"),
        scheduled_to=_time_param(q, "to"),
        error=error,
        labels=parse_selector(q.get("labels", ""), "labels") or None,
    )
    page = await request.app[RUNS].list_runs(
        request[PRINCIPAL],
        query,
        limit=_limit_param(q),
        cursor=q.get("cursor") or None,
        owner=q.get("owner") or None,
        all_users=_bool_param(q, "allUsers"),
    )
    return json_response(page)


async def replay_run(request: web.Request) -> web.Response:
    """``POST /jobs/{id}/executions/{eid}/replay[?force=true]``: a new run replaying that one;
    201 (409 ``already_replayed`` when it has a replay and ``force`` is not set)."""
    run = await request.app[RUNS].replay(
        request[PRINCIPAL],
        request.match_info["job_id"],
        request.match_info["execution_id"],
        force=_bool_param(request.query, "force"),
    )
    location = f"/jobs/{run.job_id}/executions/{run.id}"
    return json_response(run, status=201, headers={"Location": location})


async def backfill(request: web.Request) -> web.Response:
    """``POST /jobs/{id}/backfill``: the runs of the past range (see :mod:`core.backfill`)."""
    body: BackfillRequest = await read_json(request, backfill_decoder)
    result = await request.app[RUNS].backfill(
        request[PRINCIPAL], request.match_info["job_id"], body
    )
    return json_response(result)


def bulk_action(kind: BulkKind) -> Handler:
    """A ``POST /bulk/<kind>`` handler: record the action, answer 202 with it (its progress at
    ``GET /bulk/{id}``, its ``Location``)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body: BulkCreate = await read_json(request, bulk_decoder)
        action = await request.app[RUNS].create_bulk(request[PRINCIPAL], kind, body)
        return json_response(action, status=202, headers={"Location": f"/bulk/{action.id}"})

    return handler


async def get_bulk(request: web.Request) -> web.Response:
    """``GET /bulk/{id}``: a bulk action's status, counts and filter."""
    action = await request.app[RUNS].get_bulk(request[PRINCIPAL], request.match_info["bulk_id"])
    return json_response(action)


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


def _only(q: Any, known: frozenset[str] | set[str], multi: frozenset[str] = frozenset()) -> None:
    """Raises: InvalidRequest: naming each unknown parameter, or one given twice that is not
    in ``multi`` (the parameters that may repeat)."""
    check_single_values(q, multi)
    unknown = sorted(set(q) - set(known))
    if unknown:
        listed = ", ".join(sorted(known))
        raise InvalidRequest(
            [FieldError(u, f"unknown query parameter; known: {listed}") for u in unknown]
        )
