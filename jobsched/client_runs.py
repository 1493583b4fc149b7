"""The Python clients' methods for dead letters, replays, backfills and bulk actions: mixins of
:class:`jobsched.client.JobschedClient` (HTTP) and :class:`jobsched.client.NatsJobschedClient`
(NATS), with the same names and results.

Example::

    async with JobschedClient(url, token) as client:
        dead = await client.dead_letters(task_id="http", error="503")
        run = await client.replay(dead.items[0].job_id, dead.items[0].id)
        action = await client.bulk_replay({"taskId": "http", "error": "503"})
        action = await client.wait_bulk(action.id, timeout_seconds=60)
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec

from core.backfill import BackfillResult
from core.bulk import OPEN_BULK_STATUSES, BulkAction
from core.model import Execution, Page

_runs_decoder = msgspec.json.Decoder(Page[Execution])
_run_decoder = msgspec.json.Decoder(Execution)
_backfill_decoder = msgspec.json.Decoder(BackfillResult)
_bulk_decoder = msgspec.json.Decoder(BulkAction)


def _filters(
    *,
    status: str | None = None,
    task_id: str | None = None,
    scheduled_from: datetime | None = None,
    scheduled_to: datetime | None = None,
    error: str | None = None,
    labels: str | None = None,
    owner: str | None = None,
    all_users: bool = False,
) -> dict[str, Any]:
    """The camelCase fields of a run filter (absent when None)."""
    values: dict[str, Any] = {
        "status": status,
        "taskId": task_id,
        "from": scheduled_from.isoformat() if scheduled_from else None,
        "to": scheduled_to.isoformat() if scheduled_to else None,
        "error": error,
        "labels": labels,
        "owner": owner,
        "allUsers": True if all_users else None,
    }
    return {k: v for k, v in values.items() if v is not None}


def _backfill_body(
    scheduled_from: datetime, scheduled_to: datetime, dry_run: bool, overlap_policy: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "from": scheduled_from.isoformat(),
        "to": scheduled_to.isoformat(),
        "dryRun": dry_run,
    }
    if overlap_policy is not None:
        body["overlapPolicy"] = overlap_policy
    return body


class HttpRunsApi:
    """Dead letters, replay, backfill and bulk actions over HTTP."""

    if TYPE_CHECKING:

        async def _request(
            self,
            method: str,
            path: str,
            *,
            body: bytes | None = None,
            params: dict[str, str] | None = None,
            headers: dict[str, str] | None = None,
        ) -> bytes: ...

    async def dead_letters(
        self,
        *,
        status: str | None = None,
        task_id: str | None = None,
        scheduled_from: datetime | None = None,
        scheduled_to: datetime | None = None,
        error: str | None = None,
        labels: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        owner: str | None = None,
        all_users: bool = False,
    ) -> Page[Execution]:
        """``GET /executions``: runs across jobs (default status FAILED: the dead letters);
        ``labels`` is a label selector over their jobs (``"team=billing,env!=dev"``)."""
        fields = _filters(
            status=status,
            task_id=task_id,
            scheduled_from=scheduled_from,
            scheduled_to=scheduled_to,
            error=error,
            labels=labels,
            owner=owner,
            all_users=all_users,
        )
        params = {k: "true" if v is True else str(v) for k, v in fields.items()}
        if limit:
            params["limit"] = str(limit)
        if cursor:
            params["cursor"] = cursor
        return _runs_decoder.decode(await self._request("GET", "/executions", params=params))

    async def replay(self, job_id: str, execution_id: str, *, force: bool = False) -> Execution:
        """``POST /jobs/{id}/executions/{eid}/replay``: the new run. A run replayed already is
        an :class:`ApiError` 409 ``already_replayed`` (``problem.replay_id``: its latest replay)
        unless ``force``."""
        path = f"/jobs/{job_id}/executions/{execution_id}/replay"
        params = {"force": "true"} if force else None
        return _run_decoder.decode(await self._request("POST", path, params=params))

    async def backfill(
        self,
        job_id: str,
        scheduled_from: datetime,
        scheduled_to: datetime,
        *,
        dry_run: bool = False,
        overlap_policy: str | None = None,
    ) -> BackfillResult:
        """``POST /jobs/{id}/backfill``."""
        body = msgspec.json.encode(
            _backfill_body(scheduled_from, scheduled_to, dry_run, overlap_policy)
        )
        return _backfill_decoder.decode(
            await self._request("POST", f"/jobs/{job_id}/backfill", body=body)
        )

    async def bulk_replay(self, filters: dict[str, Any]) -> BulkAction:
        """``POST /bulk/replay`` with a filter (camelCase fields, as the HTTP body)."""
        body = msgspec.json.encode(filters)
        return _bulk_decoder.decode(await self._request("POST", "/bulk/replay", body=body))

    async def bulk_cancel(self, filters: dict[str, Any]) -> BulkAction:
        """``POST /bulk/cancel`` with a filter."""
        body = msgspec.json.encode(filters)
        return _bulk_decoder.decode(await self._request("POST", "/bulk/cancel", body=body))

    async def get_bulk(self, bulk_id: str) -> BulkAction:
        """``GET /bulk/{id}``."""
        return _bulk_decoder.decode(await self._request("GET", f"/bulk/{bulk_id}"))

    async def wait_bulk(
        self, bulk_id: str, *, timeout_seconds: float = 30.0, poll_seconds: float = 0.1
    ) -> BulkAction:
        """Poll ``GET /bulk/{id}`` until the action finished (SUCCEEDED or FAILED).

        Raises:
            TimeoutError: it had not finished after ``timeout_seconds`` seconds.
        """
        async with asyncio.timeout(timeout_seconds):
            while True:
                action = await self.get_bulk(bulk_id)
                if action.status not in OPEN_BULK_STATUSES:
                    return action
                await asyncio.sleep(poll_seconds)


class NatsRunsApi:
    """The same operations over the NATS API (:mod:`gateway.natsapi_runs`)."""

    if TYPE_CHECKING:

        async def _call(
            self, operation: str, body: Any, headers: dict[str, str] | None = None
        ) -> bytes: ...

    async def dead_letters(
        self,
        *,
        status: str | None = None,
        task_id: str | None = None,
        scheduled_from: datetime | None = None,
        scheduled_to: datetime | None = None,
        error: str | None = None,
        labels: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        owner: str | None = None,
        all_users: bool = False,
    ) -> Page[Execution]:
        """The ``runs`` operation, with the arguments of :meth:`HttpRunsApi.dead_letters`."""
        body = _filters(
            status=status,
            task_id=task_id,
            scheduled_from=scheduled_from,
            scheduled_to=scheduled_to,
            error=error,
            labels=labels,
            owner=owner,
            all_users=all_users,
        )
        if limit:
            body["limit"] = limit
        if cursor:
            body["cursor"] = cursor
        return _runs_decoder.decode(await self._call("runs", body))

    async def replay(self, job_id: str, execution_id: str, *, force: bool = False) -> Execution:
        body: dict[str, Any] = {"jobId": job_id, "executionId": execution_id}
        if force:
            body["force"] = True
        return _run_decoder.decode(await self._call("replay", body))

    async def backfill(
        self,
        job_id: str,
        scheduled_from: datetime,
        scheduled_to: datetime,
        *,
        dry_run: bool = False,
        overlap_policy: str | None = None,
    ) -> BackfillResult:
        body = {
            "id": job_id,
            **_backfill_body(scheduled_from, scheduled_to, dry_run, overlap_policy),
        }
        return _backfill_decoder.decode(await self._call("backfill", body))

    async def bulk_replay(self, filters: dict[str, Any]) -> BulkAction:
        return _bulk_decoder.decode(await self._call("bulkReplay", filters))

    async def bulk_cancel(self, filters: dict[str, Any]) -> BulkAction:
        return _bulk_decoder.decode(await self._call("bulkCancel", filters))

    async def get_bulk(self, bulk_id: str) -> BulkAction:
        return _bulk_decoder.decode(await self._call("bulk", {"id": bulk_id}))

    async def wait_bulk(
        self, bulk_id: str, *, timeout_seconds: float = 30.0, poll_seconds: float = 0.1
    ) -> BulkAction:
        """Poll the ``bulk`` operation until the action finished (as the HTTP client's)."""
        async with asyncio.timeout(timeout_seconds):
            while True:
                action = await self.get_bulk(bulk_id)
                if action.status not in OPEN_BULK_STATUSES:
                    return action
                await asyncio.sleep(poll_seconds)
