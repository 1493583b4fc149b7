"""The MongoDB store's part of :class:`core.notifications.NotificationStore`.

Collections (documents are a public interface, ``docs/data-model.md``):

- ``notification_defaults``: one document per user, ``_id`` = the user, the webhook's fields
  (``url``, ``on``, ``secret``) as in a job's ``notify``.
- ``notification_attempts``: one document per delivery attempt, ``_id`` =
  ``<execution id>#<attempt>``, the fields of :class:`core.notifications.NotificationAttempt`
  (camelCase, BSON dates, null fields absent); index ``notification_attempts_run``
  (``executionId``, ``attempt``).
"""

from __future__ import annotations

from typing import Protocol

import msgspec
from pymongo.asynchronous.database import AsyncDatabase

from core.notifications import NotificationAttempt
from core.notify_spec import NotifyTarget
from store.mongo.documents import from_document, to_document
from store.mongo.schema import ID, Document
from store.mongo_errors import translated

NOTIFICATION_DEFAULTS = "notification_defaults"
NOTIFICATION_ATTEMPTS = "notification_attempts"


class _Store(Protocol):
    @property
    def database(self) -> AsyncDatabase[Document]: ...


class MongoNotifications:
    """Mixed into :class:`store.mongo.MongoStore` (its database)."""

    async def get_notification_default(self: _Store, owner: str) -> NotifyTarget | None:
        with translated("read a notification default"):
            doc = await self.database[NOTIFICATION_DEFAULTS].find_one({ID: owner})
        if doc is None:
            return None
        return msgspec.convert({k: v for k, v in doc.items() if k != ID}, NotifyTarget)

    async def set_notification_default(
        self: _Store, owner: str, target: NotifyTarget | None
    ) -> None:
        with translated("write a notification default"):
            collection = self.database[NOTIFICATION_DEFAULTS]
            if target is None:
                await collection.delete_one({ID: owner})
                return
            fields = msgspec.to_builtins(target)
            unset = {name: "" for name in ("url", "on", "secret") if name not in fields}
            update: Document = {"$set": fields}
            if unset:
                update["$unset"] = unset
            await collection.update_one({ID: owner}, update, upsert=True)

    async def record_notification_attempt(self: _Store, attempt: NotificationAttempt) -> None:
        doc = to_document(attempt)
        with translated("record a notification attempt"):
            await self.database[NOTIFICATION_ATTEMPTS].update_one(
                {ID: doc.pop(ID)}, {"$set": doc}, upsert=True
            )

    async def notification_attempts(self: _Store, execution_id: str) -> list[NotificationAttempt]:
        with translated("read notification attempts"):
            docs = (
                await self.database[NOTIFICATION_ATTEMPTS]
                .find({"executionId": execution_id})
                .sort([("attempt", 1)])
                .to_list()
            )
        return [from_document(d, NotificationAttempt) for d in docs]
