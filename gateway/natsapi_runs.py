"""The NATS API's operations on runs: dead letters, replay, backfill, bulk actions (served by
:class:`gateway.natsapi.NatsApi` beside the job operations, same subjects, identity and errors).

============  ======================================================  ==================
operation     request body                                            reply
============  ======================================================  ==================
``runs``      ``{"status", "taskId", "from", "to", "error", "labels",  a page of runs
              "limit", "cursor", "owner", "allUsers"}`` (as ``GET /executions``;
              default status FAILED: the dead letters)
``replay``    ``{"jobId": …, "executionId": …, "force": false}``      the new run (409
              (as ``POST …/replay``)                                  ``already_replayed``)
``backfill``  ``{"id": <job id>, "from", "to", "dryRun",              the backfill result
              "overlapPolicy"}`` (as ``POST /jobs/{id}/backfill``)
``bulkReplay``  a filter (as ``POST /bulk/replay``)                     the bulk action
``bulkCancel``  a filter (as ``POST /bulk/cancel``)                     the bulk action
``bulk``      ``{"id": <bulk id>}``                                   the bulk action
============  ======================================================  ==================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import msgspec

from core import schedule as schedules
from core.access import Principal
from core.backfill import BackfillRequest
from core.bulk import MAX_ERROR_FILTER, BulkCreate, BulkKind, RunQuery
from core.errors import FieldError, InvalidRequest, MalformedRequest
from core.labels import parse_selector
from core.model import ExecutionStatus, OverlapPolicy
from core.tasks import validation_field_error
from gateway.runs import RunService


class RunsRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    status: ExecutionStatus = ExecutionStatus.FAILED
    task_id: str | None = None
    scheduled_from: datetime | None = msgspec.field(default=None, name="from")
    scheduled_to: datetime | None = msgspec.field(default=None, name="to")
    error: str | None = None
    labels: str | None = None
    limit: int = 50
    cursor: str | None = None
    owner: str | None = None
    all_users: bool = False


class ReplayRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    job_id: str
    execution_id: str
    force: bool = False


class BackfillOperation(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename="camel"):
    id: str
    scheduled_from: datetime = msgspec.field(name="from")
    scheduled_to: datetime = msgspec.field(name="to")
    dry_run: bool = False
    overlap_policy: OverlapPolicy | None = None


class BulkRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    id: str


_runs = msgspec.json.Decoder(RunsRequest)
_replay = msgspec.json.Decoder(ReplayRequest)
_backfill = msgspec.json.Decoder(BackfillOperation)
_bulk_create = msgspec.json.Decoder(BulkCreate)
_bulk_ref = msgspec.json.Decoder(BulkRef)

RunOperation = Callable[[RunService, Principal, bytes, dict[str, str]], Awaitable[Any]]


def _decode(decoder: msgspec.json.Decoder[Any], data: bytes) -> Any:
    try:
        return decoder.decode(data or b"{}")
    except msgspec.ValidationError as e:
        raise InvalidRequest(validation_field_error(e)) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise MalformedRequest(f"the body is not valid JSON: {e}") from None
    except RecursionError:
        raise MalformedRequest("the body nests objects or arrays too deeply") from None


async def _op_runs(svc: RunService, who: Principal, data: bytes, headers: dict[str, str]) -> Any:
    req: RunsRequest = _decode(_runs, data)
    if not 1 <= req.limit <= 500:
        raise InvalidRequest(FieldError("limit", "must be between 1 and 500"))
    if req.error is not None and len(req.error) > MAX_ERROR_FILTER:
        raise InvalidRequest(FieldError("error", f"must be at most {MAX_ERROR_FILTER} characters"))
    start, end = (
        None if t is None else schedules.checked_instant(t, name)
        for name, t in (("from", req.scheduled_from), ("to", req.scheduled_to))
    )
    query = RunQuery(
        req.status,
        req.task_id or None,
        start,
        end,
        req.error or None,
        parse_selector(req.labels or "", "labels") or None,
    )
    return await svc.list_runs(
        who,
        query,
        limit=req.limit,
        cursor=req.cursor,
        owner=req.owner or None,
        all_users=req.all_users,
    )


async def _op_replay(svc: RunService, who: Principal, data: bytes, headers: dict[str, str]) -> Any:
    req: ReplayRequest = _decode(_replay, data)
    return await svc.replay(who, req.job_id, req.execution_id, force=req.force)


async def _op_backfill(
    svc: RunService, who: Principal, data: bytes, headers: dict[str, str]
) -> Any:
    req: BackfillOperation = _decode(_backfill, data)
    body = BackfillRequest(
        scheduled_from=req.scheduled_from,
        scheduled_to=req.scheduled_to,
        dry_run=req.dry_run,
        overlap_policy=req.overlap_policy,
    )
    return await svc.backfill(who, req.id, body)


def _op_bulk_create(kind: BulkKind) -> RunOperation:
    async def op(svc: RunService, who: Principal, data: bytes, headers: dict[str, str]) -> Any:
        return await svc.create_bulk(who, kind, _decode(_bulk_create, data))

    return op


async def _op_bulk(svc: RunService, who: Principal, data: bytes, headers: dict[str, str]) -> Any:
    return await svc.get_bulk(who, _decode(_bulk_ref, data).id)


RUN_OPERATIONS: dict[str, RunOperation] = {
    "runs": _op_runs,
    "replay": _op_replay,
    "backfill": _op_backfill,
    "bulkReplay": _op_bulk_create(BulkKind.REPLAY),
    "bulkCancel": _op_bulk_create(BulkKind.CANCEL),
    "bulk": _op_bulk,
}
