"""Notifications in the store, the same on every store: the users' default webhooks (secret
kept, per user) and the delivery attempts of a run's notification, in order, idempotent per id;
a job's ``notify`` is stored with the job and changed by a job change."""

from __future__ import annotations

import msgspec

from core.model import TERMINAL_RANK, ExecutionStatus
from core.notifications import NotificationAttempt, attempt_id, webhook_id
from core.notify_spec import NotifyTarget
from core.ports import JobChange, JobStore, PruneTarget
from tests.store.test_contract import at, create, make_execution, make_job

HOOK = NotifyTarget(url="https://hooks.example/a", on=["failure"], secret="whsec_" + "A" * 32)


def attempt(n: int, *, ok: bool = False, execution_id: str = "job-1:x") -> NotificationAttempt:
    return NotificationAttempt(
        id=attempt_id(execution_id, n),
        execution_id=execution_id,
        job_id="job-1",
        owner="alice",
        webhook_id=webhook_id(execution_id),
        attempt=n,
        url=HOOK.url,
        event_type="execution.failed",
        at=at(minutes=n),
        duration_ms=12.5,
        status_code=200 if ok else 500,
        ok=ok,
        error=None if ok else "HTTP 500",
        next_attempt_at=None if ok else at(minutes=n + 1),
    )


async def test_a_default_is_per_user_kept_with_its_secret_and_removable(store: JobStore) -> None:
    assert await store.get_notification_default("alice") is None

    await store.set_notification_default("alice", HOOK)
    await store.set_notification_default(
        "bob", NotifyTarget(url="https://b.example/", on=["success"])
    )

    assert await store.get_notification_default("alice") == HOOK
    bob = await store.get_notification_default("bob")
    assert bob is not None and bob.secret is None and bob.on == ["success"]
    replaced = NotifyTarget(url="https://hooks.example/b", on=["failure", "success"])
    await store.set_notification_default("alice", replaced)
    assert await store.get_notification_default("alice") == replaced
    await store.set_notification_default("alice", None)
    await store.set_notification_default("alice", None)
    assert await store.get_notification_default("alice") is None
    assert await store.get_notification_default("bob") == bob


async def test_attempts_are_listed_in_order_per_run_and_a_replayed_write_replaces(
    store: JobStore,
) -> None:
    for n in (2, 1, 3):
        await store.record_notification_attempt(attempt(n, ok=n == 3))
    await store.record_notification_attempt(attempt(1, execution_id="job-1:other"))
    await store.record_notification_attempt(attempt(2))  # a redelivery writes it again

    got = await store.notification_attempts("job-1:x")

    assert [a.attempt for a in got] == [1, 2, 3]
    assert got == [attempt(1), attempt(2), attempt(3, ok=True)]
    assert [a.attempt for a in await store.notification_attempts("job-1:other")] == [1]
    assert await store.notification_attempts("job-1:none") == []


async def test_a_jobs_notify_is_stored_with_it_and_changed_by_a_job_change(store: JobStore) -> None:
    job = make_job(notify=HOOK)
    await create(store, job)
    assert (await store.get_job("alice", "job-1")).notify == HOOK

    spec = msgspec.structs.replace(job.spec, notify=None)
    await store.update_job("alice", "job-1", JobChange("changed", spec=spec), now=at(1))

    assert (await store.get_job("alice", "job-1")).notify is None


async def test_a_deleted_jobs_attempts_are_deleted_with_it(store: JobStore) -> None:
    doomed, kept = make_job("job-1"), make_job("job-2")
    for j in (doomed, kept):
        await store.create_job(j)
    first, second = make_execution(doomed, at(minutes=1)), make_execution(kept, at(minutes=1))
    for run in (first, second):
        await store.insert_execution(run)
        await store.record_notification_attempt(
            msgspec.structs.replace(
                attempt(1, execution_id=run.id), job_id=run.job_id, id=attempt_id(run.id, 1)
            )
        )
    await store.delete_job("alice", doomed.id)
    assert await store.notification_attempts(first.id) == []
    assert [a.attempt for a in await store.notification_attempts(second.id)] == [1]


async def test_a_pruned_runs_attempts_are_pruned_with_it(store: JobStore) -> None:
    job = make_job("job-1")
    await store.create_job(job)
    runs = []
    for minute in (1, 2):
        ex = make_execution(job, at(minutes=minute))
        end = at(minutes=minute + 1)
        ex = msgspec.structs.replace(
            ex,
            status=ExecutionStatus.FAILED,
            attempt=1,
            state_rank=TERMINAL_RANK,
            finished_at=end,
            updated_at=end,
        )
        await store.insert_execution(ex)
        await store.record_notification_attempt(attempt(1, execution_id=ex.id))
        runs.append(ex)
    [result] = await store.prune_executions(
        [PruneTarget(job.id, keep_last=1, finished_before=None)], limit=100
    )
    assert result.deleted == 1
    assert await store.notification_attempts(runs[0].id) == []
    assert [a.attempt for a in await store.notification_attempts(runs[1].id)] == [1]
