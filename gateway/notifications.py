"""The gateway's side of run notifications (:mod:`core.notifications`), shared by HTTP and the
NATS API: the caller's default webhook, the delivery attempts of a run, and the redaction that
keeps every webhook secret write-only (:func:`public`, applied to every answer)."""

from __future__ import annotations

from typing import Any

import msgspec

from core import notifications
from core.access import Principal
from core.model import Job, Page
from core.notifications import (
    NotificationAttemptList,
    NotificationDefault,
    NotificationDefaultIn,
)
from core.ports import JobStore
from gateway.service import JobService


def public(obj: Any) -> Any:
    """``obj`` as the API may show it: a job (or a page of jobs) with its webhook's secret
    replaced by ``hasSecret`` (:func:`core.notifications.redacted`); anything else as it is."""
    if isinstance(obj, Job):
        if obj.notify is None:
            return obj
        return msgspec.structs.replace(obj, notify=notifications.redacted(obj.notify))
    if isinstance(obj, Page) and obj.items and isinstance(obj.items[0], Job):
        return msgspec.structs.replace(obj, items=[public(j) for j in obj.items])
    return obj


async def get_default(store: JobStore, who: Principal) -> NotificationDefault:
    """The caller's default webhook (secret redacted).

    Raises:
        Forbidden: the token cannot read.
    """
    who.require_read()
    target = await store.get_notification_default(who.user)
    return NotificationDefault(notify=notifications.redacted(target))


async def put_default(
    store: JobStore, who: Principal, body: NotificationDefaultIn
) -> NotificationDefault:
    """Set (``notify: null``: remove) the caller's default webhook, used by their jobs without
    a ``notify`` of their own; a new default without ``secret`` keeps the current secret.

    Raises:
        Forbidden: a read-only token. InvalidRequest: naming ``notify.url``, ``notify.on`` or
            ``notify.secret``.
    """
    who.require_write()
    current = await store.get_notification_default(who.user) if body.notify else None
    target = notifications.resolve(body.notify, current=current)
    await store.set_notification_default(who.user, target)
    return NotificationDefault(notify=notifications.redacted(target))


async def list_attempts(
    service: JobService, who: Principal, job_id: str, execution_id: str
) -> NotificationAttemptList:
    """The delivery attempts of one run's notification (tenant-scoped as the job is).

    Raises:
        JobNotFound: no such job for the caller. ExecutionNotFound: no such run of that job.
    """
    await service.get_execution(who, job_id, execution_id)
    return NotificationAttemptList(items=await service.store.notification_attempts(execution_id))
