"""MongoDB-specific behaviour of ``store.mongo.MongoStore``, on the in-process fake.

What these tests prove: the stored documents' shape (camelCase, ``_id``, BSON dates, nested
schedules), the declared indexes and that every query the store sends has the shape of one of
them, the translation of driver errors, that dispatch without transactions leaves no orphan and
loses no run, the conditional status transitions and job summaries, and — by running the same
random operations on this store and on the SQLite reference store — that both give the same
answers.

What the fake CANNOT prove (a real MongoDB replica set is needed; set
``JOBSCHED_TEST_MONGODB_URL`` to run the real-server tests here and the contract suite on it):
write concerns and journaling (only that the store asks for majority/journaled writes), index use
by the query planner (no collection scans is checked by comparing filters and sorts with the index
keys, not with ``explain``), transactions and atomicity across documents, real concurrency and
retryable writes, which server versions support the operators used, and failover (errors are
injected, never produced by an election).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest
from bson.errors import InvalidDocument
from pymongo import AsyncMongoClient, IndexModel, UpdateOne
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    DocumentTooLarge,
    DuplicateKeyError,
    ExecutionTimeout,
    NetworkTimeout,
    NotPrimaryError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
    WriteConcernError,
)
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

from core.access import Principal, Role
from core.audit import AuditAction, AuditQuery, audit_entry
from core.bulk import BulkAction, BulkFilter, BulkKind, RunQuery
from core.errors import (
    ConfigError,
    Conflict,
    JobNotFound,
    NameTaken,
    StoreRejected,
    StoreUnavailable,
)
from core.labels import parse_selector
from core.model import (
    TERMINAL_RANK,
    CronSchedule,
    DeadLetter,
    Execution,
    ExecutionStatus,
    ImmediateSchedule,
    IntervalSchedule,
    Job,
    JobSpec,
    JobStatus,
    MisfirePolicy,
    Missed,
    OnceSchedule,
    OverlapPolicy,
    Page,
    RunTrigger,
    StatusEvent,
    spec_values,
)
from core.notify_spec import NotifyTarget
from core.ports import (
    UNCHANGED,
    Dispatch,
    DispatchOutcome,
    DueJob,
    IdempotencyKeyReused,
    JobChange,
    JobQuery,
    JobStatusConflict,
    ManualDispatch,
    PruneTarget,
)
from core.quotas import Rate, TokenRequest
from core.runs import queued_run, replay_run, run_event
from store.mongo import (
    AUDIT,
    DEAD_LETTERS,
    EXECUTIONS,
    ID,
    IDEMPOTENCY_INDEX,
    INDEXES,
    JOBS,
    MAX_SCANS_TO_EXPLODE,
    REQUEST_HASH,
    MongoStore,
    database_name,
    from_document,
    key_query,
    spec_fields,
    to_document,
)
from store.mongo.operations import labels_filter
from store.mongo.schema import FIRST_REPLAY_INDEX, FIRST_REPLAY_OF
from store.mongo_queries import (
    failures_per_task_per_day,
    running_jobs,
    runs_by_status_per_hour,
    scheduling_delay_per_hour,
)
from store.pages import encode_cursor
from store.sqlite import SqliteStore
from tests.store.backends import MONGODB_URL_ENV, real_mongo_store
from tests.store.mongo_fake import (
    FakeAsyncCollection,
    FakeAsyncMongoClient,
    Query,
    partial_filter_error,
)

T0 = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
MIN = timedelta(minutes=1)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


@pytest.fixture
def fake() -> FakeAsyncMongoClient:
    return FakeAsyncMongoClient()


@pytest.fixture
async def store(fake: FakeAsyncMongoClient) -> AsyncIterator[MongoStore]:
    s = MongoStore("mongodb://fake.invalid/jobsched", client=cast("AsyncMongoClient[Any]", fake))
    await s.open()
    yield s
    await s.close()


def job(
    job_id: str = "j1",
    *,
    owner: str = "alice",
    schedule: Any = None,
    next_run_at: datetime | None = T0,
    created_at: datetime = T0,
    partition: int = 1,
    **fields: Any,
) -> Job:
    return Job(
        id=job_id,
        owner=owner,
        task_id="generate_report",
        schedule=schedule or IntervalSchedule(every_seconds=60.0),
        parameters={"reportType": "sales", "region": "ACME-42"},
        partition=partition,
        created_at=created_at,
        updated_at=created_at,
        next_run_at=next_run_at,
        **fields,
    )


def run_of(j: Job, scheduled_for: datetime, *, now: datetime | None = None) -> Execution:
    return queued_run(j, scheduled_for, now or scheduled_for, "scheduler-1", RunTrigger.SCHEDULE)


def dispatch_of(
    j: Job, scheduled_for: datetime, expected: datetime, nxt: datetime | None
) -> Dispatch:
    return Dispatch(run_of(j, scheduled_for), expected_next_run_at=expected, next_run_at=nxt)


def event(
    ex: Execution,
    status: ExecutionStatus,
    attempt: int = 1,
    *,
    when: datetime | None = None,
    error: str | None = None,
    result: Any = None,
) -> StatusEvent:
    when = when or ex.scheduled_for + timedelta(seconds=attempt)
    terminal = status in (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED)
    return run_event(
        ex,
        status,
        attempt=attempt,
        at=when,
        published_at=ex.scheduled_for,
        started_at=None if status == ExecutionStatus.QUEUED else ex.scheduled_for + 2 * MIN / 60,
        finished_at=when if terminal else None,
        worker_id="w1",
        error=error,
        result=result,
    )


async def raw(store: MongoStore, collection: str, doc_id: str) -> dict[str, Any]:
    doc = await store.database[collection].find_one({ID: doc_id})
    assert doc is not None, doc_id
    return doc


# --- documents ---------------------------------------------------------------------------------


async def test_documents_are_camel_case_with_id_and_bson_dates(store: MongoStore) -> None:
    once = job("once-1", schedule=OnceSchedule(execute_at=at(5)), next_run_at=at(5))
    cron = job("cron-1", schedule=CronSchedule(expression="0 8 * * 1-5", timezone="Europe/Berlin"))
    await store.create_job(once)
    await store.create_job(cron)
    d = dispatch_of(cron, T0, T0, at(60 * 24))
    assert await store.dispatch([d]) == [DispatchOutcome(created=True, advanced=True)]
    await store.apply_events([event(d.execution, ExecutionStatus.RUNNING)])

    doc = await raw(store, JOBS, "once-1")
    assert set(doc) == {"_id"} | {
        f.encode_name
        for f in msgspec.structs.fields(Job)
        if f.name != "id" and getattr(once, f.name) is not None
    }
    assert {"taskId", "nextRunAt", "createdAt", "maxAttempts", "timeoutSeconds"} <= set(doc)
    assert doc["schedule"] == {"type": "once", "executeAt": at(5)}
    assert doc["parameters"] == {"reportType": "sales", "region": "ACME-42"}
    for name in ("createdAt", "updatedAt", "nextRunAt"):
        value = doc[name]
        assert isinstance(value, datetime) and value.tzinfo is not None
        assert value.utcoffset() == timedelta(0) and value.microsecond % 1000 == 0

    doc = await raw(store, JOBS, "cron-1")
    assert doc["schedule"] == to_document(cron)["schedule"]  # nested, with its type tag
    assert doc["schedule"]["type"] == "cron" and doc["schedule"]["timezone"] == "Europe/Berlin"
    assert doc["status"] == "RUNNING" and doc["lastExecutionId"] == d.execution.id
    assert doc["lastScheduledFor"] == T0 and doc["runCount"] == 1
    assert isinstance(doc["lastRunAt"], datetime)

    ex = await raw(store, EXECUTIONS, d.execution.id)
    assert ex["_id"] == "cron-1:2026-06-01T08:00:00.000Z"
    assert {"jobId", "taskId", "scheduledFor", "stateRank", "startedAt", "publishedAt", "workerId",
            "maxAttempts", "dispatchedBy", "updatedAt", "createdAt"} <= set(ex)  # fmt: skip
    assert ex["status"] == "RUNNING" and ex["stateRank"] == 2
    assert isinstance(ex["scheduledFor"], datetime) and isinstance(ex["startedAt"], datetime)
    for d_ in (await raw(store, JOBS, "cron-1"), ex):
        assert "id" not in d_
        assert all("_" not in k for k in d_ if k != "_id"), sorted(d_)
        assert None not in d_.values()  # absent means null


def test_document_mapping_round_trips() -> None:
    j = job(schedule=OnceSchedule(execute_at=at(3)), next_run_at=None)
    assert from_document(to_document(j), Job) == j
    ex = Execution(**{**_fields(run_of(j, T0)), "result": {"rows": [1, 2.5, "x"]}, "error": "e"})
    assert from_document(to_document(ex), Execution) == ex
    assert from_document({**to_document(j), "futureField": 1}, Job) == j  # rolling upgrades


def _fields(ex: Execution) -> dict[str, Any]:
    return {f: getattr(ex, f) for f in ex.__struct_fields__}


CONTROL_SCHEDULE = CronSchedule(
    expression="0 8 * * 1-5",
    timezone="Europe/Berlin",
    gap="skip",
    fold="both",
    start_at=at(1),
    end_at=at(90),
    jitter_seconds=2.5,
)
CONTROL_SPEC = JobSpec(
    task_id="generate_report",
    schedule=CONTROL_SCHEDULE,
    parameters={"reportType": "stock"},
    queue="reports",
    max_attempts=4,
    timeout_seconds=90.0,
    misfire_policy=MisfirePolicy.SKIP,
    misfire_grace_seconds=5.0,
    max_catch_up=3,
    overlap_policy=OverlapPolicy.REPLACE,
    history_limit=25,
    history_max_age_seconds=3600.0,
    notify=NotifyTarget(url="https://hooks.example/", on=["failure", "success"]),
)


async def test_a_job_stores_its_policies_key_and_request_hash(store: MongoStore) -> None:
    j = job(
        "keyed",
        schedule=CONTROL_SCHEDULE,
        misfire_policy=MisfirePolicy.SKIP,
        misfire_grace_seconds=5.0,
        max_catch_up=3,
        overlap_policy=OverlapPolicy.REPLACE,
        idempotency_key="key-1",
    )
    await store.create_job(j, request_hash="sha-1")
    await store.create_job(job("plain"))

    doc = await raw(store, JOBS, "keyed")
    assert (doc["idempotencyKey"], doc[REQUEST_HASH]) == ("key-1", "sha-1")
    assert (doc["misfirePolicy"], doc["misfireGraceSeconds"], doc["maxCatchUp"]) == ("skip", 5, 3)
    assert doc["overlapPolicy"] == "replace"
    assert doc["schedule"] == {
        "type": "cron",
        "expression": "0 8 * * 1-5",
        "timezone": "Europe/Berlin",
        "gap": "skip",
        "fold": "both",
        "startAt": at(1),
        "endAt": at(90),
        "jitterSeconds": 2.5,
    }
    assert await store.get_job("alice", "keyed") == j  # the request hash is not part of a Job
    plain = await raw(store, JOBS, "plain")
    assert "idempotencyKey" not in plain and REQUEST_HASH not in plain


async def test_a_skipped_record_stores_its_reason_trigger_jitter_and_missed_times(
    store: MongoStore,
) -> None:
    j = job()
    await store.create_job(j)
    record = Execution(
        **{
            **_fields(run_of(j, T0, now=at(2))),
            "status": ExecutionStatus.SKIPPED,
            "state_rank": TERMINAL_RANK,
            "trigger": RunTrigger.CATCH_UP,
            "jitter_ms": 1500,
            "skip_reason": "misfire: missed the grace period",
            "missed": Missed(count=4, first=at(-3), last=T0, policy="skip"),
        }
    )
    await store.dispatch([Dispatch(record, expected_next_run_at=T0, next_run_at=at(1))])

    doc = await raw(store, EXECUTIONS, record.id)
    assert (doc["status"], doc["stateRank"]) == ("SKIPPED", TERMINAL_RANK)
    assert (doc["trigger"], doc["jitterMs"], doc["skipReason"]) == (
        "catchUp",
        1500,
        "misfire: missed the grace period",
    )
    assert doc["missed"] == {"count": 4, "first": at(-3), "last": T0, "policy": "skip"}
    assert await store.get_execution(record.id) == record


async def test_a_run_stores_its_attempts_as_an_array_of_documents(store: MongoStore) -> None:
    """``attempts``: one document per attempt, oldest first, camelCase, BSON dates, every field
    present (null included), as docs/data-model.md describes them for dashboards."""
    j = job()
    await store.create_job(j)
    d = dispatch_of(j, T0, T0, at(1))
    await store.dispatch([d])
    assert (await raw(store, EXECUTIONS, d.execution.id))["attempts"] == []

    await store.apply_events(
        [
            event(d.execution, ExecutionStatus.RUNNING, 1),
            event(d.execution, ExecutionStatus.RETRYING, 1, error="ValueError: boom"),
            event(d.execution, ExecutionStatus.RUNNING, 2),
        ]
    )

    doc = await raw(store, EXECUTIONS, d.execution.id)
    started = T0 + 2 * MIN / 60
    assert doc["attempts"] == [
        {"attempt": 1, "startedAt": started, "workerId": "w1", "finishedAt": T0 + 1 * MIN / 60,
         "outcome": "RETRYING", "error": "ValueError: boom", "redelivered": False},
        {"attempt": 2, "startedAt": started, "workerId": "w1", "finishedAt": None,
         "outcome": None, "error": None, "redelivered": False},
    ]  # fmt: skip
    stored = await store.get_execution(d.execution.id)
    assert stored is not None and [a.attempt for a in stored.attempts] == [1, 2]


async def test_a_replay_without_force_carries_first_replay_of_and_reads_back_as_stored(
    store: MongoStore, fake: FakeAsyncMongoClient
) -> None:
    """``firstReplayOf`` (docs/data-model.md): on a sole replay only; gateways on other stores
    (other processes) sharing the database race on its unique index."""
    j = job()
    await store.create_job(j)
    original = run_of(j, T0)
    await store.insert_execution(original)
    forced = replay_run(j, original, at(1), nonce="00000001")
    await store.dispatch([ManualDispatch(forced)])
    assert FIRST_REPLAY_OF not in await raw(store, EXECUTIONS, forced.id)
    other = run_of(j, at(2))
    await store.insert_execution(other)
    gateways = [store]
    for _ in range(3):
        gw = MongoStore(
            "mongodb://fake.invalid/jobsched", client=cast("AsyncMongoClient[Any]", fake)
        )
        await gw.open()  # its indexes exist: creating them again changes nothing
        gateways.append(gw)
    racers = [replay_run(j, other, at(3), nonce=f"{i:08x}") for i in range(2 * len(gateways))]
    answers = await asyncio.gather(
        *(
            gateways[i % len(gateways)].dispatch([ManualDispatch(r, sole_replay=True)])
            for i, r in enumerate(racers)
        )
    )
    [winner] = [r for r, [o] in zip(racers, answers, strict=True) if o.created]
    assert {o.replayed_as for [o] in answers if not o.created} == {winner.id}
    doc = await raw(store, EXECUTIONS, winner.id)
    assert (doc["replayOf"], doc[FIRST_REPLAY_OF]) == (other.id, other.id)
    assert await store.get_execution(winner.id) == winner
    for gw in gateways[1:]:
        await gw.close()


async def test_a_sole_replay_beaten_by_a_replay_gone_when_read_back_is_unavailable(
    store: MongoStore,
) -> None:
    """The index's holder is no replay of the run when the loser reads the run's replays (its
    job deleted meanwhile; here: edited by hand): the loser cannot name it, and says retry."""
    j = job()
    await store.create_job(j)
    original = run_of(j, T0)
    await store.insert_execution(original)
    await store.database[EXECUTIONS].insert_one({ID: "stray", FIRST_REPLAY_OF: original.id})
    replay = replay_run(j, original, at(1), nonce="00000001")
    with pytest.raises(StoreUnavailable, match="retry"):
        await store.dispatch([ManualDispatch(replay, sole_replay=True)])
    assert await store.get_execution(replay.id) is None


async def test_update_job_sets_the_spec_as_create_stores_it_and_unsets_next_run_at(
    store: MongoStore,
) -> None:
    j = job(next_run_at=at(5), idempotency_key="key-1")
    await store.create_job(j, request_hash="sha-1")
    change = JobChange("changed", status=JobStatus.PAUSED, next_run_at=None, spec=CONTROL_SPEC)

    await store.update_job("alice", j.id, change, now=at(1))

    doc = await raw(store, JOBS, j.id)
    fields = spec_fields(CONTROL_SPEC)
    assert {k: doc.get(k) for k in fields} == fields  # absent: null
    as_created = msgspec.structs.replace(job("other"), **spec_values(CONTROL_SPEC))
    set_fields = {k: v for k, v in fields.items() if v is not None}
    assert set_fields == {k: v for k, v in to_document(as_created).items() if k in fields}
    assert "nextRunAt" not in doc
    assert (doc["historyLimit"], doc["historyMaxAgeSeconds"]) == (25, 3600.0)
    assert (doc["status"], doc["updatedAt"], doc["createdAt"]) == ("PAUSED", at(1), T0)
    back_to_defaults = JobChange(
        "changed",
        spec=msgspec.structs.replace(
            CONTROL_SPEC, history_limit=None, history_max_age_seconds=None
        ),
    )
    await store.update_job("alice", j.id, back_to_defaults, now=at(2))
    doc = await raw(store, JOBS, j.id)
    assert "historyLimit" not in doc and "historyMaxAgeSeconds" not in doc  # null is absent
    assert (doc["idempotencyKey"], doc[REQUEST_HASH]) == ("key-1", "sha-1")


def test_database_name_comes_from_the_url_path() -> None:
    assert database_name("mongodb://db.example:27017/prod?replicaSet=rs0") == "prod"
    assert database_name("mongodb://a:1,b:2,c:3/?replicaSet=rs0") == "jobsched"
    assert database_name("mongodb+srv://cluster.example") == "jobsched"
    assert database_name("mongodb://h/my%2Ddb") == "my-db"


def test_client_options_durable_fast_failing_and_url_wins() -> None:
    s = MongoStore("mongodb://h/x", timeout_seconds=2.5)
    opts = s._client_options()
    assert opts["serverSelectionTimeoutMS"] == 2500 and opts["connectTimeoutMS"] == 2500
    assert opts["retryWrites"] is True and opts["retryReads"] is True
    assert opts["tz_aware"] is True and opts["tzinfo"] is UTC
    opts = MongoStore(
        "mongodb://h/x?serverSelectionTimeoutMS=100", timeout_seconds=2.5
    )._client_options()
    assert "serverSelectionTimeoutMS" not in opts


async def test_every_write_asks_for_majority_journaled(store: MongoStore) -> None:
    assert store.database.write_concern == WriteConcern(w="majority", j=True)


# --- indexes -----------------------------------------------------------------------------------


async def test_declared_indexes_exist(store: MongoStore) -> None:
    assert len({i.name for i in INDEXES}) == len(INDEXES)
    for collection in (JOBS, EXECUTIONS, DEAD_LETTERS):
        info = await store.database[collection].index_information()
        declared = {i.name: i for i in INDEXES if i.collection == collection}
        assert set(info) == {"_id_", *declared}
        for name, spec in declared.items():
            assert [tuple(k) for k in info[name]["key"]] == list(spec.keys), name
            assert info[name].get("partialFilterExpression") == spec.partial, name
            assert bool(info[name].get("unique")) == spec.unique, name
    assert INDEXES_BY_NAME["jobs_due"].partial == {"nextRunAt": {"$type": "date"}}
    assert INDEXES_BY_NAME["executions_open"].partial == {"stateRank": {"$lt": 1_000_000}}
    keyed = INDEXES_BY_NAME[IDEMPOTENCY_INDEX]
    assert keyed.unique and keyed.partial == {"idempotencyKey": {"$type": "string"}}
    assert [k for k, _ in keyed.keys] == ["owner", "idempotencyKey"]


async def test_open_is_idempotent(store: MongoStore) -> None:
    await store.open()
    await MongoStore("mongodb://fake.invalid/jobsched", client=_client_of(store)).open()


def _client_of(store: MongoStore) -> AsyncMongoClient[Any]:
    assert store._client is not None
    return store._client


async def test_open_builds_the_key_index_over_jobs_created_before_it(store: MongoStore) -> None:
    """An upgrade: jobs without keys exist when ``open`` first creates the unique key index."""
    for i in range(3):
        await store.create_job(job(f"old-{i}"))
    cast("FakeAsyncCollection", store.database[JOBS])._c.drop_index(IDEMPOTENCY_INDEX)

    upgraded = MongoStore("mongodb://fake.invalid/jobsched", client=_client_of(store))
    await upgraded.open()

    assert IDEMPOTENCY_INDEX in await store.database[JOBS].index_information()
    await upgraded.create_job(job("new-1", idempotency_key="k"))
    with pytest.raises(IdempotencyKeyReused):
        await upgraded.create_job(job("new-2", idempotency_key="k"))


REFUSED_PARTIAL_FILTERS = [
    {"nextRunAt": {"$ne": None}},
    {"nextRunAt": {"$exists": False}},
    {"status": {"$nin": ["FAILED"]}},
    {"status": {"$not": {"$eq": "FAILED"}}},
    {"status": {"$regex": "^F"}},
    {"$nor": [{"status": "FAILED"}]},
    {"$expr": {"$eq": ["$status", "FAILED"]}},
    {"$and": [{"$or": [{"$and": [{"$or": [{"a": 1}]}]}]}]},  # five levels deep
]
ACCEPTED_PARTIAL_FILTERS = [
    {"nextRunAt": {"$type": "date"}},
    {"nextRunAt": {"$exists": True}},
    {"stateRank": {"$lt": 1_000_000}},
    {"status": {"$in": ["QUEUED", "RUNNING"]}},
    {"$or": [{"a": 1}, {"b": {"$gt": 2}}]},
    {"a": None, "b": {"$gte": 1, "$lt": 5}},
]


@pytest.mark.parametrize("partial", REFUSED_PARTIAL_FILTERS, ids=str)
async def test_the_fake_refuses_partial_filters_the_server_refuses(
    store: MongoStore, partial: dict[str, Any]
) -> None:
    """mongomock builds any partial index; MongoDB refuses these with CannotCreateIndex (67), so
    an index using one would pass CI and stop every start in production."""
    model = IndexModel([("x", 1)], name="probe", partialFilterExpression=partial)
    with pytest.raises(OperationFailure) as info:
        await store.database[JOBS].create_indexes([model])
    assert info.value.code == 67


@pytest.mark.parametrize("partial", ACCEPTED_PARTIAL_FILTERS, ids=str)
async def test_the_fake_accepts_partial_filters_the_server_accepts(
    store: MongoStore, partial: dict[str, Any]
) -> None:
    model = IndexModel([("x", 1)], name="probe", partialFilterExpression=partial)
    assert await store.database[JOBS].create_indexes([model]) == ["probe"]


def test_every_declared_partial_filter_is_one_the_server_accepts() -> None:
    assert [i.name for i in INDEXES if i.partial and partial_filter_error(i.partial)] == []


CHANGED_INDEXES = [
    pytest.param(
        "jobs_due",
        [("partition", 1), ("nextRunAt", 1)],
        {"partialFilterExpression": {"nextRunAt": {"$exists": True}}},
        "IndexOptionsConflict",
        id="options-changed",
    ),
    pytest.param("jobs_due", [("nextRunAt", 1)], {}, "IndexKeySpecsConflict", id="keys-changed"),
    pytest.param(
        "executions_job_scheduled",
        [("jobId", 1), ("scheduledFor", -1), ("_id", -1)],
        {"unique": True},
        "IndexOptionsConflict",
        id="made-unique",
    ),
]


@pytest.mark.parametrize(("name", "keys", "options", "code"), CHANGED_INDEXES)
async def test_an_index_changed_under_its_name_is_a_configuration_error_naming_it(
    name: str, keys: list[tuple[str, int]], options: dict[str, Any], code: str
) -> None:
    """A permanent error at start is no "store unavailable" (a restart loop that never heals):
    it names the index and what to do."""
    fake = FakeAsyncMongoClient()
    spec = INDEXES_BY_NAME[name]
    db = fake.get_database("jobsched")
    await db[spec.collection].create_indexes([IndexModel(keys, name=name, **options)])
    s = MongoStore("mongodb://fake.invalid/jobsched", client=cast("AsyncMongoClient[Any]", fake))

    with pytest.raises(ConfigError) as info:
        await s.open()

    message = info.value.message
    assert f"{spec.collection}.{name}" in message and code in message
    assert f'db.{spec.collection}.dropIndex("{name}")' in message
    assert not isinstance(info.value, StoreUnavailable)


async def test_an_unreachable_server_at_start_is_still_unavailable() -> None:
    fake = FakeAsyncMongoClient()
    fake.fail(ServerSelectionTimeoutError("no primary"), op="create_indexes")
    s = MongoStore("mongodb://fake.invalid/jobsched", client=cast("AsyncMongoClient[Any]", fake))
    with pytest.raises(StoreUnavailable):
        await s.open()


INDEXES_BY_NAME = {i.name: i for i in INDEXES}
RANGE_OPS = {"$lt", "$lte", "$gt", "$gte", "$type", "$ne"}
POST_SCAN_FILTERS = {"replayOf", "backfill"}
"""Fields that no index has and that are filtered on the scanned documents (a subset of
:data:`DOCUMENTED_RESIDUALS`)."""
DOCUMENTED_RESIDUALS = {
    # list_jobs?status=…&lastRunStatus=…: served by jobs_owner_status_created, lastRunStatus
    # filtered on the fetched documents.
    "lastRunStatus",
    # scheduling delay: runs that never started are skipped after the index scan.
    "startedAt",
    # the Overview's start delay: replays and backfilled runs are filtered on the documents
    # of the window's started runs (the index scan bounds them to the window).
    "replayOf",
    "backfill",
    # list_jobs?labels=…: the second and later set requirements (``in``) are filtered on the
    # documents the first term or set selected.
    "$and",
}
AUDIT_RESIDUALS = ("actor", "owner")
"""Audit listings by job (one job has one owner: all or none of its records match) and by owner
and actor (an owner's records, newest first, until a page of the actor's) filter these fields
on the fetched records, in this order of preference."""


def serving_index(
    collection: str,
    filter: Mapping[str, Any],
    sort: tuple[tuple[str, int], ...] = (),
    *,
    residual: frozenset[str] = frozenset(),
) -> str | None:
    """The declared index that serves a query without a collection scan, or None.

    Planner-free rule: the equality (and ``$in``) fields are the index's leading keys, then come
    the sort keys (all in the index's directions or all reversed), range fields are index keys,
    the fields of an ``$or`` are index keys, and a partial index's filter is repeated verbatim in
    the query. A point lookup on ``_id`` is served by ``_id_``. Fields in ``residual`` may be
    filtered after the scan.
    """
    id_cond = filter.get(ID)
    if id_cond is not None and (not isinstance(id_cond, dict) or set(id_cond) <= {"$in", "$eq"}):
        return "_id_"
    for spec in INDEXES:
        if spec.collection != collection:
            continue
        keys = [k for k, _ in spec.keys]
        conditions = {k: v for k, v in filter.items() if k not in ("$or", *residual)}
        if spec.partial is not None:
            if any(
                not isinstance(conditions.get(f), dict)
                or any(conditions[f].get(op) != v for op, v in cond.items())
                for f, cond in spec.partial.items()
            ):
                continue
            conditions = {
                f: {op: v for op, v in c.items() if op not in spec.partial.get(f, {})}
                if isinstance(c, dict)
                else c
                for f, c in conditions.items()
            }
            conditions = {f: c for f, c in conditions.items() if c != {}}
        conditions = {  # a label selector's excluded terms ($nin) are filtered after the scan
            f: {op: v for op, v in c.items() if op != "$nin"} if isinstance(c, dict) else c
            for f, c in conditions.items()
        }
        conditions = {f: c for f, c in conditions.items() if c != {}}
        eq = {
            f
            for f, c in conditions.items()
            if not isinstance(c, dict) or set(c) <= {"$in", "$eq", "$all"}
        }
        if spec.unique and set(keys) == eq == set(conditions):
            return spec.name  # a point lookup of a unique index: one document, any order
        ranges = {f for f, c in conditions.items() if isinstance(c, dict) and set(c) & RANGE_OPS}
        if set(keys[: len(eq)]) != eq or not ranges <= set(keys):
            continue
        rest = spec.keys[len(eq) :]
        first_free = rest[0][0] if rest else None
        if (ranges or sort) and first_free not in ranges and first_free != (sort or [("",)])[0][0]:
            continue  # the key after the equality prefix neither bounds the scan nor sorts it
        if sort:
            if [f for f, _ in rest[: len(sort)]] != [f for f, _ in sort]:
                continue
            same = [d == i for (_, d), (_, i) in zip(sort, rest, strict=False)]
            if not (all(same) or not any(same)):
                continue
        or_fields = {f for clause in filter.get("$or", []) for f in clause}
        if not or_fields <= set(keys):
            continue
        return spec.name
    return None


def served(q: Query) -> str | None:
    name = serving_index(q.collection, q.filter, q.sort)
    if name is None:  # the fields no index has first, then every documented one
        post_scan = frozenset(POST_SCAN_FILTERS & set(q.filter))
        name = (
            serving_index(q.collection, q.filter, q.sort, residual=post_scan) if post_scan else None
        )
    if name is None:
        residual = frozenset(DOCUMENTED_RESIDUALS & set(q.filter))
        name = serving_index(q.collection, q.filter, q.sort, residual=residual)
    if name is None and q.collection == AUDIT:
        for n in range(1, len(AUDIT_RESIDUALS) + 1):
            name = serving_index(
                q.collection, q.filter, q.sort, residual=frozenset(AUDIT_RESIDUALS[:n])
            )
            if name is not None:
                break
    return name


def test_serving_index_rejects_unindexed_queries() -> None:
    assert serving_index(JOBS, {"queue": "default"}) is None
    assert serving_index(JOBS, {"owner": "a", "name": "n"}) is None  # partial filter missing
    assert serving_index(JOBS, {"lastRunStatus": "FAILED"}) is None  # owner missing: no prefix
    assert serving_index(JOBS, {"owner": "a"}, (("nextRunAt", 1),)) is None
    assert serving_index(JOBS, {"partition": {"$in": [1]}, "nextRunAt": {"$lte": T0}}) is None
    assert serving_index(EXECUTIONS, {"partition": {"$in": [1]}, "updatedAt": {"$lt": T0}}) is None
    assert serving_index(EXECUTIONS, {"jobId": "j"}, (("scheduledFor", -1), ("_id", 1))) is None
    assert serving_index(EXECUTIONS, {"scheduledFor": {"$gte": T0}}) is None  # status unbounded
    assert serving_index(EXECUTIONS, {"owner": "a", "scheduledFor": {"$gte": T0}}) is None
    assert serving_index(JOBS, {"owner": "a"}, (("createdAt", -1), ("_id", -1))) == (
        "jobs_owner_created"
    )
    # the key lookup must repeat the partial filter, or the partial index cannot serve it
    assert serving_index(JOBS, {"owner": "a", "idempotencyKey": "k"}) is None
    assert serving_index(JOBS, {"idempotencyKey": {"$type": "string", "$eq": "k"}}) is None
    assert serving_index(JOBS, key_query("a", "k")) == IDEMPOTENCY_INDEX


async def _tenancy_queries(store: MongoStore, pause: JobChange) -> None:
    """The queries of admins' listings, the audit trail and the quota buckets."""
    for status in (None, JobStatus.RUNNING):  # an admin's listings of every user's jobs
        for last in (None, ExecutionStatus.SUCCEEDED):
            q = JobQuery(status=status, last_run_status=last)
            page = await store.list_jobs(None, q, limit=1, cursor=None)
            await store.list_jobs(None, q, limit=1, cursor=page.next_cursor)
    root = Principal("root", Role.ADMIN)
    audited = job("audited", created_at=at(40))
    await store.create_job(
        audited, audit=audit_entry(root, AuditAction.CREATED, "audited", "alice", at(40))
    )
    entry = audit_entry(root, AuditAction.PAUSED, "audited", "alice", at(41))
    await store.update_job("alice", "audited", pause, now=at(41), audit=entry)
    for aq in (
        AuditQuery(),
        AuditQuery(job_id="audited"),
        AuditQuery(owner="alice"),
        AuditQuery(actor="root"),
        AuditQuery(owner="alice", job_id="audited"),
        AuditQuery(owner="alice", actor="root"),
    ):
        audit_page = await store.list_audit(aq, limit=1, cursor=None)
        assert audit_page.next_cursor is not None
        await store.list_audit(aq, limit=1, cursor=audit_page.next_cursor)
    rate = Rate(1.0, 5.0)
    for _ in range(2):  # a new bucket (upsert), then an existing one (compare-and-set)
        await store.take_tokens([TokenRequest("runs:alice", 1, rate)], now=at(50))


async def _label_queries(store: MongoStore) -> None:
    """The queries of the name, task and label filters, of one user and of every user, and of
    a name's uniqueness."""
    named = job("named", created_at=at(70)).spec
    await store.create_job(job("named", created_at=at(70), name="nightly", labels={"team": "a"}))
    await store.create_job(job("named-2", created_at=at(71), name="other"))
    with pytest.raises(NameTaken):
        await store.create_job(job("named-3", name="nightly"))
    with pytest.raises(NameTaken):
        rename = JobChange("changed", spec=msgspec.structs.replace(named, name="nightly"))
        await store.update_job("alice", "named-2", rename, now=at(72))
    for owner in ("alice", None):
        for q in (
            JobQuery(task_id="noop"),
            JobQuery(name="nightly"),
            JobQuery(labels=parse_selector("team=a")),
            JobQuery(labels=parse_selector("team in (a,b)")),
            JobQuery(labels=parse_selector("team=a,env in (x,y),tier in (p,q),!legacy")),
            JobQuery(labels=parse_selector("!legacy")),
        ):
            page = await store.list_jobs(owner, q, limit=1, cursor=None)
            await store.list_jobs(owner, q, limit=1, cursor=page.next_cursor)


async def test_every_query_of_every_method_is_served_by_an_index(
    store: MongoStore, fake: FakeAsyncMongoClient
) -> None:
    await run_every_query(store)

    queries = logged_query_shapes(fake)
    assert len(queries) > 40
    unserved = [q for q in queries if served(q) is None]
    assert unserved == []
    used = {served(q) for q in queries}
    assert {i.name for i in INDEXES} - UNIQUENESS_ONLY <= used, "an index that no query uses"
    assert all(i.unique for i in INDEXES if i.name in UNIQUENESS_ONLY)


UNIQUENESS_ONLY = {FIRST_REPLAY_INDEX}
"""Indexes that serve no query: the server's check of a unique key is what they are for."""


async def test_no_query_lists_more_partitions_than_the_planner_explodes(
    store: MongoStore, fake: FakeAsyncMongoClient
) -> None:
    """Past ``internalQueryMaxScansToExplode`` (200) scans, a ``$in`` sorted on the next index
    key becomes a blocking in-memory sort of every match; the store sends chunks instead, and
    merges them into the same answer as one query."""
    partitions = set(range(4096))  # JOBSCHED_PARTITIONS' largest value, all owned by one
    jobs = [job(f"m{p}", partition=p, next_run_at=at(p % 97)) for p in range(0, 4096, 7)]
    for j in jobs:
        await store.create_job(j)
    fake.queries.clear()

    due = await store.due_jobs(partitions, at(60), limit=25)

    expected = sorted((j for j in jobs if j.next_run_at and j.next_run_at <= at(60)),
                      key=lambda j: (j.next_run_at, j.id))[:25]  # fmt: skip
    assert [j.next_run_at for j in due] == [j.next_run_at for j in expected]
    assert {j.id for j in due} <= {j.id for j in jobs}
    await store.stale_executions(partitions, at(100), limit=25)
    shapes = [q.filter["partition"]["$in"] for q in fake.queries if "partition" in q.filter]
    assert len(shapes) == 2 * -(-4096 // MAX_SCANS_TO_EXPLODE)
    assert max(len(s) for s in shapes) <= MAX_SCANS_TO_EXPLODE
    assert sorted(p for s in shapes[: len(shapes) // 2] for p in s) == sorted(partitions)


def dead_letter(letter_id: str, *, at_: datetime = T0) -> DeadLetter:
    return DeadLetter(
        id=letter_id,
        source="recorder",
        reason="rejected",
        error="the store refuses this write",
        subject="jobsched.status.alice.j1",
        data=b"\x00\xffnot json",
        size=10,
        at=at_,
    )


def logged_query_shapes(fake: FakeAsyncMongoClient) -> list[Query]:
    """What the store sent: every filter and sort (for the explain test on a real server)."""
    return [q for q in fake.queries if q.op != "find_one" or q.filter]


async def run_every_query(store: MongoStore) -> None:
    """Every method of the store, with cursors, conflicts, chunks and every dashboard: the
    workload whose queries the fake logs (and a real server explains)."""
    jobs = [job(f"j{i}", created_at=at(i), next_run_at=at(i), partition=i % 3) for i in range(6)]
    for j in jobs:
        await store.create_job(j)
    await store.get_job("alice", "j1")
    await store.get_jobs(["j1", "j2"])
    await store.due_jobs({0, 1, 2}, at(10), limit=10)
    ds = [dispatch_of(j, j.next_run_at or T0, j.next_run_at or T0, at(60)) for j in jobs[:3]]
    ds.append(dispatch_of(jobs[4], at(1), at(1), at(2)))  # stale CAS: created, then deleted
    await store.dispatch(ds)
    await store.dispatch(ds)
    await store.apply_events([event(d.execution, ExecutionStatus.RUNNING) for d in ds[:3]])
    await store.apply_events([event(ds[0].execution, ExecutionStatus.SUCCEEDED)])
    await store.apply_events([event(ds[0].execution, ExecutionStatus.RUNNING)])  # late
    await store.get_execution(ds[0].execution.id)
    await store.stale_executions({0, 1, 2}, at(100), limit=10)
    for status in (None, JobStatus.RUNNING):
        for last in (None, ExecutionStatus.SUCCEEDED):
            q = JobQuery(status=status, last_run_status=last, created_from=T0, created_to=at(9))
            page = await store.list_jobs("alice", q, limit=1, cursor=None)
            await store.list_jobs("alice", q, limit=1, cursor=page.next_cursor)
            await store.list_jobs("alice", JobQuery(status=status, last_run_status=last),
                                  limit=2, cursor=None)  # fmt: skip
    await store.notification_attempts("j1:x")
    await store.get_notification_default("alice")
    page2 = await store.list_executions("alice", "j1", limit=1, cursor=None)
    await store.list_executions("alice", "j1", limit=1, cursor=page2.next_cursor)
    await store.create_job(job("keyed", idempotency_key="k-1"), request_hash="h")
    with pytest.raises(IdempotencyKeyReused):
        await store.create_job(job("keyed-2", idempotency_key="k-1"), request_hash="h")
    pause = JobChange("paused", allowed_from=frozenset({JobStatus.SCHEDULED}),
                      status=JobStatus.PAUSED, next_run_at=None, spec=CONTROL_SPEC)  # fmt: skip
    await store.update_job("alice", "j5", pause, now=at(20))
    with pytest.raises(JobStatusConflict):
        await store.update_job("alice", "j5", pause, now=at(21))
    manual = run_of(jobs[5], at(30))
    await store.insert_execution(manual)
    await store.insert_execution(manual)
    await store.get_executions([manual.id, ds[0].execution.id])
    skipped = Execution(**{**_fields(run_of(jobs[5], at(5))), "status": ExecutionStatus.SKIPPED,
                           "state_rank": TERMINAL_RANK})  # fmt: skip
    await store.dispatch([Dispatch(skipped, expected_next_run_at=at(5), next_run_at=at(6))])
    await store.apply_events([event(ds[1].execution, ExecutionStatus.SUCCEEDED)])
    await store.prune_executions(
        [
            PruneTarget("j0", keep_last=0, finished_before=at(90), keep_id=ds[0].execution.id),
            PruneTarget("j1", keep_last=0, finished_before=None, keep_id=None),
            PruneTarget("j2", keep_last=None, finished_before=at(90), keep_id=None),
        ],
        limit=10,
    )
    await store.partition_jobs(1, after=None, limit=2)
    await store.partition_jobs(1, after="j1", limit=2)
    await store.delete_job("alice", "j5")
    await store.due_jobs(set(range(450)), at(10), limit=10)  # three chunks of partitions
    await store.stale_executions(set(range(450)), at(100), limit=10)
    await store.dead_letter([dead_letter("s:1:1"), dead_letter("s:1:1"), dead_letter("s:2:1")])
    await store.dead_letters(limit=5)
    await _tenancy_queries(store, pause)
    await _label_queries(store)
    await _dashboard_queries(store)
    for pipeline in (
        runs_by_status_per_hour(T0, at(60)),
        runs_by_status_per_hour(T0, at(60), owner="alice"),
        failures_per_task_per_day(T0, at(60)),
        failures_per_task_per_day(T0, at(60), owner="alice"),
        scheduling_delay_per_hour(T0, at(60)),
        scheduling_delay_per_hour(T0, at(60), owner="alice"),
        running_jobs(),
        running_jobs(owner="alice"),
    ):
        await (await store.database[EXECUTIONS].aggregate(pipeline)).to_list()
    await _run_queries(store)


async def _dashboard_queries(store: MongoStore) -> None:
    """The queries of the dashboard's Overview, Upcoming and Cluster (store/mongo/stats.py)."""
    for who in ("alice", None):
        await store.run_stats(who, T0, at(60))
        await store.scheduled_groups(who, at(60), limit=10)
    await store.running_runs(limit=10)


async def _run_queries(store: MongoStore) -> None:
    """The queries of dead letters (every filter, both scopes, with cursors) and bulk actions."""
    for owner in ("alice", None):
        for task_id in (None, "noop"):
            q = RunQuery(status=ExecutionStatus.RUNNING, task_id=task_id, scheduled_from=T0,
                         scheduled_to=at(90), error="x")  # fmt: skip
            await store.list_runs(owner, q, limit=1, cursor=None)
            await store.list_runs(owner, q, limit=1, cursor=encode_cursor(1, "z"))
            await store.list_runs(owner, RunQuery(task_id=task_id), limit=1, cursor=None)
    await store.replays_of(["alice-job:run"])  # the partial filter repeated: served
    action = BulkAction(id="bulk", kind=BulkKind.CANCEL, filter=BulkFilter(statuses=[]),
                        actor="alice", created_at=T0, updated_at=T0, lease_expires_at=T0)  # fmt: skip
    await store.create_bulk(action)
    await store.get_bulk("bulk")
    claimed = await store.claim_bulk("gw", now=at(1), lease_seconds=30)
    assert claimed is not None
    await store.save_bulk(claimed, holder="gw")


# --- driver errors -----------------------------------------------------------------------------


def bulk_error(*write_errors: dict[str, Any], labels: list[str] | None = None) -> BulkWriteError:
    details: dict[str, Any] = {
        "writeErrors": list(write_errors),
        "writeConcernErrors": [],
        "nInserted": 0,
        "nUpserted": 0,
        "nMatched": 0,
        "nModified": 0,
        "nRemoved": 0,
        "upserted": [],
    }
    if labels:
        details["errorLabels"] = labels
    return BulkWriteError(details)


def labelled(error: OperationFailure, label: str) -> OperationFailure:
    return OperationFailure(
        str(error), error.code, {"code": error.code, "errmsg": str(error), "errorLabels": [label]}
    )


DRIVER_ERRORS: list[PyMongoError] = [
    AutoReconnect("connection reset by peer"),
    ServerSelectionTimeoutError("No replica set members match selector Primary()"),
    NotPrimaryError("not primary"),
    NetworkTimeout("timed out"),
    WriteConcernError("waiting for replication timed out", 64),
    ExecutionTimeout("operation exceeded time limit", 50),
    BulkWriteError(
        {
            "writeErrors": [],
            "writeConcernErrors": [{"code": 64, "errmsg": "wtimeout"}],
            "nInserted": 0,
            "nUpserted": 0,
            "nMatched": 0,
            "nModified": 0,
            "nRemoved": 0,
            "upserted": [],
        }
    ),
    bulk_error({"index": 0, "code": 11602, "errmsg": "InterruptedDueToReplStateChange"}),
    bulk_error({"index": 0, "code": 2, "errmsg": "bad value"}, labels=["RetryableWriteError"]),
    OperationFailure("not authorized on jobsched to execute command", 13),  # the store, not a write
    OperationFailure("an error this version does not know", 999_999),
    labelled(OperationFailure("Write conflict", 112), "TransientTransactionError"),
    labelled(OperationFailure("bad value, but retryable", 2), "RetryableWriteError"),
]

PERMANENT_ERRORS: list[Exception] = [
    OperationFailure("Document failed validation", 121),
    OperationFailure("BSONObj size: 17000000 is invalid", 10334),
    OperationFailure("Document exceeds maximum nesting depth of 100", 15),
    bulk_error({"index": 0, "code": 2, "errmsg": "bad value"}),
    bulk_error(
        {"index": 0, "code": 11000, "errmsg": "E11000 duplicate key error"},
        {"index": 1, "code": 17419, "errmsg": "Resulting document after update is larger"},
    ),
    InvalidDocument("Key names must not contain the NULL byte"),
    DocumentTooLarge("BSON document too large (17000000 bytes)"),
    OverflowError("MongoDB can only handle up to 8-byte ints"),
]
"""Errors about the write itself: the same write can never succeed."""

StoreCall = Callable[[MongoStore], Awaitable[object]]
J = job("err-job")
D = dispatch_of(J, T0, T0, at(1))
CALLS: dict[str, StoreCall] = {
    "ping": lambda s: s.ping(),
    "create_job": lambda s: s.create_job(job("new-job")),
    "get_job": lambda s: s.get_job("alice", J.id),
    "list_jobs": lambda s: s.list_jobs("alice", JobQuery(), limit=5, cursor=None),
    "list_executions": lambda s: s.list_executions("alice", J.id, limit=5, cursor=None),
    "get_execution": lambda s: s.get_execution(D.execution.id),
    "get_jobs": lambda s: s.get_jobs([J.id]),
    "due_jobs": lambda s: s.due_jobs({1}, at(5), limit=5),
    "stale_executions": lambda s: s.stale_executions({1}, at(5), limit=5),
    "dispatch": lambda s: s.dispatch([D]),
    "apply_events": lambda s: s.apply_events([event(D.execution, ExecutionStatus.RUNNING)]),
    "update_job": lambda s: s.update_job(
        "alice", J.id, JobChange("paused", status=JobStatus.PAUSED), now=at(1)
    ),
    "delete_job": lambda s: s.delete_job("alice", J.id),
    "insert_execution": lambda s: s.insert_execution(D.execution),
    "get_executions": lambda s: s.get_executions([D.execution.id]),
}


BULK_OPS = {"create_job": "insert_one", "dispatch": "insert_many", "apply_events": "bulk_write"}


ERROR_CASES = [
    pytest.param(call, error, id=f"{call}-{type(error).__name__}-{i}")
    for call in CALLS
    for i, error in enumerate(DRIVER_ERRORS)
    if not isinstance(error, BulkWriteError) or call in BULK_OPS
]
WRITES = ("create_job", "dispatch", "apply_events", "update_job", "insert_execution")
PERMANENT_CASES = [
    pytest.param(call, error, id=f"{call}-{type(error).__name__}-{i}")
    for call in WRITES
    for i, error in enumerate(PERMANENT_ERRORS)
    if not isinstance(error, BulkWriteError) or call in BULK_OPS
]


@pytest.mark.parametrize(("call", "error"), ERROR_CASES)
async def test_driver_errors_become_store_unavailable(
    store: MongoStore, fake: FakeAsyncMongoClient, call: str, error: PyMongoError
) -> None:
    await store.create_job(J)
    fake.fail(error, op=BULK_OPS[call] if isinstance(error, BulkWriteError) else None)
    with pytest.raises(StoreUnavailable) as info:
        await CALLS[call](store)
    assert not isinstance(info.value, PyMongoError)
    assert isinstance(info.value.__cause__, PyMongoError)


@pytest.mark.parametrize(("call", "error"), PERMANENT_CASES)
async def test_errors_about_the_write_itself_become_store_rejected(
    store: MongoStore, fake: FakeAsyncMongoClient, call: str, error: Exception
) -> None:
    """A permanent error is not "unavailable": retrying it forever would block the recorder."""
    await store.create_job(J)
    fake.fail(error, op=BULK_OPS[call] if isinstance(error, BulkWriteError) else None)
    with pytest.raises(StoreRejected) as info:
        await CALLS[call](store)
    assert info.value.__cause__ is error


async def _calls_of(call: Callable[[MongoStore], Awaitable[object]]) -> int:
    fake = FakeAsyncMongoClient()
    s = MongoStore("mongodb://fake.invalid/jobsched", client=cast("AsyncMongoClient[Any]", fake))
    await s.open()
    await s.create_job(J)
    before = fake.calls
    await call(s)
    return fake.calls - before


@pytest.mark.parametrize("call", ["dispatch", "apply_events"])
async def test_a_failure_at_any_step_is_unavailable_and_a_retry_completes(call: str) -> None:
    """Connection loss before each round trip of a call: StoreUnavailable, then the retry (the
    actors' job) leaves the same state as an undisturbed call."""
    steps = await _calls_of(CALLS[call])
    assert steps >= 3
    for step in range(steps):
        fake = FakeAsyncMongoClient()
        s = MongoStore(
            "mongodb://fake.invalid/jobsched", client=cast("AsyncMongoClient[Any]", fake)
        )
        await s.open()
        await s.create_job(J)
        if call == "apply_events":
            await s.dispatch([D])
        fake.fail(AutoReconnect("connection reset"), skip=step)
        with pytest.raises(StoreUnavailable):
            await CALLS[call](s)
        await CALLS[call](s)
        got = await s.get_job("alice", J.id)
        ex = await s.get_execution(D.execution.id)
        assert ex is not None and (got.run_count, got.next_run_at) == (1, at(1)), step
        if call == "apply_events":
            assert ex.status == ExecutionStatus.RUNNING and got.status == JobStatus.RUNNING


KEYED = job("keyed-err", idempotency_key="err-key")
CONTROL_CALLS: dict[str, StoreCall] = {
    "create_job-reused-key": lambda s: s.create_job(job("new", idempotency_key="err-key")),
    "update_job-conflict": lambda s: s.update_job(
        "alice", KEYED.id, JobChange("resumed", allowed_from=frozenset()), now=at(1)
    ),
    "update_job-not-found": lambda s: s.update_job(
        "bob", KEYED.id, JobChange("resumed"), now=at(1)
    ),
    "delete_job": lambda s: s.delete_job("alice", KEYED.id),
}


async def _keyed_store() -> tuple[MongoStore, FakeAsyncMongoClient]:
    fake = FakeAsyncMongoClient()
    s = MongoStore("mongodb://fake.invalid/jobsched", client=cast("AsyncMongoClient[Any]", fake))
    await s.open()
    await s.create_job(KEYED)
    return s, fake


@pytest.mark.parametrize("call", CONTROL_CALLS)
async def test_every_round_trip_of_job_control_is_translated(call: str) -> None:
    """A driver error at any round trip (including the reads that explain a refused write)
    is StoreUnavailable, never a domain error built on a half-read."""
    s, fake = await _keyed_store()
    before = fake.calls
    with contextlib.suppress(IdempotencyKeyReused, JobStatusConflict, JobNotFound):
        await CONTROL_CALLS[call](s)
    steps = fake.calls - before
    assert steps >= 2
    for step in range(steps):
        s, fake = await _keyed_store()
        fake.fail(AutoReconnect("connection reset"), skip=step)
        with pytest.raises(StoreUnavailable):
            await CONTROL_CALLS[call](s)


async def test_a_duplicate_key_the_server_does_not_name_is_resolved_by_reading(
    store: MongoStore, fake: FakeAsyncMongoClient
) -> None:
    held = job("held", idempotency_key="k")
    await store.create_job(held, request_hash="h")
    unnamed = DuplicateKeyError("E11000 duplicate key error", 11000)
    fake.fail(unnamed, op="insert_one")
    with pytest.raises(IdempotencyKeyReused) as info:
        await store.create_job(job("new", idempotency_key="k"), request_hash="h")
    assert info.value.job == held and info.value.same_request
    fake.fail(unnamed, op="insert_one")
    with pytest.raises(Conflict) as conflict:
        await store.create_job(job("new", idempotency_key="free"))
    assert not isinstance(conflict.value, IdempotencyKeyReused)


async def test_a_key_whose_job_vanished_meanwhile_is_inserted_again(
    store: MongoStore, fake: FakeAsyncMongoClient
) -> None:
    """The key's index reported a duplicate, but its holder was deleted before the read."""
    message = f"E11000 duplicate key error collection: jobsched.jobs index: {IDEMPOTENCY_INDEX}"
    details = {"code": 11000, "errmsg": message + " dup key: { owner: ..., idempotencyKey: ... }"}
    fake.fail(DuplicateKeyError(message, 11000, details), op="insert_one")
    j = job("new", idempotency_key="k")

    assert await store.create_job(j, request_hash="h") == j

    assert await store.get_job("alice", "new") == j


async def test_a_duplicate_id_is_a_conflict_even_with_a_new_key(store: MongoStore) -> None:
    await store.create_job(job("j1", idempotency_key="k1"))
    with pytest.raises(Conflict) as info:
        await store.create_job(job("j1", idempotency_key="k2"))
    assert not isinstance(info.value, IdempotencyKeyReused)


async def test_update_job_retries_when_the_status_becomes_allowed_meanwhile(
    store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conditional write misses a SCHEDULED job, which another gateway pauses before the
    read: the read sees an allowed status, so the write is tried again (no false conflict)."""
    j = job()
    await store.create_job(j)
    collection = cast("FakeAsyncCollection", store.database[JOBS])
    original = collection.find_one_and_update
    calls: list[Mapping[str, Any]] = []

    async def racing(filter: Mapping[str, Any], update: Mapping[str, Any], **kw: Any) -> Any:
        calls.append(filter)
        result = await original(filter, update, **kw)
        if len(calls) == 1:
            collection._c.update_one({ID: j.id}, {"$set": {"status": "PAUSED"}})
        return result

    monkeypatch.setattr(collection, "find_one_and_update", racing)
    resume = JobChange("resumed", allowed_from=frozenset({JobStatus.PAUSED}),
                       status=JobStatus.SCHEDULED, next_run_at=at(9))  # fmt: skip

    after = await store.update_job("alice", j.id, resume, now=at(1))

    assert len(calls) == 2
    assert (after.status, after.next_run_at, after.updated_at) == (
        JobStatus.SCHEDULED,
        at(9),
        at(1),
    )


async def test_update_job_gives_up_as_unavailable_when_the_job_keeps_changing(
    store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await store.create_job(job())
    collection = cast("FakeAsyncCollection", store.database[JOBS])

    async def always_missed(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(collection, "find_one_and_update", always_missed)
    with pytest.raises(StoreUnavailable):
        await store.update_job(
            "alice", "j1", JobChange("paused", allowed_from=frozenset({JobStatus.SCHEDULED})),
            now=at(1),
        )  # fmt: skip


async def test_duplicate_job_is_a_conflict(store: MongoStore, fake: FakeAsyncMongoClient) -> None:
    await store.create_job(job())
    with pytest.raises(Conflict):
        await store.create_job(job())
    fake.fail(DuplicateKeyError("E11000 duplicate key error", 11000), op="insert_one")
    with pytest.raises(Conflict) as info:
        await store.create_job(job("other"))
    assert not isinstance(info.value, PyMongoError)


async def test_open_without_a_server_is_unavailable(fake: FakeAsyncMongoClient) -> None:
    fake.fail(ServerSelectionTimeoutError("no primary"), op="create_indexes")
    s = MongoStore("mongodb://fake.invalid/x", client=cast("AsyncMongoClient[Any]", fake))
    with pytest.raises(StoreUnavailable):
        await s.open()
    with pytest.raises(StoreUnavailable):
        await s.ping()  # not open


REAL_DRIVER_PROBE = """
import asyncio, time
from core.errors import StoreUnavailable
from pymongo.errors import PyMongoError
from store.mongo import MongoStore

async def main():
    s = MongoStore("mongodb://127.0.0.1:9/jobsched?directConnection=true", timeout_seconds=0.3)
    started = time.monotonic()
    try:
        await s.open()
    except StoreUnavailable as e:
        assert not isinstance(e, PyMongoError)
        print(f"unavailable after {time.monotonic() - started:.2f}")
    await s.close()

asyncio.run(main())
"""


def test_real_driver_without_a_server_fails_fast_as_unavailable() -> None:
    """The real AsyncMongoClient against a closed loopback port: StoreUnavailable in ~timeout.

    Run in a child process: PyMongo 4.20's async monitor leaves the socket of a refused
    connection to the garbage collector, and its ResourceWarning would otherwise surface in
    whichever test runs at the next collection.
    """
    out = subprocess.run(
        [sys.executable, "-c", REAL_DRIVER_PROBE],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert out.startswith("unavailable after "), out
    assert float(out.split()[-1]) < 5


# --- dispatch without transactions -------------------------------------------------------------


async def test_dispatch_leaves_no_orphan_when_the_cas_fails(store: MongoStore) -> None:
    j = job(next_run_at=at(1))
    await store.create_job(j)
    stale = dispatch_of(j, T0, T0, at(1))  # the job is already at at(1)
    assert await store.dispatch([stale]) == [DispatchOutcome(created=False, advanced=False)]
    assert await store.get_execution(stale.execution.id) is None
    assert (await store.get_job("alice", j.id)).run_count == 0


async def test_dispatch_keeps_an_execution_it_did_not_create(store: MongoStore) -> None:
    j = job(next_run_at=at(1))
    await store.create_job(j)
    d = dispatch_of(j, T0, T0, at(1))
    await store.database[EXECUTIONS].insert_one(to_document(d.execution))
    assert await store.dispatch([d]) == [DispatchOutcome(created=False, advanced=False)]
    assert await store.get_execution(d.execution.id) is not None


async def test_crash_between_insert_and_cas_loses_no_run(
    store: MongoStore, fake: FakeAsyncMongoClient
) -> None:
    j = job()
    await store.create_job(j)
    d = dispatch_of(j, T0, T0, at(1))
    fake.fail(AutoReconnect("primary stepped down"), op="bulk_write")
    with pytest.raises(StoreUnavailable):
        await store.dispatch([d])
    queued = await store.get_execution(d.execution.id)
    assert queued is not None and queued.status == ExecutionStatus.QUEUED
    assert await store.dispatch([d]) == [DispatchOutcome(created=False, advanced=True)]
    after = await store.get_job("alice", j.id)
    assert (after.next_run_at, after.last_scheduled_for, after.run_count) == (at(1), T0, 1)


async def test_twin_dispatchers_create_one_execution_and_advance_once(store: MongoStore) -> None:
    jobs = [job(f"j{i}", next_run_at=at(i)) for i in range(5)]
    for j in jobs:
        await store.create_job(j)
    ds = [dispatch_of(j, at(i), at(i), at(i + 10)) for i, j in enumerate(jobs)]
    first, second = await asyncio.gather(store.dispatch(ds), store.dispatch(ds))
    for a, b in zip(first, second, strict=True):
        assert a.advanced and b.advanced
        assert a.created != b.created
    for i, j in enumerate(jobs):
        after = await store.get_job("alice", j.id)
        assert (after.run_count, after.next_run_at) == (1, at(i + 10))
    assert await store.database[EXECUTIONS].count_documents({}) == 5


async def test_dispatch_of_the_last_run_clears_next_run_at(store: MongoStore) -> None:
    j = job(schedule=ImmediateSchedule(), next_run_at=T0)
    await store.create_job(j)
    assert await store.dispatch([dispatch_of(j, T0, T0, None)]) == [
        DispatchOutcome(created=True, advanced=True)
    ]
    assert "nextRunAt" not in await raw(store, JOBS, j.id)
    assert await store.due_jobs({1}, at(1000), limit=5) == []


async def test_a_due_job_document_without_a_readable_due_time_is_skipped(
    store: MongoStore, caplog: pytest.LogCaptureFixture
) -> None:
    """``due_jobs`` reads three fields of each job: one edited by hand into the wrong type is
    skipped and logged (:class:`store.rows.RowReader`), the others are served."""
    good, bad = job("good", next_run_at=at(1)), job("bad", next_run_at=at(2))
    await store.create_job(good)
    await store.create_job(bad)
    await store.database[JOBS].update_one({"_id": "bad"}, {"$set": {"partition": 1.0}})

    with caplog.at_level(logging.ERROR, logger="store.rows"):
        due = await store.due_jobs({1}, at(10), limit=5)

    assert due == [DueJob("good", at(1), 1)]
    assert any("job bad" in r.getMessage() for r in caplog.records)


# --- conditional transitions and job summaries -------------------------------------------------


async def test_a_late_event_never_moves_a_run_backwards(store: MongoStore) -> None:
    j = job(schedule=ImmediateSchedule())
    await store.create_job(j)
    d = dispatch_of(j, T0, T0, None)
    await store.dispatch([d])
    ex = d.execution
    done = event(ex, ExecutionStatus.SUCCEEDED, result={"rows": 3})
    assert await store.apply_events([done]) == 1
    assert await store.apply_events([event(ex, ExecutionStatus.RUNNING)]) == 0
    assert await store.apply_events([event(ex, ExecutionStatus.RETRYING)]) == 0
    stored = await store.get_execution(ex.id)
    assert stored is not None and stored.status == ExecutionStatus.SUCCEEDED
    assert stored.result == {"rows": 3}
    assert (await store.get_job("alice", j.id)).status == JobStatus.SUCCEEDED


async def test_redelivery_does_not_modify_the_run_but_reapplies_the_summary(
    store: MongoStore,
) -> None:
    j = job(schedule=ImmediateSchedule())
    await store.create_job(j)
    d = dispatch_of(j, T0, T0, None)
    await store.dispatch([d])
    failed = event(d.execution, ExecutionStatus.FAILED, 3, error="boom")
    assert await store.apply_events([failed]) == 1
    before = await raw(store, EXECUTIONS, d.execution.id)
    await store.database[JOBS].update_one({ID: j.id}, {"$set": {"status": "RUNNING"}})
    assert await store.apply_events([failed]) == 0
    assert await raw(store, EXECUTIONS, d.execution.id) == before
    after = await store.get_job("alice", j.id)
    assert (after.status, after.last_run_status, after.last_error) == (
        JobStatus.FAILED,
        ExecutionStatus.FAILED,
        "boom",
    )


async def test_summary_follows_the_latest_run_and_next_run_at(store: MongoStore) -> None:
    j = job()  # recurring
    await store.create_job(j)
    d1 = dispatch_of(j, T0, T0, at(1))
    await store.dispatch([d1])
    d2 = dispatch_of(j, at(1), at(1), at(2))
    await store.dispatch([d2])
    await store.apply_events([event(d2.execution, ExecutionStatus.RUNNING)])
    # the older run finishing late does not take the summary back
    await store.apply_events([event(d1.execution, ExecutionStatus.FAILED, error="old")])
    got = await store.get_job("alice", j.id)
    assert (got.status, got.last_execution_id, got.last_run_status) == (
        JobStatus.RUNNING,
        d2.execution.id,
        None,
    )
    await store.apply_events([event(d2.execution, ExecutionStatus.SUCCEEDED)])
    got = await store.get_job("alice", j.id)
    assert (got.status, got.last_run_status, got.last_error) == (
        JobStatus.SCHEDULED,
        ExecutionStatus.SUCCEEDED,
        None,
    )


async def test_queued_events_create_a_missing_run_but_do_not_touch_the_job(
    store: MongoStore,
) -> None:
    j = job()
    await store.create_job(j)
    ex = run_of(j, T0)
    assert await store.apply_events([event(ex, ExecutionStatus.QUEUED)]) == 1
    assert await store.apply_events([event(ex, ExecutionStatus.QUEUED)]) == 0
    assert (await store.get_job("alice", j.id)) == j


async def test_concurrent_upsert_race_is_retried_not_dropped(
    store: MongoStore, fake: FakeAsyncMongoClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two recorders upsert the same missing run: the loser's higher-rank event still applies.

    The fake cannot interleave inside one upsert, so the race is staged: the first upsert sees no
    document, then a concurrent RUNNING insert wins and the upsert fails with a duplicate key.
    """
    j = job(schedule=ImmediateSchedule(), next_run_at=None)
    await store.create_job(j)
    ex = run_of(j, T0)
    collection = cast("FakeAsyncCollection", store.database[EXECUTIONS])
    original = collection._apply
    staged = {"done": False}

    def racing_apply(index: int, op: Any, details: dict[str, Any]) -> None:
        if not staged["done"]:
            staged["done"] = True
            collection._c.insert_one(to_document(ex))
            collection._c.update_one({ID: ex.id}, {"$set": {"status": "RUNNING", "stateRank": 2}})
            raise DuplicateKeyError("E11000 duplicate key error", 11000)
        original(index, op, details)

    monkeypatch.setattr(collection, "_apply", racing_apply)
    assert await store.apply_events([event(ex, ExecutionStatus.SUCCEEDED)]) == 1
    stored = await store.get_execution(ex.id)
    assert stored is not None and stored.status == ExecutionStatus.SUCCEEDED
    assert (await store.get_job("alice", j.id)).status == JobStatus.SUCCEEDED


async def test_an_attempt_history_that_keeps_changing_is_unavailable_then_retried(
    store: MongoStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another recorder changes the run's ``attempts`` before each of this one's
    compare-and-sets: after three tries the batch fails as unavailable (the recorder retries
    it); the retry, undisturbed, merges both recorders' attempts."""
    j = job()
    await store.create_job(j)
    d = dispatch_of(j, T0, T0, at(1))
    await store.dispatch([d])
    collection = cast("FakeAsyncCollection", store.database[EXECUTIONS])
    original = collection._apply
    other = {"attempt": 7, "startedAt": T0, "workerId": "w7", "finishedAt": None,
             "outcome": None, "error": None, "redelivered": True}  # fmt: skip

    def competing(index: int, op: Any, details: dict[str, Any]) -> None:
        if isinstance(op, UpdateOne) and "attempts" in op._filter:
            collection._c.update_one({ID: d.execution.id}, {"$push": {"attempts": dict(other)}})
        original(index, op, details)

    monkeypatch.setattr(collection, "_apply", competing)
    running = event(d.execution, ExecutionStatus.RUNNING, 1)
    with pytest.raises(StoreUnavailable, match="attempt history"):
        await store.apply_events([running])
    monkeypatch.setattr(collection, "_apply", original)

    await store.apply_events([running])

    stored = await store.get_execution(d.execution.id)
    assert stored is not None and [a.attempt for a in stored.attempts] == [1, 7]


async def test_first_published_and_started_times_are_kept(store: MongoStore) -> None:
    j = job()
    await store.create_job(j)
    d = dispatch_of(j, T0, T0, at(1))
    await store.dispatch([d])
    first = event(d.execution, ExecutionStatus.RUNNING, 1)
    later = StatusEvent(**{**_event_fields(event(d.execution, ExecutionStatus.RUNNING, 2)),
                           "started_at": at(0.5), "published_at": at(0.4)})  # fmt: skip
    await store.apply_events([first])
    await store.apply_events([later])
    stored = await store.get_execution(d.execution.id)
    assert stored is not None and stored.attempt == 2
    assert (stored.published_at, stored.started_at) == (first.published_at, first.started_at)


def _event_fields(ev: StatusEvent) -> dict[str, Any]:
    return {f: getattr(ev, f) for f in ev.__struct_fields__}


# --- same answers as the SQLite reference store ------------------------------------------------


RUN_STATUSES = [
    ExecutionStatus.QUEUED,
    ExecutionStatus.RUNNING,
    ExecutionStatus.RETRYING,
    ExecutionStatus.SUCCEEDED,
    ExecutionStatus.FAILED,
    ExecutionStatus.CANCELLED,
    ExecutionStatus.SKIPPED,
]


class Scenario:
    """Random operations applied to two stores; every answer must be equal."""

    def __init__(self, seed: int, mongo: MongoStore, sqlite: SqliteStore) -> None:
        self.rng = random.Random(seed)
        self.stores = (mongo, sqlite)
        self.now = T0
        self.jobs: list[Job] = []
        self.runs: dict[str, Execution] = {}
        self.used_times: set[datetime] = set()

    async def both(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on both stores; the answers (or errors) must be equal."""
        results = []
        for s in self.stores:
            try:
                result = await getattr(s, method)(*args, **kwargs)
            except IdempotencyKeyReused as e:
                result = (type(e), e.job, e.same_request)
            except JobStatusConflict as e:
                result = (type(e), e.job_status)
            except (JobNotFound, Conflict) as e:
                result = type(e)
            if method == "get_jobs":
                result = sorted(result, key=lambda j: j.id)
            elif method == "get_executions":
                result = sorted(result, key=lambda e: e.id)
            elif method == "stale_executions":  # equal updatedAt: any order
                result = sorted(result, key=lambda e: (e.updated_at, e.id))
            results.append(result)
        assert results[0] == results[1], (method, _diff(results[0], results[1]))
        return results[0]

    def fresh_time(self) -> datetime:
        while True:
            t = T0 + timedelta(milliseconds=self.rng.randrange(0, 3_600_000))
            if t not in self.used_times:
                self.used_times.add(t)
                return t

    async def create(self) -> None:
        kind = self.rng.choice(["once", "interval", "immediate"])
        schedule = {
            "once": OnceSchedule(execute_at=T0),
            "interval": IntervalSchedule(every_seconds=60.0),
            "immediate": ImmediateSchedule(),
        }[kind]
        j = job(
            f"job{len(self.jobs):03d}",
            owner=self.rng.choice(["alice", "bob"]),
            schedule=schedule,
            next_run_at=self.fresh_time(),
            created_at=self.fresh_time(),
            partition=self.rng.randrange(4),
            idempotency_key=self.rng.choice([None, None, "k1", "k2"]),
        )
        self.jobs.append(j)
        await self.both("create_job", j, request_hash=self.rng.choice([None, "h1", "h2"]))

    async def control(self) -> None:
        """A pause, resume, cancel or PATCH of a random job (sometimes another owner's)."""
        j = self.rng.choice(self.jobs)
        owner = j.owner if self.rng.random() < 0.9 else "mallory"
        allowed = None
        if self.rng.random() < 0.7:
            allowed = frozenset(self.rng.sample(list(JobStatus), self.rng.randint(0, 4)))
        status = self.rng.choice([None, *JobStatus])
        nxt = self.rng.choice([UNCHANGED, None, self.fresh_time()])
        spec = CONTROL_SPEC if self.rng.random() < 0.3 else None
        self.now += timedelta(milliseconds=self.rng.randrange(1, 5000))
        change = JobChange("changed", allowed_from=allowed, status=status, next_run_at=nxt,
                           spec=spec)  # fmt: skip
        await self.both("update_job", owner, j.id, change, now=self.now)

    async def delete(self) -> None:
        j = self.rng.choice(self.jobs)
        await self.both("delete_job", self.rng.choice([j.owner, "mallory"]), j.id)

    async def manual(self) -> None:
        found = await self.both("get_jobs", [self.rng.choice(self.jobs).id])
        for j in found:
            self.now += timedelta(milliseconds=self.rng.randrange(1, 5000))
            ex = Execution(**{**_fields(run_of(j, self.now)), "id": f"{j.id}:{self.now}!manual",
                              "trigger": RunTrigger.MANUAL})  # fmt: skip
            self.runs[ex.id] = ex
            await self.both("insert_execution", ex)
            await self.both("insert_execution", ex)

    async def dispatch(self) -> None:
        picked = self.rng.sample(self.jobs, min(len(self.jobs), self.rng.randint(1, 4)))
        found = await self.both("get_jobs", [p.id for p in picked])
        runs = []
        for j in found:
            expected = j.next_run_at or j.last_scheduled_for or T0
            if self.rng.random() < 0.25:
                expected = self.fresh_time()  # stale or wrong: the CAS fails
            nxt = None if self.rng.random() < 0.3 else self.fresh_time()
            ex = run_of(j, expected, now=self.now)
            if self.rng.random() < 0.2:
                missed = Missed(count=2, first=expected - MIN, last=expected, policy="skip")
                ex = Execution(**{**_fields(ex), "status": ExecutionStatus.SKIPPED,
                                  "state_rank": TERMINAL_RANK, "skip_reason": "misfire",
                                  "missed": missed})  # fmt: skip
            self.runs[ex.id] = ex
            runs.append(Dispatch(ex, expected_next_run_at=expected, next_run_at=nxt))
        await self.both("dispatch", runs)

    async def events(self) -> None:
        if not self.runs:
            return
        batch = []
        for _ in range(self.rng.randint(1, 6)):
            ex = self.runs[self.rng.choice(sorted(self.runs))]
            status = self.rng.choice(RUN_STATUSES)
            attempt = 0 if status == ExecutionStatus.QUEUED else self.rng.randint(1, 3)
            self.now += timedelta(milliseconds=self.rng.randrange(1, 5000))
            error = self.rng.choice([None, "boom", "timeout"])
            if status == ExecutionStatus.SUCCEEDED:
                error = None  # see test_a_success_never_stores_an_error
            result = self.rng.choice([None, {"n": 1}, [1, "a"], 2.5])
            batch.append(event(ex, status, attempt, when=self.now, error=error, result=result))
        await self.both("apply_events", batch)

    async def compare_reads(self) -> None:
        for owner in ("alice", "bob", "carol"):
            for q in (
                JobQuery(),
                JobQuery(status=self.rng.choice(list(JobStatus))),
                JobQuery(last_run_status=self.rng.choice(RUN_STATUSES)),
                JobQuery(created_from=self.fresh_time(), created_to=self.fresh_time()),
            ):
                limit = self.rng.randint(1, 4)
                cursor: str | None = None
                while True:
                    page = await self.both("list_jobs", owner, q, limit=limit, cursor=cursor)
                    if page.next_cursor is None:
                        break
                    cursor = page.next_cursor
        for j in self.jobs:
            await self.both("get_job", j.owner, j.id)
            await self.both("get_job", "mallory", j.id)
            cursor = None
            while True:
                page = await self.both("list_executions", j.owner, j.id, limit=2, cursor=cursor)
                if not isinstance(page, Page) or page.next_cursor is None:
                    break  # the last page, or JobNotFound: a deleted job
                cursor = page.next_cursor
        for ex_id in self.runs:
            await self.both("get_execution", ex_id)
        await self.both("get_executions", [*self.runs, "unknown"])
        parts = set(self.rng.sample(range(4), self.rng.randint(1, 4)))
        await self.both("due_jobs", parts, self.fresh_time(), limit=100)
        await self.both("stale_executions", parts, self.now, limit=1000)


@pytest.mark.parametrize("seed", range(8))
async def test_same_answers_as_the_sqlite_store(tmp_path: Path, seed: int) -> None:
    mongo = MongoStore("mongodb://fake.invalid/jobsched",
                       client=cast("AsyncMongoClient[Any]", FakeAsyncMongoClient()))  # fmt: skip
    sqlite = SqliteStore(tmp_path / "ref.db")
    await mongo.open()
    await sqlite.open()
    try:
        sc = Scenario(seed, mongo, sqlite)
        for _ in range(6):
            await sc.create()
        for step in range(80):
            action = sc.rng.random()
            if action < 0.1:
                await sc.create()
            elif action < 0.4:
                await sc.dispatch()
            elif action < 0.5:
                await sc.control()
            elif action < 0.52:
                await sc.delete()
            elif action < 0.57:
                await sc.manual()
            else:
                await sc.events()
            if step % 20 == 19:
                await sc.compare_reads()
        await sc.compare_reads()
    finally:
        await mongo.close()
        await sqlite.close()


# --- a real server (only with JOBSCHED_TEST_MONGODB_URL) ---------------------------------------

needs_server = pytest.mark.skipif(
    not os.environ.get(MONGODB_URL_ENV),
    reason=f"no MongoDB server: set {MONGODB_URL_ENV}=mongodb://…/?replicaSet=… to run",
)


@needs_server
async def test_real_server_durable_writes_and_indexes() -> None:
    s = await real_mongo_store()
    assert s is not None
    try:
        hello = await s.database.command("hello")
        assert hello.get("setName"), "jobsched needs a replica set (majority writes)"
        assert s.database.write_concern == WriteConcern(w="majority", j=True)
        j = job("durable-1")
        await s.create_job(j)
        majority = s.database.get_collection(JOBS).with_options(
            read_concern=ReadConcern("majority")
        )
        assert await majority.find_one({ID: j.id}) is not None
        with pytest.raises(Conflict):
            await s.create_job(j)
        info = await s.database[EXECUTIONS].index_information()
        assert {i.name for i in INDEXES if i.collection == EXECUTIONS} <= set(info)
        d = dispatch_of(j, T0, T0, at(1))
        stale = Dispatch(run_of(j, at(5)), expected_next_run_at=at(5), next_run_at=at(6))
        assert await s.dispatch([d, stale]) == [
            DispatchOutcome(created=True, advanced=True),
            DispatchOutcome(created=False, advanced=False),
        ]
        assert await s.get_execution(stale.execution.id) is None
        plan = (
            await s.database[JOBS]
            .find({"partition": {"$in": [1]}, "nextRunAt": {"$type": "date", "$lte": at(10)}})
            .sort([("nextRunAt", 1)])
            .explain()
        )
        assert "COLLSCAN" not in str(plan["queryPlanner"]["winningPlan"])
    finally:
        await s.close()


def _diff(a: Any, b: Any) -> Any:
    """The differing fields of two answers (for assertion messages)."""
    if hasattr(a, "items") and hasattr(b, "items") and not isinstance(a, dict):
        return [_diff(x, y) for x, y in zip(a.items, b.items, strict=False)]
    if isinstance(a, list) and isinstance(b, list):
        return [_diff(x, y) for x, y in zip(a, b, strict=False)] + [len(a), len(b)]
    fields = getattr(a, "__struct_fields__", ())
    return {f: (getattr(a, f), getattr(b, f)) for f in fields if getattr(a, f) != getattr(b, f)}


async def test_an_audit_record_that_cannot_be_written_is_logged_and_the_change_stands(
    store: MongoStore, fake: FakeAsyncMongoClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The record follows the change (no transaction): a failed insert loses the record, never
    the change, and the whole record reaches the log."""
    await store.create_job(job("j1"))
    pause = JobChange("paused", allowed_from=frozenset({JobStatus.SCHEDULED}),
                      status=JobStatus.PAUSED, next_run_at=None)  # fmt: skip
    entry = audit_entry(Principal("root", Role.ADMIN), AuditAction.PAUSED, "j1", "alice", at(1))
    fake.fail(AutoReconnect("connection reset"), op="insert_one")
    with caplog.at_level("ERROR", logger="store.mongo"):
        after = await store.update_job("alice", "j1", pause, now=at(1), audit=entry)
    assert after.status == JobStatus.PAUSED == (await store.get_job("alice", "j1")).status
    assert (await store.list_audit(AuditQuery(job_id="j1"), limit=5, cursor=None)).items == []
    [line] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "audit record of job j1 not stored" in line.getMessage()
    assert entry.id in line.getMessage() and '"actor":"root"' in line.getMessage()


def plan_stages(plan: Mapping[str, Any]) -> list[str]:
    """Every stage of a winning plan (classic or slot-based explain output), root first."""
    node = plan.get("queryPlan", plan)
    stages = [node.get("stage", "?")]
    for child in [node.get("inputStage"), *node.get("inputStages", [])]:
        if child:
            stages += plan_stages(child)
    return stages


@needs_server
async def test_real_server_plans_every_logged_query_on_an_index_without_sorting() -> None:
    """The fake logs the shape of every query the store sends (filter and sort, the due and
    stale queries with 450 partitions); the real planner must answer each from an index, in
    index order: no ``COLLSCAN``, no blocking in-memory ``SORT`` (``SORT_MERGE`` of exploded
    scans is fine)."""
    fake = FakeAsyncMongoClient()
    on_fake = MongoStore(
        "mongodb://fake.invalid/jobsched", client=cast("AsyncMongoClient[Any]", fake)
    )
    await on_fake.open()
    await run_every_query(on_fake)
    shapes = logged_query_shapes(fake)
    real = await real_mongo_store()
    assert real is not None
    try:
        await run_every_query(real)  # data, so the planner has candidates to rank
        bad = []
        for q in shapes:
            command: dict[str, Any] = {"find": q.collection, "filter": dict(q.filter)}
            if q.sort:
                command["sort"] = dict(q.sort)
            explained = await real.database.command(
                {"explain": command, "verbosity": "queryPlanner"}
            )
            stages = plan_stages(explained["queryPlanner"]["winningPlan"])
            if "COLLSCAN" in stages or "SORT" in stages:
                bad.append((q, stages))
        assert bad == []
    finally:
        await real.close()


@needs_server
async def test_real_server_an_index_changed_under_its_name_stops_the_start_naming_it() -> None:
    s = await real_mongo_store()
    assert s is not None
    try:
        await s.database[JOBS].drop_index("jobs_due")
        await s.database[JOBS].create_index(
            [("partition", 1), ("nextRunAt", 1)],
            name="jobs_due",
            partialFilterExpression={"nextRunAt": {"$exists": True}},
        )
        again = MongoStore(s.url, client=_client_of(s))
        with pytest.raises(ConfigError) as info:
            await again.open()
        assert (
            "jobs.jobs_due" in info.value.message and "IndexOptionsConflict" in info.value.message
        )
    finally:
        await s.close()


@needs_server
async def test_real_server_refuses_the_partial_filters_the_fake_refuses() -> None:
    s = await real_mongo_store()
    assert s is not None
    try:
        for partial in REFUSED_PARTIAL_FILTERS:
            model = IndexModel([("x", 1)], name="probe", partialFilterExpression=partial)
            with pytest.raises(OperationFailure) as info:
                await s.database[JOBS].create_indexes([model])
            assert info.value.code in (67, 2, 224), partial
        for partial in ACCEPTED_PARTIAL_FILTERS:
            model = IndexModel([("x", 1)], name="probe", partialFilterExpression=partial)
            await s.database[JOBS].create_indexes([model])
            await s.database[JOBS].drop_index("probe")
    finally:
        await s.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("team=a", {"labelTerms": {"$all": ["team=a"]}}),
        ("team=a,env,!legacy,tier!=x",
         {"labelTerms": {"$all": ["env", "team=a"], "$nin": ["legacy", "tier=x"]}}),
        ("a in (1,2),b in (3,4),c notin (5)",
         {"labelTerms": {"$in": ["a=1", "a=2"], "$nin": ["c=5"]},
          "$and": [{"labelTerms": {"$in": ["b=3", "b=4"]}}]}),
        ("", {}),
    ],
)  # fmt: skip
def test_a_selector_is_one_filter_over_label_terms(text: str, expected: dict[str, Any]) -> None:
    assert labels_filter(parse_selector(text)) == expected
