"""The RunStore contract: runs across jobs (dead letters), replays' and backfills' records, bulk
actions with their leases, audit records of changes that are not a job's — on every backend."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import msgspec
import pytest

from core.access import Principal, Role
from core.audit import AuditAction, AuditQuery, audit_entry
from core.bulk import (
    BatchCounts,
    BulkAction,
    BulkFilter,
    BulkKind,
    BulkStatus,
    RunQuery,
    after_batch,
)
from core.errors import Conflict, InvalidRequest
from core.labels import parse_selector
from core.model import Execution, ExecutionStatus, Job
from core.ports import DispatchOutcome, JobStore, ManualDispatch
from core.runs import backfill_run, replay_run
from store.mongo import MongoStore
from store.sqlite import SqliteStore
from tests.store.test_contract import FAILED, T0, at, event, make_execution, make_job

ALICE = Principal("alice")


async def failed_run(
    store: JobStore, job: Job, minute: float, error: str = "boom", task_id: str | None = None
) -> Execution:
    run = make_execution(job, at(minute))
    if task_id is not None:
        run = msgspec.structs.replace(run, task_id=task_id)
    await store.insert_execution(run)
    await store.apply_events([event(run, FAILED, 1, at(minute, 1), error=error)])
    return run


@pytest.fixture
async def jobs(store: JobStore) -> AsyncIterator[tuple[Job, Job, Job]]:
    a1 = make_job("a1")
    a2 = make_job("a2", task_id="other")
    b1 = make_job("b1", owner="bob")
    for j in (a1, a2, b1):
        await store.create_job(j)
    yield a1, a2, b1


async def ids(store: JobStore, owner: str | None, query: RunQuery, limit: int = 500) -> list[str]:
    out: list[str] = []
    cursor = None
    while True:
        page = await store.list_runs(owner, query, limit=limit, cursor=cursor)
        out += [r.id for r in page.items]
        if page.next_cursor is None:
            return out
        cursor = page.next_cursor


# --- dead letters --------------------------------------------------------------------------


async def test_dead_letters_are_an_owners_failed_runs_across_jobs_newest_first(
    store: JobStore, jobs: tuple[Job, Job, Job]
) -> None:
    a1, a2, b1 = jobs
    r1 = await failed_run(store, a1, 1)
    r2 = await failed_run(store, a2, 2, task_id="other")
    await failed_run(store, b1, 3)
    ok = make_execution(a1, at(4))
    await store.insert_execution(ok)
    await store.apply_events([event(ok, ExecutionStatus.SUCCEEDED, 1, at(4, 1))])
    assert await ids(store, "alice", RunQuery()) == [r2.id, r1.id]
    assert len(await ids(store, None, RunQuery())) == 3  # an admin's: every user's
    assert await ids(store, "alice", RunQuery(status=ExecutionStatus.SUCCEEDED)) == [ok.id]


async def test_dead_letters_filter_by_task_time_and_error_text(
    store: JobStore, jobs: tuple[Job, Job, Job]
) -> None:
    a1, a2, _ = jobs
    r1 = await failed_run(store, a1, 1, error="HTTP 503 from upstream")
    r2 = await failed_run(store, a1, 2, error="timeout after 30 s")
    r3 = await failed_run(store, a2, 3, error="Upstream refused", task_id="other")
    assert await ids(store, "alice", RunQuery(task_id="other")) == [r3.id]
    assert await ids(store, None, RunQuery(task_id="other")) == [r3.id]
    assert await ids(store, "alice", RunQuery(scheduled_from=at(2), scheduled_to=at(3))) == [r2.id]
    assert await ids(store, "alice", RunQuery(error="upstream")) == [r3.id, r1.id]
    assert await ids(store, "alice", RunQuery(error="a.*")) == []  # text, not a pattern
    assert await ids(store, "alice", RunQuery(error="upstream", task_id="noop")) == [r1.id]


async def test_dead_letters_filter_by_a_label_selector_over_their_jobs(store: JobStore) -> None:
    billing = make_job("l1", labels={"team": "billing", "env": "prod"})
    dev = make_job("l2", labels={"team": "billing", "env": "dev"})
    bare = make_job("l3")
    theirs = make_job("l4", owner="bob", labels={"team": "billing"})
    for j in (billing, dev, bare, theirs):
        await store.create_job(j)
    r1 = await failed_run(store, billing, 1, error="HTTP 503")
    r2 = await failed_run(store, dev, 2)
    r3 = await failed_run(store, bare, 3)
    r4 = await failed_run(store, theirs, 4)

    def sel(text: str) -> RunQuery:
        return RunQuery(labels=parse_selector(text))

    assert await ids(store, "alice", sel("team=billing")) == [r2.id, r1.id]
    assert await ids(store, None, sel("team=billing")) == [r4.id, r2.id, r1.id]
    assert await ids(store, "alice", sel("team=billing,env!=dev")) == [r1.id]
    assert await ids(store, "alice", sel("env in (dev,qa)")) == [r2.id]
    assert await ids(store, "alice", sel("!team")) == [r3.id]
    assert await ids(store, "alice", sel("team=nobody")) == []
    assert await ids(store, "alice", RunQuery(labels=parse_selector("team"), error="http")) == [
        r1.id
    ]
    assert await ids(store, "alice", RunQuery(labels=parse_selector(""))) == [r3.id, r2.id, r1.id]
    # a deleted job's runs are gone with it
    await store.delete_job("alice", dev.id)
    assert await ids(store, "alice", sel("team=billing")) == [r1.id]


async def test_dead_letters_page_with_a_cursor(store: JobStore, jobs: tuple[Job, Job, Job]) -> None:
    a1 = jobs[0]
    runs = [await failed_run(store, a1, m) for m in range(7)]
    assert await ids(store, "alice", RunQuery(), limit=2) == [r.id for r in reversed(runs)]
    with pytest.raises(InvalidRequest):
        await store.list_runs("alice", RunQuery(), limit=2, cursor="nonsense")


async def test_a_replay_and_a_backfilled_run_keep_their_marks(
    store: JobStore, jobs: tuple[Job, Job, Job]
) -> None:
    a1 = jobs[0]
    original = await failed_run(store, a1, 1)
    replay = replay_run(a1, original, at(5))
    filled = backfill_run(a1, at(-30), at(5))
    skipped = backfill_run(a1, at(-29), at(5), skip_reason="overlap: test")
    outcomes = await store.dispatch([ManualDispatch(r) for r in (replay, filled, skipped)])
    assert [o.created for o in outcomes] == [True, True, True]
    again = await store.dispatch([ManualDispatch(filled)])
    assert again[0].created is False  # the occurrence has its run: no second one
    got = {r.id: r for r in await store.get_executions([replay.id, filled.id, skipped.id])}
    assert got[replay.id].replay_of == original.id and not got[replay.id].backfill
    assert got[filled.id].backfill and got[filled.id].status == ExecutionStatus.QUEUED
    assert got[skipped.id].status == ExecutionStatus.SKIPPED and got[skipped.id].backfill


async def test_the_replays_of_a_run_are_found_by_its_id(
    store: JobStore, jobs: tuple[Job, Job, Job]
) -> None:
    a1 = jobs[0]
    original = await failed_run(store, a1, 1)
    other = await failed_run(store, a1, 2)
    first = replay_run(a1, original, at(5), nonce="00000001")
    second = replay_run(a1, original, at(6), nonce="00000002")
    of_first = replay_run(a1, first, at(7), nonce="00000003")
    await store.dispatch([ManualDispatch(r) for r in (second, first, of_first)])
    got = await store.replays_of([original.id, other.id, first.id, "no-such-run"])
    assert got == {original.id: [first.id, second.id], first.id: [of_first.id]}
    assert await store.replays_of([]) == {}


RACERS = 8


def replayed(who: Principal, replay: Execution) -> ManualDispatch:
    """A replay without force, as the gateway dispatches it (with its audit record)."""
    entry = audit_entry(
        who,
        AuditAction.REPLAYED,
        replay.job_id,
        replay.owner,
        replay.created_at,
        execution_id=replay.id,
        replay_of=replay.replay_of,
    )
    return ManualDispatch(replay, audit=entry, sole_replay=True)


async def audited_replays(store: JobStore, job: Job) -> list[str]:
    page = await store.list_audit(AuditQuery(job_id=job.id), limit=100, cursor=None)
    return sorted(r.execution_id or "" for r in page.items if r.action == AuditAction.REPLAYED)


async def test_of_concurrent_replays_of_a_run_without_force_exactly_one_is_recorded(
    store: JobStore, jobs: tuple[Job, Job, Job]
) -> None:
    a1 = jobs[0]
    original = await failed_run(store, a1, 1)
    racers = [replay_run(a1, original, at(5), nonce=f"{i:08x}") for i in range(RACERS)]
    answers = await asyncio.gather(*(store.dispatch([replayed(ALICE, r)]) for r in racers))
    won = [r for r, [o] in zip(racers, answers, strict=True) if o.created]
    assert len(won) == 1, answers
    [winner] = won
    lost = [o for [o] in answers if not o.created]
    assert lost == [DispatchOutcome(created=False, advanced=False, replayed_as=winner.id)] * (
        RACERS - 1
    )
    assert await store.replays_of([original.id]) == {original.id: [winner.id]}
    assert [e.id for e in await store.get_executions([r.id for r in racers])] == [winner.id]
    assert await audited_replays(store, a1) == [winner.id]  # nothing of a refused one is kept
    assert (await store.get_job("alice", a1.id)).run_count == 1
    # its dispatch repeated (a bulk batch after a crash) finds its own record: no refusal
    assert await store.dispatch([replayed(ALICE, winner)]) == [
        DispatchOutcome(created=False, advanced=True)
    ]
    # force: recorded whatever replays the run has; then the run's latest replay refuses
    forced = replay_run(a1, original, at(6), nonce="ffffffff")
    assert await store.dispatch([ManualDispatch(forced)]) == [
        DispatchOutcome(created=True, advanced=True)
    ]
    late = replay_run(a1, original, at(7), nonce="0000abcd")
    latest = max(winner.id, forced.id)
    assert await store.dispatch([replayed(ALICE, late)]) == [
        DispatchOutcome(created=False, advanced=False, replayed_as=latest)
    ]
    # the repeat of a replay the run has others besides is refused, as the bulk rule says
    assert (await store.dispatch([replayed(ALICE, winner)]))[0].replayed_as == forced.id
    assert await store.replays_of([original.id]) == {original.id: sorted([winner.id, forced.id])}


async def test_a_replay_recorded_without_the_guard_refuses_a_sole_replay_too(
    store: JobStore, jobs: tuple[Job, Job, Job]
) -> None:
    """A run replayed by force (or by an older version, which knew no ``sole_replay``) has a
    replay: a sole replay of it is refused, in a batch of other runs' replays that go on."""
    a1 = jobs[0]
    original, other = await failed_run(store, a1, 1), await failed_run(store, a1, 2)
    forced = replay_run(a1, original, at(5), nonce="00000001")
    await store.dispatch([ManualDispatch(forced)])
    first, second = (replay_run(a1, other, at(5), nonce=f"0000000{i}") for i in (2, 3))
    again = replay_run(a1, original, at(5), nonce="00000004")
    outcomes = await store.dispatch([replayed(ALICE, r) for r in (first, again, second)])
    assert outcomes == [
        DispatchOutcome(created=True, advanced=True),
        DispatchOutcome(created=False, advanced=False, replayed_as=forced.id),
        # two sole replays of one run in one batch: the first is recorded
        DispatchOutcome(created=False, advanced=False, replayed_as=first.id),
    ]
    got = await store.replays_of([original.id, other.id])
    assert got == {original.id: [forced.id], other.id: [first.id]}
    assert await audited_replays(store, a1) == [first.id]


