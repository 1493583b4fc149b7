"""Embedded store on SQLite (aiosqlite): the default of ``jobsched dev`` and single-node setups.

One database file in the data directory, in WAL mode (readers never block the writer) with
``synchronous=FULL`` so that a committed job survives a power loss. Several processes of one host
may share the file; writes are serialized by SQLite's lock (``busy_timeout``) and, inside a
process, by an asyncio lock around each write transaction.

Mutable job fields are columns so that the scheduler's compare-and-set and the recorder's
conditional transitions are single SQL statements; the immutable part of a job (task,
schedule, parameters, options) is one msgspec-JSON column.

Three modules: :mod:`~store.sqlite.schema` (tables, migrations, statements),
:mod:`~store.sqlite.rows` (row mapping) and :mod:`~store.sqlite.store` (the store).
"""

from store.sqlite.rows import job_row
from store.sqlite.schema import JOB_COLUMNS, JOB_INSERT, MIGRATIONS, SCHEMA
from store.sqlite.store import SqliteStore, path_from_url

__all__ = [
    "JOB_COLUMNS",
    "JOB_INSERT",
    "MIGRATIONS",
    "SCHEMA",
    "SqliteStore",
    "job_row",
    "path_from_url",
]
