"""The MongoDB store's :class:`core.ports.RunStore` part: runs across jobs (dead letters), bulk
actions with their leases, and audit records of changes that are not a job's.

A mixin of :class:`store.mongo.store.MongoStore`. Documents of ``bulk_actions`` are
:class:`core.bulk.BulkAction` (``docs/data-model.md``); its indexes are declared with the
others (:data:`store.mongo.schema.INDEXES`).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import msgspec
from pymongo import ASCENDING, ReturnDocument
from pymongo.errors import DuplicateKeyError

from core.audit import AuditEntry, AuditRecord, audit_record
from core.bulk import OPEN_BULK_STATUSES, BulkAction, BulkStatus, RunQuery
from core.errors import Conflict, FieldError, InvalidRequest
from core.labels import Selector
from core.model import Execution, Page
from store.mongo.documents import from_document, set_or_unset, to_document
from store.mongo.operations import NEWEST_RUNS_FIRST, labels_filter, older_than
from store.mongo.schema import BULK_ACTIONS, EXECUTIONS, ID, JOBS, REPLAYS, Document
from store.mongo_errors import translated
from store.pages import Keyset

if TYPE_CHECKING:
    from pymongo.asynchronous.collection import AsyncCollection
    from pymongo.asynchronous.database import AsyncDatabase

_OPEN = [s.value for s in OPEN_BULK_STATUSES]
MAX_LABELLED_JOBS = 1000
"""Most jobs a ``labels`` filter of ``list_runs`` may select: the runs do not carry their job's
labels, so the matching job ids are looked up first (the ``labelTerms`` index) and the runs are
then filtered by ``jobId: {$in: ...}``; a selector matching more is refused (422 on ``labels``:
narrow it, e.g. with ``taskId`` or a further requirement)."""


def runs_query(
    owner: str | None, query: RunQuery, page: Keyset, job_ids: Sequence[str] | None = None
) -> Document:
    """The filter of ``list_runs``; sort with :data:`NEWEST_RUNS_FIRST`. Served by
    ``executions_[owner_]status[_task]_scheduled…``; the error text (a case-insensitive
    ``$regex`` of the escaped text) and ``job_ids`` (the jobs a ``labels`` selector matched,
    :data:`MAX_LABELLED_JOBS` at most) are filtered on the scanned runs."""
    where: Document = {} if owner is None else {"owner": owner}
    if job_ids is not None:
        where["jobId"] = {"$in": list(job_ids)}
    where["status"] = query.status.value
    if query.task_id is not None:
        where["taskId"] = query.task_id
    scheduled: Document = {}
    if query.scheduled_from is not None:
        scheduled["$gte"] = query.scheduled_from
    if query.scheduled_to is not None:
        scheduled["$lt"] = query.scheduled_to
    if scheduled:
        where["scheduledFor"] = scheduled
    if query.error is not None:
        where["error"] = {"$regex": re.escape(query.error), "$options": "i"}
    return older_than(where, "scheduledFor", page.after)


def _bulk_update(action: BulkAction) -> Document:
    fields = msgspec.to_builtins(action, builtin_types=(datetime,))
    fields.pop("id")
    return set_or_unset(fields)


class MongoRuns:
    """:class:`core.ports.RunStore` for :class:`store.mongo.store.MongoStore`."""

    if TYPE_CHECKING:

        @property
        def database(self) -> AsyncDatabase[Document]: ...

        async def _append_audit(self, record: AuditRecord) -> None: ...

    @property
    def _bulk(self) -> AsyncCollection[Document]:
        return self.database[BULK_ACTIONS]

    async def list_runs(
        self, owner: str | None, query: RunQuery, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        page = Keyset.of(limit, cursor)
        job_ids = None if not query.labels else await self._labelled_jobs(owner, query.labels)
        if job_ids is not None and not job_ids:
            return Page(items=[], next_cursor=None)
        where = runs_query(owner, query, page, job_ids)
        with translated("list runs"):
            docs = (
                await self.database[EXECUTIONS]
                .find(where)
                .sort(NEWEST_RUNS_FIRST)
                .limit(page.fetch)
                .to_list()
            )
        return page.page(
            docs, lambda d: from_document(d, Execution), lambda e: (e.scheduled_for, e.id)
        )

    async def _labelled_jobs(self, owner: str | None, selector: Selector) -> list[str]:
        """The ids of ``owner``'s (None: anyone's) jobs matching ``selector``, through the
        ``labelTerms`` index.

        Raises:
            InvalidRequest: on ``labels``, when more than :data:`MAX_LABELLED_JOBS` match.
        """
        where: Document = labels_filter(selector)
        if owner is not None:
            where["owner"] = owner
        with translated("list labelled jobs"):
            docs = (
                await self.database[JOBS]
                .find(where, {ID: 1})
                .limit(MAX_LABELLED_JOBS + 1)
                .to_list()
            )
        if len(docs) > MAX_LABELLED_JOBS:
            raise InvalidRequest(
                FieldError(
                    "labels",
                    f"selects more than {MAX_LABELLED_JOBS} jobs; narrow it "
                    "(a further requirement, or taskId)",
                )
            )
        return [str(d[ID]) for d in docs]

    async def replays_of(self, execution_ids: Collection[str]) -> dict[str, list[str]]:
        ids = list(dict.fromkeys(execution_ids))
        if not ids:
            return {}
        with translated("list replays"):
            docs = (
                await self.database[EXECUTIONS]
                .find({"replayOf": {**REPLAYS["replayOf"], "$in": ids}}, {ID: 1, "replayOf": 1})
                .to_list()
            )
        out: dict[str, list[str]] = {}
        for doc in sorted(docs, key=lambda d: (str(d["replayOf"]), str(d[ID]))):
            out.setdefault(str(doc["replayOf"]), []).append(str(doc[ID]))
        return out

    async def create_bulk(self, action: BulkAction, *, audit: AuditEntry | None = None) -> None:
        try:
            with translated("create bulk action", passing=(DuplicateKeyError,)):
                await self._bulk.insert_one(to_document(action))
        except DuplicateKeyError:
            raise Conflict(f"bulk action {action.id} exists") from None
        if audit is not None:
            await self._append_audit(audit_record(audit, None, None))

    async def get_bulk(self, bulk_id: str) -> BulkAction | None:
        with translated("get bulk action"):
            doc = await self._bulk.find_one({ID: bulk_id})
        return None if doc is None else from_document(doc, BulkAction)

    async def claim_bulk(
        self, holder: str, *, now: datetime, lease_seconds: float
    ) -> BulkAction | None:
        """See :meth:`core.ports.RunStore.claim_bulk`: the longest-expired candidate, then a
        compare-and-set on its id, status and expired lease (a claimer that loses the race
        gets None and tries again at its next wake-up)."""
        free: Document = {"status": {"$in": _OPEN}, "leaseExpiresAt": {"$lte": now}}
        with translated("find a bulk action to claim"):
            found = (
                await self._bulk.find(free).sort([("leaseExpiresAt", ASCENDING)]).limit(1).to_list()
            )
        if not found:
            return None
        update: dict[str, Any] = {
            "$set": {
                "status": BulkStatus.RUNNING.value,
                "leaseOwner": holder,
                "leaseExpiresAt": now + timedelta(seconds=lease_seconds),
                "updatedAt": now,
            }
        }
        with translated("claim bulk action"):
            doc = await self._bulk.find_one_and_update(
                {ID: found[0][ID], **free}, update, return_document=ReturnDocument.AFTER
            )
        return None if doc is None else from_document(doc, BulkAction)

    async def save_bulk(self, action: BulkAction, *, holder: str) -> bool:
        with translated("save bulk action"):
            result = await self._bulk.update_one(
                {ID: action.id, "leaseOwner": holder}, _bulk_update(action)
            )
        return result.matched_count == 1

    async def record_audit(self, entries: Sequence[AuditEntry]) -> None:
        for entry in entries:
            await self._append_audit(audit_record(entry, None, None))