async def test_concurrent_forced_replays_of_a_run_are_all_recorded(
    store: JobStore, jobs: tuple[Job, Job, Job]
) -> None:
    a1 = jobs[0]
    original = await failed_run(store, a1, 1)
    racers = [replay_run(a1, original, at(5), nonce=f"{i:08x}") for i in range(RACERS)]
    answers = await asyncio.gather(*(store.dispatch([ManualDispatch(r)]) for r in racers))
    assert answers == [[DispatchOutcome(created=True, advanced=True)]] * RACERS
    assert await store.replays_of([original.id]) == {original.id: sorted(r.id for r in racers)}
    # and, racing sole replays of another run, do not let a second sole replay in
    other = await failed_run(store, a1, 2)
    mixed = [replay_run(a1, other, at(6), nonce=f"{i:08x}") for i in range(RACERS)]
    answers = await asyncio.gather(
        *(
            store.dispatch([replayed(ALICE, r) if i % 2 else ManualDispatch(r)])
            for i, r in enumerate(mixed)
        )
    )
    sole_created = [
        r for i, (r, [o]) in enumerate(zip(mixed, answers, strict=True)) if i % 2 and o.created
    ]
    assert len(sole_created) <= 1
    forced_created = [
        r for i, (r, [o]) in enumerate(zip(mixed, answers, strict=True)) if not i % 2 and o.created
    ]
    assert len(forced_created) == RACERS // 2


