"""The job API as a NATS service (nats-py ``micro``, the NATS services protocol of ADR-32).

Subjects ``<prefix>.api.<operation>``, request-reply, JSON bodies with the same structs as HTTP:

============  ======================================================  ================
operation     request body                                            reply
============  ======================================================  ================
``create``    a job (as ``POST /jobs``); header ``Idempotency-Key``   the job
``get``       ``{"id": "<job id>"}``                                  the job
``list``      ``{"status", "lastRunStatus", "startTime", "endTime", "taskId",   a page of jobs
              "name", "labels", "limit", "cursor", "owner", "allUsers"}``
              (all optional; ``labels`` a label selector, as ``GET /jobs``)
``patch``     ``{"id": …}`` and the fields of ``PATCH /jobs/{id}``     the job
              (schedule, parameters, notify, concurrencyKey, …)
``cancel``    ``{"id": …}``                                           the job
``pause``     ``{"id": …}``                                           the job
``resume``    ``{"id": …}``                                           the job
``trigger``   ``{"id": …}``                                           the new run
``explain``   ``{"id": …}``                                           why its next run has
                                                                      not started
``executions``  ``{"id": …, "limit", "cursor"}`` (as ``GET              a page of its runs
              /jobs/{id}/executions``)
``execution``   ``{"jobId": …, "executionId": …}``                      one run with its
                                                                      attempts
``audit``     ``{"jobId", "owner", "actor", "allUsers", "limit",      a page of audit
              "cursor"}`` (all optional; as ``GET /audit``)            records
============  ======================================================  ================

As over HTTP, a key repeated in a JSON object is refused (422 naming it).
Notifications (README "Notifications"): ``notification-default`` (body ``{}``) answers the caller's
default webhook as ``GET /me/notifications``; ``set-notification-default`` (``{"notify": {...} |
null}``) sets it as ``PUT /me/notifications``; ``notifications`` (``{"jobId", "executionId"}``)
answers a run's delivery attempts as ``GET /jobs/{id}/executions/{eid}/notifications``.
The operations on runs (dead letters, replay, backfill, bulk actions) are in
:mod:`gateway.natsapi_runs`.

Identity: header ``Authorization: Bearer <token>`` (the same tokens, roles and scopes as HTTP).
Errors are service errors (headers ``Nats-Service-Error-Code`` = the HTTP status and
``Nats-Service-Error`` = the message) whose body is the same RFC 9457 problem as HTTP, with the
same stable ``code``; a 429 also carries ``Retry-After`` (seconds) when waiting helps. Every
gateway process serves the API in one queue group.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any

import msgspec

from core import schedule as schedules
from core.access import Principal
from core.audit import AuditQuery
from core.bulk import AlreadyReplayed
from core.errors import (
    FieldError,
    InvalidRequest,
    JobschedError,
    MalformedRequest,
    NameTaken,
    QuotaExceeded,
    Unavailable,
)
from core.labels import parse_selector
from core.model import ExecutionStatus, JobCreate, JobPatch, JobStatus, Problem, ProblemField
from core.notifications import NotificationDefaultIn
from core.ports import JobQuery, Reply, ServiceHandler, ServiceHost, ServiceSpec
from core.tasks import validation_field_error
from gateway import notifications
from gateway.auth import principal_from_authorization
from gateway.inputs import check_duplicate_keys, check_time_range
from gateway.natsapi_runs import RUN_OPERATIONS
from gateway.problems import quota_limit, retry_after
from gateway.runs import RunService
from gateway.service import JobService

log = logging.getLogger(__name__)

VERSION = "1.0.0"
SPEC = ServiceSpec(
    name="jobsched",
    version=VERSION,
    description="jobsched job API (same requests and responses as HTTP)",
    queue_group="jobsched-api",
    group="api",
)


class JobRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str


class PatchRequest(JobPatch, kw_only=True, frozen=True):
    """``patch``: the job's id beside the fields of ``PATCH /jobs/{id}``."""

    id: str


class ListRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    status: JobStatus | None = None
    last_run_status: ExecutionStatus | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    task_id: str | None = None
    name: str | None = None
    labels: str | None = None
    idempotency_key: str | None = None
    limit: int = msgspec.field(default=50)
    cursor: str | None = None
    owner: str | None = None
    all_users: bool = False


class AuditRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    job_id: str | None = None
    owner: str | None = None
    actor: str | None = None
    all_users: bool = False
    limit: int = 50
    cursor: str | None = None


_encoder = msgspec.json.Encoder()
_create = msgspec.json.Decoder(JobCreate)
_ref = msgspec.json.Decoder(JobRef)
_patch = msgspec.json.Decoder(PatchRequest)
_list = msgspec.json.Decoder(ListRequest)
_audit = msgspec.json.Decoder(AuditRequest)

Operation = Callable[[JobService, Principal, bytes, dict[str, str]], Awaitable[Any]]
Call = Callable[[Principal, bytes, dict[str, str]], Awaitable[Any]]


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes) -> Any:
    check_duplicate_keys(data)
    try:
        return decoder.decode(data or b"{}")
    except msgspec.ValidationError as e:
        raise InvalidRequest(validation_field_error(e)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise MalformedRequest(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise MalformedRequest("the body nests objects or arrays too deeply") from None


async def _op_create(svc: JobService, user: Principal, data: bytes, headers: dict[str, str]) -> Any:
    if not data.strip():  # as over HTTP: a create needs a body (list and the others do not)
        raise MalformedRequest("the request body is empty; send a JSON object")
    job, _ = await svc.create(
        user, _decode(_create, data), idempotency_key=headers.get("Idempotency-Key")
    )
    return job


async def _op_list(svc: JobService, user: Principal, data: bytes, headers: dict[str, str]) -> Any:
    req: ListRequest = _decode(_list, data)
    start, end = (
        None if t is None else schedules.checked_instant(t, name)
        for name, t in (("startTime", req.start_time), ("endTime", req.end_time))
    )
    check_time_range({"startTime": start, "endTime": end})
    _check_limit(req.limit)
    query = JobQuery(
        req.status,
        req.last_run_status,
        start,
        end,
        req.task_id or None,
        name=req.name or None,
        labels=parse_selector(req.labels or "", "labels"),
        idempotency_key=req.idempotency_key or None,
    )
    return await svc.list_jobs(
        user,
        query,
        limit=req.limit,
        cursor=req.cursor,
        owner=req.owner or None,
        all_users=req.all_users,
    )


async def _op_audit(svc: JobService, user: Principal, data: bytes, headers: dict[str, str]) -> Any:
    req: AuditRequest = _decode(_audit, data)
    _check_limit(req.limit)
    query = AuditQuery(owner=req.owner or None, actor=req.actor or None, job_id=req.job_id or None)
    return await svc.list_audit(
        user, query, limit=req.limit, cursor=req.cursor, all_users=req.all_users
    )


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= 500:
        raise InvalidRequest(FieldError("limit", "must be between 1 and 500"))


def _on_ref(method: Callable[[JobService, Principal, str], Awaitable[Any]]) -> Operation:
    async def op(svc: JobService, user: Principal, data: bytes, headers: dict[str, str]) -> Any:
        return await method(svc, user, _decode(_ref, data).id)

    return op


async def _op_patch(svc: JobService, user: Principal, data: bytes, headers: dict[str, str]) -> Any:
    req: PatchRequest = _decode(_patch, data)
    fields = msgspec.structs.asdict(req)
    del fields["id"]
    return await svc.patch(user, req.id, JobPatch(**fields))


async def _op_get(svc: JobService, user: Principal, job_id: str) -> Any:
    return await svc.get(user, job_id)


class AttemptsRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    job_id: str
    execution_id: str


class ExecutionsRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    id: str
    limit: int = 50
    cursor: str | None = None


_default_in = msgspec.json.Decoder(NotificationDefaultIn)
_attempts = msgspec.json.Decoder(AttemptsRequest)
_executions = msgspec.json.Decoder(ExecutionsRequest)


async def _op_executions(
    svc: JobService, user: Principal, data: bytes, headers: dict[str, str]
) -> Any:
    req: ExecutionsRequest = _decode(_executions, data)
    _check_limit(req.limit)
    return await svc.list_executions(user, req.id, limit=req.limit, cursor=req.cursor or None)


async def _op_execution(
    svc: JobService, user: Principal, data: bytes, headers: dict[str, str]
) -> Any:
    req: AttemptsRequest = _decode(_attempts, data)
    return await svc.get_execution(user, req.job_id, req.execution_id)


async def _op_notification_default(
    svc: JobService, user: Principal, data: bytes, headers: dict[str, str]
) -> Any:
    return await notifications.get_default(svc.store, user)


async def _op_set_notification_default(
    svc: JobService, user: Principal, data: bytes, headers: dict[str, str]
) -> Any:
    if not data.strip():
        raise MalformedRequest("the request body is empty; send a JSON object")
    return await notifications.put_default(svc.store, user, _decode(_default_in, data))


async def _op_notifications(
    svc: JobService, user: Principal, data: bytes, headers: dict[str, str]
) -> Any:
    req: AttemptsRequest = _decode(_attempts, data)
    return await notifications.list_attempts(svc, user, req.job_id, req.execution_id)


OPERATIONS: dict[str, Operation] = {
    "create": _op_create,
    "get": _on_ref(_op_get),
    "list": _op_list,
    "patch": _op_patch,
    "cancel": _on_ref(JobService.cancel),
    "pause": _on_ref(JobService.pause),
    "resume": _on_ref(JobService.resume),
    "trigger": _on_ref(JobService.trigger),
    "explain": _on_ref(JobService.explain),
    "executions": _op_executions,
    "execution": _op_execution,
    "audit": _op_audit,
    "notification-default": _op_notification_default,
    "set-notification-default": _op_set_notification_default,
    "notifications": _op_notifications,
}


class NatsApi:
    """Serves :data:`OPERATIONS` over NATS until stopped (an actor of the gateway role).

    Args:
        host: serves the endpoints (NATS: :class:`bus.micro.MicroHost`).
        service: the job service shared with HTTP.
        secret: the bearer-token key.
        runs: the run service shared with HTTP (default: one of its own on ``service``).
    """

    def __init__(
        self,
        host: ServiceHost,
        service: JobService,
        secret: str,
        runs: RunService | None = None,
    ) -> None:
        self.host = host
        self.service = service
        self.runs = runs or RunService(service)
        self.secret = secret
        self.name = "nats-api"
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        endpoints = {
            name: self._handler(name, functools.partial(op, self.service))
            for name, op in OPERATIONS.items()
        }
        endpoints.update(
            (name, self._handler(name, functools.partial(op, self.runs)))
            for name, op in RUN_OPERATIONS.items()
        )
        async with self.host.serve(SPEC, endpoints):
            self.ready.set()
            await self._stop.wait()

    def _handler(self, name: str, operation: Call) -> ServiceHandler:
        async def handle(data: bytes, headers: Mapping[str, str]) -> Reply:
            try:
                user = principal_from_authorization(headers.get("Authorization"), self.secret)
                result = await operation(user, data, dict(headers))
            except JobschedError as e:
                if isinstance(e, Unavailable):
                    log.warning("NATS API %s: %s", name, e)
                elif e.status >= 500:
                    log.error("NATS API %s: %s", name, e)
                extra = None
                if isinstance(e, QuotaExceeded) and e.retry_after_seconds is not None:
                    extra = {"Retry-After": retry_after(e.retry_after_seconds)}
                return Reply(_problem(e, name), str(e.status), e.message, extra)
            except Exception:
                log.exception("NATS API %s failed", name)
                err = JobschedError("an unexpected error; see the server log")
                return Reply(_problem(err, name), "500", err.message)
            return Reply(_encoder.encode(notifications.public(result)))

        return handle


def _problem(e: JobschedError, operation: str) -> bytes:
    errors = e.errors if isinstance(e, InvalidRequest | NameTaken) else None
    return _encoder.encode(
        Problem(
            type=f"https://jobsched.dev/problems/{e.code}",
            title=type(e).__name__,
            status=e.status,
            detail=e.message,
            instance=operation,
            code=e.code,
            errors=[ProblemField(field=f.field, reason=f.reason) for f in errors]
            if errors
            else None,
            limit=quota_limit(e if isinstance(e, QuotaExceeded) else None),
            replay_id=e.replay_id if isinstance(e, AlreadyReplayed) else None,
        )
    )
