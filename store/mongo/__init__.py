"""MongoDB store on PyMongo's async API (``pymongo.AsyncMongoClient``).

Selected by ``JOBSCHED_STORE_URL=mongodb://…`` (or ``mongodb+srv://…``); the database is the URL's
path, ``jobsched`` when it has none. Motor reached its end of life in May 2026; PyMongo's native
async API is its official successor, so this adapter uses it directly.

Two collections, one document per job and one per run (execution), with the msgspec schema's
camelCase field names and BSON dates (UTC, milliseconds). :func:`to_document` and
:func:`from_document` are the one place that maps ``id`` ↔ ``_id`` and converts documents. A field
whose value is null is absent from the stored document: that keeps ``$min`` ("keep the first
``startedAt``") correct, since BSON orders null below every date.

Durability and correctness without multi-document transactions:

- Every write is acknowledged by a majority of the replica set and journaled
  (``WriteConcern(w="majority", j=True)``); retryable writes and reads are on.
- The scheduler's advance of a job is a compare-and-set on ``nextRunAt``; execution transitions
  are conditional on ``stateRank`` so a late or duplicate event never moves a run backwards; the
  job summary is conditional on the run it follows (``lastRunScheduledFor``,
  ``lastRunStateRank``) and on ``nextRunAt`` (which decides its status).
- :meth:`MongoStore.dispatch` inserts the executions first (a duplicate key means it existed),
  then compare-and-sets the jobs, so a crash in between leaves a QUEUED record rather than a lost
  run; an execution it created for a job it could not advance is deleted again.
- An idempotency key is unique per owner through a partial unique index: of two concurrent
  creates with one key, the server lets one insert through, and the other reads the winner.
- :meth:`MongoStore.update_job` (pause, resume, cancel, PATCH) is one ``findAndModify`` with the
  allowed statuses in its filter, so no read-modify-write can lose a concurrent change.
- Driver errors never leave this module: connection loss, timeouts, elections and write-concern
  failures become :class:`core.errors.StoreUnavailable` (retried by the actors, 503 at the
  gateway); a duplicate job id becomes :class:`core.errors.Conflict`, a reused idempotency key
  :class:`core.ports.IdempotencyKeyReused`.

Every query this module sends is served by an index of :data:`INDEXES` (or ``_id``).

Four modules: :mod:`~store.mongo.schema` (collections, indexes), :mod:`~store.mongo.documents`
(the mapping of structs to documents), :mod:`~store.mongo.operations` (the filters and updates
it sends, pure) and :mod:`~store.mongo.store` (the store).
"""

from store.mongo.documents import from_document, spec_fields, to_document
from store.mongo.operations import MAX_SCANS_TO_EXPLODE, key_query
from store.mongo.schema import (
    AUDIT,
    DEAD_LETTERS,
    EXECUTIONS,
    ID,
    IDEMPOTENCY_INDEX,
    INDEXES,
    JOBS,
    REQUEST_HASH,
    database_name,
)
from store.mongo.store import MongoStore

__all__ = [
    "AUDIT",
    "DEAD_LETTERS",
    "EXECUTIONS",
    "ID",
    "IDEMPOTENCY_INDEX",
    "INDEXES",
    "JOBS",
    "MAX_SCANS_TO_EXPLODE",
    "REQUEST_HASH",
    "MongoStore",
    "database_name",
    "from_document",
    "key_query",
    "spec_fields",
    "to_document",
]