# --- bulk actions --------------------------------------------------------------------------


def bulk(bulk_id: str = "b-1", minute: float = 10, owner: str | None = "alice") -> BulkAction:
    return BulkAction(
        id=bulk_id,
        kind=BulkKind.REPLAY,
        filter=BulkFilter(statuses=[FAILED], owner=owner, error="x"),
        actor="alice",
        created_at=at(minute),
        updated_at=at(minute),
        lease_expires_at=at(minute),
    )


async def test_a_bulk_action_is_stored_with_its_audit_record(store: JobStore) -> None:
    action = bulk()
    entry = audit_entry(ALICE, AuditAction.BULK_REPLAY, "", "alice", at(10), bulk_id="b-1")
    await store.create_bulk(action, audit=entry)
    assert await store.get_bulk("b-1") == action
    assert await store.get_bulk("nope") is None
    with pytest.raises(Conflict):
        await store.create_bulk(action)
    [record] = (await store.list_audit(AuditQuery(owner="alice"), limit=5, cursor=None)).items
    assert (record.action, record.bulk_id, record.job_id) == (AuditAction.BULK_REPLAY, "b-1", "")


async def test_one_claimer_wins_a_bulk_lease_until_it_expires(store: JobStore) -> None:
    await store.create_bulk(bulk())
    assert await store.claim_bulk("gw-a", now=at(9), lease_seconds=30) is None  # not yet free
    claimed = await store.claim_bulk("gw-a", now=at(11), lease_seconds=30)
    assert claimed is not None
    assert (claimed.status, claimed.lease_owner) == (BulkStatus.RUNNING, "gw-a")
    assert claimed.lease_expires_at == at(11, 30)
    assert await store.claim_bulk("gw-b", now=at(11, 10), lease_seconds=30) is None
    taken = await store.claim_bulk("gw-b", now=at(11, 31), lease_seconds=30)
    assert taken is not None and taken.lease_owner == "gw-b"
    # the former holder's save is refused: it must stop
    moved = after_batch(claimed, "c", BatchCounts(done=3), at(11, 40), lease_seconds=30)
    assert await store.save_bulk(moved, holder="gw-a") is False
    moved_b = after_batch(taken, "c2", BatchCounts(done=2, skipped=1), at(12), lease_seconds=30)
    assert await store.save_bulk(moved_b, holder="gw-b") is True
    assert await store.get_bulk("b-1") == moved_b


