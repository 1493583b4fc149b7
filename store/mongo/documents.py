"""Documents of the MongoDB store: :func:`to_document` and :func:`from_document` are the one
place that maps ``id`` <-> ``_id`` and converts structs to documents (camelCase fields, BSON
dates, null fields absent) and back.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

import msgspec
from bson.binary import Binary

from core.model import Attempt, DeadLetter, Execution, JobSpec, Model
from store.mongo.schema import FIRST_REPLAY_OF, ID, Document

log = logging.getLogger(__name__)

M = TypeVar("M", bound=Model)


def to_document(obj: Model) -> Document:
    """The stored document of a job or an execution: camelCase fields, ``_id``, BSON dates.

    Null fields are left out (absent means null).
    """
    fields = msgspec.to_builtins(obj, builtin_types=(datetime,))
    doc: Document = {ID: fields.pop("id")}
    doc.update((k, v) for k, v in fields.items() if v is not None)
    return doc


def from_document(doc: Mapping[str, Any], kind: type[M]) -> M:
    """The struct stored as ``doc`` (unknown fields are ignored, absent ones take defaults)."""
    fields = {k: v for k, v in doc.items() if k != ID}
    fields["id"] = doc[ID]
    return msgspec.convert(fields, kind)


def execution_document(execution: Execution, *, sole_replay: bool = False) -> Document:
    """The stored document of a run dispatched by :meth:`MongoStore.dispatch`; a
    ``sole_replay`` (:class:`core.ports.ManualDispatch`) also carries ``firstReplayOf`` (the
    run it replays), the key of the unique index that lets one of concurrent sole replays of a
    run in. The field is bookkeeping: :func:`from_document` ignores it."""
    doc = to_document(execution)
    if sole_replay and execution.replay_of is not None:
        doc[FIRST_REPLAY_OF] = execution.replay_of
    return doc


def dead_letter_document(letter: DeadLetter) -> Document:
    """The stored document of a dead letter: its payload as BSON binary."""
    doc = to_document(letter)
    doc["data"] = Binary(letter.data)
    return doc


def dead_letter_from_document(doc: Mapping[str, Any]) -> DeadLetter:
    return from_document({**doc, "data": bytes(doc.get("data", b""))}, DeadLetter)


SPEC_DOCUMENT_FIELDS = {f.name: f.encode_name for f in msgspec.structs.fields(JobSpec)}
"""The job document's field of each :class:`core.model.JobSpec` attribute (a job's options are
the same fields of its document)."""


def spec_fields(spec: JobSpec) -> Document:
    """The job-document fields of ``spec``, encoded as :func:`to_document` encodes a job's."""
    return {
        name: msgspec.to_builtins(getattr(spec, attr), builtin_types=(datetime,))
        for attr, name in SPEC_DOCUMENT_FIELDS.items()
    }


def set_or_unset(fields: Mapping[str, Any]) -> Document:
    """An update that sets the non-null ``fields`` and removes the null ones."""
    update: Document = {}
    values = {k: v for k, v in fields.items() if v is not None}
    nulls = {k: "" for k, v in fields.items() if v is None}
    if values:
        update["$set"] = values
    if nulls:
        update["$unset"] = nulls
    return update


def stored_attempts(run_id: str, stored: Any) -> list[Attempt]:
    """A run's stored ``attempts``; an unreadable value (a newer version's, edited by hand) is
    logged and started anew, so it never stops the recorder."""
    if not stored:
        return []
    try:
        return msgspec.convert(stored, list[Attempt])
    except msgspec.ValidationError as e:
        log.warning("mongodb: run %s has unreadable attempts (%s); recording them anew", run_id, e)
        return []
