"""The JobStore contract of tenancy: audit records written with the changes they describe, every
user's jobs for admins, the active-jobs count and the quota buckets — on every backend.

A second store object on the same database stands for another gateway or scheduler process:
the buckets must hold across them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from core.access import Principal, Role
from core.audit import AuditAction, AuditEntry, AuditQuery, AuditRecord, audit_entry
from core.errors import InvalidRequest
from core.model import Job, JobStatus
from core.ports import (
    DispatchOutcome,
    IdempotencyKeyReused,
    JobChange,
    JobQuery,
    JobStatusConflict,
    JobStore,
    ManualDispatch,
)
from core.quotas import ACTIVE_JOB_STATUSES, Rate, TokenRequest
from core.runs import manual_run
from store.mongo import MongoStore
from store.sqlite import SqliteStore
from tests.store.test_contract import T0, at, make_execution, make_job

ALICE = Principal("alice")
ROOT = Principal("root", Role.ADMIN)
PAUSE = JobChange(
    "paused",
    allowed_from=frozenset({JobStatus.SCHEDULED}),
    status=JobStatus.PAUSED,
    next_run_at=None,
)
RESUME = JobChange(
    "resumed", allowed_from=frozenset({JobStatus.PAUSED}), status=JobStatus.SCHEDULED
)
RATE = Rate(per_second=2.0, capacity=3.0)


def entry(action: AuditAction, job: Job, when: datetime, who: Principal = ALICE) -> AuditEntry:
    return audit_entry(who, action, job.id, job.owner, when)


async def trail(store: JobStore, **query: Any) -> list[AuditRecord]:
    page = await store.list_audit(AuditQuery(**query), limit=500, cursor=None)
    return page.items


@pytest.fixture
async def other(store: JobStore) -> AsyncIterator[JobStore]:
    """A second store on the same database, as another process would open it."""
    twin: JobStore
    if isinstance(store, SqliteStore):
        twin = SqliteStore(store.path)
    else:
        assert isinstance(store, MongoStore)
        twin = MongoStore(store.url, client=store._given_client)
    await twin.open()
    yield twin
    await twin.close()


# --- audit records -----------------------------------------------------------------------------


async def test_a_created_job_has_its_creation_record(store: JobStore) -> None:
    job = make_job(parameters={"apiKey": "s3cret"}, next_run_at=at(1))
    await store.create_job(job, audit=entry(AuditAction.CREATED, job, T0))
    [record] = await trail(store, job_id=job.id)
    assert (record.action, record.owner, record.actor, record.at) == (
        "created",
        "alice",
        "alice",
        T0,
    )
    fields = {c.field: c for c in record.changes}
    assert fields["taskId"].new == "noop" and fields["nextRunAt"].new == "2026-06-01T00:01:00Z"
    assert fields["parameters.apiKey"].redacted and fields["parameters.apiKey"].new is None
    assert "s3cret" not in repr(record)


async def test_a_keyed_creation_is_recorded_once_and_a_replay_not_at_all(store: JobStore) -> None:
    job = make_job(idempotency_key="k1")
    await store.create_job(job, request_hash="h", audit=entry(AuditAction.CREATED, job, T0))
    again = make_job("job-2", idempotency_key="k1")
    with pytest.raises(IdempotencyKeyReused):
        await store.create_job(again, request_hash="h", audit=entry(AuditAction.CREATED, again, T0))
    assert [r.job_id for r in await trail(store, owner="alice")] == [job.id]


async def test_concurrent_creations_each_have_their_record(store: JobStore) -> None:
    """SQLite commits concurrent creations together (group commit): the records go with them."""
    jobs = [make_job(f"j{i}", created_at=at(i)) for i in range(20)]
    await asyncio.gather(
        *(store.create_job(j, audit=entry(AuditAction.CREATED, j, j.created_at)) for j in jobs)
    )
    records = await trail(store, owner="alice")
    assert sorted(r.job_id for r in records) == sorted(j.id for j in jobs)


async def test_a_change_records_what_it_changed_from_the_job_as_it_found_it(
    store: JobStore,
) -> None:
    job = make_job(next_run_at=at(1))
    await store.create_job(job)
    await store.update_job(
        "alice", job.id, PAUSE, now=at(2), audit=entry(AuditAction.PAUSED, job, at(2))
    )
    resume = JobChange("resumed", allowed_from=frozenset({JobStatus.PAUSED}),
                       status=JobStatus.SCHEDULED, next_run_at=at(5))  # fmt: skip
    resumed = await store.update_job(
        "alice", job.id, resume, now=at(3), audit=entry(AuditAction.RESUMED, job, at(3), ROOT)
    )
    assert resumed == await store.get_job("alice", job.id)
    newest, oldest = await trail(store, job_id=job.id)
    assert [(c.field, c.old, c.new) for c in oldest.changes] == [
        ("status", "SCHEDULED", "PAUSED"),
        ("nextRunAt", "2026-06-01T00:01:00Z", None),
    ]
    assert [(c.field, c.old, c.new) for c in newest.changes] == [
        ("status", "PAUSED", "SCHEDULED"),
        ("nextRunAt", None, "2026-06-01T00:05:00Z"),
    ]
    assert (newest.actor, newest.actor_role, newest.owner) == ("root", "admin", "alice")


async def test_a_refused_change_is_not_recorded(store: JobStore) -> None:
    job = make_job()
    await store.create_job(job)
    with pytest.raises(JobStatusConflict):
        await store.update_job(
            "alice", job.id, RESUME, now=at(1), audit=entry(AuditAction.RESUMED, job, at(1))
        )
    assert await trail(store, job_id=job.id) == []


async def test_the_trail_outlives_the_deleted_job(store: JobStore) -> None:
    job = make_job()
    await store.create_job(job, audit=entry(AuditAction.CREATED, job, T0))
    await store.delete_job("alice", job.id, audit=entry(AuditAction.DELETED, job, at(1), ROOT))
    deleted, created = await trail(store, job_id=job.id)
    assert (deleted.action, deleted.actor, deleted.changes) == ("deleted", "root", [])
    assert created.action == "created"


async def test_a_trigger_is_recorded_with_its_run_once(store: JobStore) -> None:
    job = make_job()
    await store.create_job(job)
    run = make_execution(job, at(1))
    triggered = audit_entry(
        ALICE, AuditAction.TRIGGERED, job.id, "alice", at(1), execution_id=run.id
    )
    assert await store.insert_execution(run, audit=triggered)
    assert not await store.insert_execution(run, audit=triggered)
    [record] = await trail(store, job_id=job.id)
    assert (record.action, record.execution_id) == ("triggered", run.id)


async def test_a_manual_dispatch_is_recorded_with_its_audit_entry_once(store: JobStore) -> None:
    job = make_job(next_run_at=at(5))
    await store.create_job(job)
    run = manual_run(job, at(1))
    triggered = audit_entry(
        ALICE, AuditAction.TRIGGERED, job.id, "alice", at(1), execution_id=run.id
    )
    assert await store.dispatch([ManualDispatch(run, audit=triggered)]) == [
        DispatchOutcome(created=True, advanced=True)
    ]
    assert await store.dispatch([ManualDispatch(run, audit=triggered)]) == [
        DispatchOutcome(created=False, advanced=True)
    ]
    [record] = await trail(store, job_id=job.id)
    assert (record.action, record.actor, record.execution_id) == ("triggered", "alice", run.id)


async def test_the_trail_is_filtered_and_paged_newest_first(store: JobStore) -> None:
    a, b = make_job("a"), make_job("b", owner="bob")
    await store.create_job(a, audit=entry(AuditAction.CREATED, a, at(1)))
    await store.create_job(b, audit=entry(AuditAction.CREATED, b, at(2), Principal("bob")))
    await store.update_job(
        "bob", "b", PAUSE, now=at(3), audit=entry(AuditAction.PAUSED, b, at(3), ROOT)
    )
    await store.delete_job("alice", "a", audit=entry(AuditAction.DELETED, a, at(4)))
    everything = await trail(store)
    assert [(r.job_id, r.action) for r in everything] == [
        ("a", "deleted"), ("b", "paused"), ("b", "created"), ("a", "created"),
    ]  # fmt: skip
    assert [r.action for r in await trail(store, owner="bob")] == ["paused", "created"]
    assert [r.job_id for r in await trail(store, actor="root")] == ["b"]
    assert [r.action for r in await trail(store, owner="bob", actor="bob")] == ["created"]
    assert await trail(store, owner="alice", job_id="b") == []
    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list_audit(AuditQuery(), limit=1, cursor=cursor)
        seen += [r.id for r in page.items]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [r.id for r in everything]
    with pytest.raises(InvalidRequest) as info:
        await store.list_audit(AuditQuery(), limit=1, cursor="not-a-cursor")
    assert info.value.errors[0].field == "cursor"


# --- every user's jobs, the active count -------------------------------------------------------


async def test_every_users_jobs_are_listed_without_an_owner(store: JobStore) -> None:
    await store.create_job(make_job("a1", created_at=at(1)))
    await store.create_job(make_job("b1", owner="bob", created_at=at(2), status=JobStatus.PAUSED))
    await store.create_job(make_job("c1", owner="carol", created_at=at(3)))
    page = await store.list_jobs(None, JobQuery(), limit=2, cursor=None)
    assert [j.id for j in page.items] == ["c1", "b1"]
    rest = await store.list_jobs(None, JobQuery(), limit=2, cursor=page.next_cursor)
    assert [j.id for j in rest.items] == ["a1"] and rest.next_cursor is None
    paused = await store.list_jobs(None, JobQuery(status=JobStatus.PAUSED), limit=9, cursor=None)
    assert [j.id for j in paused.items] == ["b1"]


async def test_count_jobs_counts_one_owners_jobs_in_the_given_statuses(store: JobStore) -> None:
    statuses = [JobStatus.SCHEDULED, JobStatus.PAUSED, JobStatus.CANCELLED, JobStatus.SUCCEEDED]
    for i, status in enumerate(statuses):
        await store.create_job(make_job(f"a{i}", status=status))
    await store.create_job(make_job("b0", owner="bob"))
    assert await store.count_jobs("alice", ACTIVE_JOB_STATUSES) == 2
    assert await store.count_jobs("bob", ACTIVE_JOB_STATUSES) == 1
    assert await store.count_jobs("carol", ACTIVE_JOB_STATUSES) == 0
    assert await store.count_jobs("alice", []) == 0


# --- quota buckets -----------------------------------------------------------------------------


def asks(key: str, n: int, cost: int = 1) -> list[TokenRequest]:
    return [TokenRequest(key, cost, RATE) for _ in range(n)]


async def test_a_bucket_grants_its_burst_then_names_the_wait(store: JobStore) -> None:
    waits = await store.take_tokens(asks("creates:alice", 4), now=T0)
    assert waits[:3] == [0.0, 0.0, 0.0]
    assert waits[3] == pytest.approx(0.5)
    assert await store.take_tokens(asks("creates:bob", 1), now=T0) == [0.0], "per key"
    assert await store.take_tokens(asks("creates:alice", 1), now=T0 + timedelta(seconds=0.5)) == [
        0.0
    ]
    assert await store.take_tokens([], now=T0) == []


async def test_a_bucket_holds_across_processes(store: JobStore, other: JobStore) -> None:
    assert await store.take_tokens(asks("runs:alice", 2), now=T0) == [0.0, 0.0]
    [granted, denied] = await other.take_tokens(asks("runs:alice", 2), now=T0)
    assert granted == 0.0 and denied == pytest.approx(0.5)
    [wait] = await store.take_tokens(asks("runs:alice", 1), now=T0)
    assert wait == pytest.approx(0.5)


async def test_concurrent_takes_never_grant_more_than_the_bucket_holds(
    store: JobStore, other: JobStore
) -> None:
    calls = [s.take_tokens(asks("creates:alice", 1), now=T0) for s in (store, other) * 10]
    results = await asyncio.gather(*calls)
    granted = sum(1 for [w] in results if w == 0.0)
    assert granted == 3


async def test_a_large_request_waits_for_a_full_bucket_then_overdraws_it(store: JobStore) -> None:
    await store.take_tokens(asks("runs:alice", 1), now=T0)
    [wait] = await store.take_tokens(asks("runs:alice", 1, cost=10), now=T0)
    assert wait == pytest.approx(0.5), "until the bucket is full again (3 tokens)"
    [wait] = await store.take_tokens(asks("runs:alice", 1, cost=10), now=T0 + timedelta(seconds=1))
    assert wait == 0.0
    [wait] = await store.take_tokens(asks("runs:alice", 1), now=T0 + timedelta(seconds=1))
    assert wait == pytest.approx(4.0), "7 tokens of debt, then one more, at 2 per second"


async def test_reading_buckets_takes_nothing(store: JobStore, other: JobStore) -> None:
    assert await store.read_tokens(["runs:alice"]) == {}, "never taken: absent (full)"
    await store.take_tokens(asks("runs:alice", 2), now=T0)
    read = await other.read_tokens(["runs:alice", "runs:bob"])
    assert set(read) == {"runs:alice"}
    assert (read["runs:alice"].tokens, read["runs:alice"].updated_at) == (1.0, T0)
    assert await store.read_tokens(["runs:alice"]) == read, "a read takes no token"
    assert await store.read_tokens([]) == {}
