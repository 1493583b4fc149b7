"""The job API as a NATS service (nats-py ``micro``, the NATS services protocol of ADR-32).

Subjects ``<prefix>.api.<operation>``, request-reply, JSON bodies with the same structs as HTTP:

============  ======================================================  ================
operation     request body                                            reply
============  ======================================================  ================
``create``    a job (as ``POST /jobs``); header ``Idempotency-Key``   the job
``get``       ``{"id": "<job id>"}``                                  the job
``list``      ``{"status", "lastRunStatus", "startTime", "endTime",   a page of jobs
              "limit", "cursor"}`` (all optional)
``cancel``    ``{"id": …}``                                           the job
``pause``     ``{"id": …}``                                           the job
``resume``    ``{"id": …}``                                           the job
``trigger``   ``{"id": …}``                                           the new run
============  ======================================================  ================

Identity: header ``Authorization: Bearer <token>`` (the same tokens as HTTP). Errors are
service errors (headers ``Nats-Service-Error-Code`` = the HTTP status and
``Nats-Service-Error`` = the message) whose body is the same RFC 9457 problem as HTTP, with the
same stable ``code``. Every gateway process serves the API in one queue group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import msgspec
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from bus.nats import Bus
from core import schedule as schedules
from core.errors import FieldError, InvalidRequest, JobschedError, MalformedRequest, Unavailable
from core.model import ExecutionStatus, JobCreate, JobStatus, Problem, ProblemField
from core.ports import JobQuery
from core.tasks import validation_field_error
from gateway.auth import user_from_authorization
from gateway.service import JobService

log = logging.getLogger(__name__)

VERSION = "1.0.0"


class JobRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str


class ListRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    status: JobStatus | None = None
    last_run_status: ExecutionStatus | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    limit: int = msgspec.field(default=50)
    cursor: str | None = None


_encoder = msgspec.json.Encoder()
_create = msgspec.json.Decoder(JobCreate)
_ref = msgspec.json.Decoder(JobRef)
_list = msgspec.json.Decoder(ListRequest)

Operation = Callable[[JobService, str, bytes, dict[str, str]], Awaitable[Any]]


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes) -> Any:
    try:
        return decoder.decode(data or b"{}")
    except msgspec.ValidationError as e:
        raise InvalidRequest(validation_field_error(e)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise MalformedRequest(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise MalformedRequest("the body nests objects or arrays too deeply") from None


async def _op_create(svc: JobService, user: str, data: bytes, headers: dict[str, str]) -> Any:
    if not data.strip():  # as over HTTP: a create needs a body (list and the others do not)
        raise MalformedRequest("the request body is empty; send a JSON object")
    job, _ = await svc.create(
        user, _decode(_create, data), idempotency_key=headers.get("Idempotency-Key")
    )
    return job


async def _op_list(svc: JobService, user: str, data: bytes, headers: dict[str, str]) -> Any:
    req: ListRequest = _decode(_list, data)
    start, end = (
        None if t is None else schedules.checked_instant(t, name)
        for name, t in (("startTime", req.start_time), ("endTime", req.end_time))
    )
    if not 1 <= req.limit <= 500:
        raise InvalidRequest(FieldError("limit", "must be between 1 and 500"))
    query = JobQuery(req.status, req.last_run_status, start, end)
    return await svc.list_jobs(user, query, limit=req.limit, cursor=req.cursor)


def _on_ref(method: Callable[[JobService, str, str], Awaitable[Any]]) -> Operation:
    async def op(svc: JobService, user: str, data: bytes, headers: dict[str, str]) -> Any:
        return await method(svc, user, _decode(_ref, data).id)

    return op


async def _op_get(svc: JobService, user: str, job_id: str) -> Any:
    return await svc.get(user, job_id)


OPERATIONS: dict[str, Operation] = {
    "create": _op_create,
    "get": _on_ref(_op_get),
    "list": _op_list,
    "cancel": _on_ref(JobService.cancel),
    "pause": _on_ref(JobService.pause),
    "resume": _on_ref(JobService.resume),
    "trigger": _on_ref(JobService.trigger),
}


class NatsApi:
    """Serves :data:`OPERATIONS` over NATS until stopped (an actor of the gateway role).

    Args:
        bus: connected NATS adapter.
        service: the job service shared with HTTP.
        secret: the bearer-token key.
    """

    def __init__(self, bus: Bus, service: JobService, secret: str) -> None:
        self.bus = bus
        self.service = service
        self.secret = secret
        self.name = "nats-api"
        self.ready = asyncio.Event()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        svc: Service = await add_service(
            self.bus.nc,
            name="jobsched",
            version=VERSION,
            description="jobsched job API (same requests and responses as HTTP)",
            queue_group="jobsched-api",
        )
        try:
            group = svc.add_group(name=f"{self.bus.config.prefix}.api")
            for name in OPERATIONS:
                await group.add_endpoint(name=name, handler=self._handler(name))
            self.ready.set()
            await self._stop.wait()
        finally:
            await svc.stop()

    def _handler(self, name: str) -> Callable[[Request], Awaitable[None]]:
        operation = OPERATIONS[name]

        async def handle(req: Request) -> None:
            headers = dict(req.headers or {})
            try:
                user = user_from_authorization(headers.get("Authorization"), self.secret)
                result = await operation(self.service, user, req.data, headers)
            except JobschedError as e:
                if isinstance(e, Unavailable):
                    log.warning("NATS API %s: %s", name, e)
                elif e.status >= 500:
                    log.error("NATS API %s: %s", name, e)
                await req.respond_error(str(e.status), e.message, data=_problem(e, name))
                return
            except Exception:
                log.exception("NATS API %s failed", name)
                err = JobschedError("an unexpected error; see the server log")
                await req.respond_error("500", err.message, data=_problem(err, name))
                return
            await req.respond(_encoder.encode(result))

        return handle


def _problem(e: JobschedError, operation: str) -> bytes:
    errors = e.errors if isinstance(e, InvalidRequest) else None
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
        )
    )