async def test_a_finished_bulk_action_is_never_claimed_again(store: JobStore) -> None:
    await store.create_bulk(bulk())
    claimed = await store.claim_bulk("gw-a", now=at(11), lease_seconds=30)
    assert claimed is not None
    done = after_batch(claimed, None, BatchCounts(done=1), at(12), lease_seconds=30)
    assert done.status == BulkStatus.SUCCEEDED and done.lease_owner is None
    assert await store.save_bulk(done, holder="gw-a")
    assert await store.claim_bulk("gw-b", now=at(60), lease_seconds=30) is None
    stored = await store.get_bulk("b-1")
    assert stored is not None and stored.finished_at == at(12) and stored.done == 1


async def test_the_longest_expired_bulk_action_is_claimed_first(store: JobStore) -> None:
    await store.create_bulk(bulk("late", minute=20))
    await store.create_bulk(bulk("early", minute=10))
    first = await store.claim_bulk("gw", now=at(30), lease_seconds=30)
    second = await store.claim_bulk("gw", now=at(30), lease_seconds=30)
    assert (first and first.id, second and second.id) == ("early", "late")


async def test_audit_records_of_run_changes_are_listed_with_the_others(
    store: JobStore, jobs: tuple[Job, Job, Job]
) -> None:
    root = Principal("root", Role.ADMIN)
    entries = [
        audit_entry(
            root, AuditAction.RUN_CANCELLED, "b1", "bob", at(1), execution_id="b1:x", bulk_id="k"
        ),
        audit_entry(ALICE, AuditAction.BACKFILLED, "a1", "alice", at(2), runs=4),
    ]
    await store.record_audit(entries)
    await store.record_audit([])
    [bob] = (await store.list_audit(AuditQuery(owner="bob"), limit=5, cursor=None)).items
    assert (bob.actor, bob.execution_id, bob.bulk_id) == ("root", "b1:x", "k")
    [alice] = (await store.list_audit(AuditQuery(job_id="a1"), limit=5, cursor=None)).items
    assert (alice.action, alice.runs) == (AuditAction.BACKFILLED, 4)


async def test_a_second_store_process_sees_the_lease(store: JobStore) -> None:
    """Two gateways on one database: the lease holds across store objects."""
    twin: JobStore
    if isinstance(store, SqliteStore):
        twin = SqliteStore(store.path)
    else:
        assert isinstance(store, MongoStore)
        twin = MongoStore(store.url, client=store._given_client)
    await twin.open()
    try:
        await store.create_bulk(bulk())
        assert await store.claim_bulk("gw-a", now=at(11), lease_seconds=30) is not None
        assert await twin.claim_bulk("gw-b", now=at(11, 1), lease_seconds=30) is None
        assert await twin.claim_bulk("gw-b", now=T0 + timedelta(hours=1), lease_seconds=30)
    finally:
        await twin.close()
