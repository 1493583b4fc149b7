"""The notifier's decisions, one message at a time, on a real SQLite store, a fake clock, a
fake sender and fake deliveries: what is sent, what is recorded, and how each message is
settled (acked, or handed back with which delay)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import msgspec
import pytest

from actors.notifier import POISON_WAIT_SECONDS, RECORD_WAIT, Notifier, WebhookResult
from core.clock import FakeClock
from core.errors import StoreRejected
from core.model import ExecutionStatus, Job, StatusEvent
from core.notifications import MAX_ATTEMPTS
from core.notify_spec import NotifyTarget
from core.ports import Consumer, JobStore
from core.retry import RetryPolicy
from store.sqlite import SqliteStore
from tests.fakes import FakeConsumer, FakeDelivery
from tests.store.test_contract import T0, create, dispatched, event, make_job

HOOK = NotifyTarget(url="https://hooks.example/run", on=["failure"])
RETRY = RetryPolicy(first_seconds=5.0, max_seconds=3600.0, jitter=0.2)
_encode = msgspec.json.Encoder().encode


class Sender:
    def __init__(self, *results: WebhookResult) -> None:
        self.results = list(results)
        self.sent: list[tuple[str, dict[str, str], bytes]] = []

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> WebhookResult:
        self.sent.append((url, headers, body))
        return self.results.pop(0) if self.results else WebhookResult(200, None)


class Bus:
    async def wait_for_streams(self, stop: object, *, interval_seconds: float = 1.0) -> bool:
        return True

    async def notifier_consumer(self) -> Consumer:
        return FakeConsumer()

    async def ensure_notifier_consumer(self) -> None:
        return None


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[JobStore]:
    s = SqliteStore(tmp_path / "db.sqlite")
    await s.open()
    yield s
    await s.close()


def notifier(store: JobStore, sender: Sender, clock: FakeClock) -> Notifier:
    return Notifier(Bus(), store, sender, clock=clock, retry=RETRY)


async def finished(
    store: JobStore,
    status: ExecutionStatus,
    *,
    notify: NotifyTarget | None = HOOK,
    record: bool = True,
) -> tuple[Job, StatusEvent]:
    job = make_job(notify=notify, next_run_at=T0)
    await create(store, job)
    run = await dispatched(store, job, T0, None)
    final = event(run, status, 1, T0 + timedelta(seconds=1), error="boom")
    if record:
        await store.apply_events([final])
    return job, final


def delivery(ev: StatusEvent) -> FakeDelivery:
    return FakeDelivery(_encode(ev))


async def test_a_failed_run_is_posted_once_recorded_and_acked(store: JobStore) -> None:
    _, ev = await finished(store, ExecutionStatus.FAILED)
    sender, clock = Sender(), FakeClock(T0 + timedelta(seconds=2))
    d = delivery(ev)

    await notifier(store, sender, clock).handle(d)

    [(url, headers, body)] = sender.sent
    assert url == HOOK.url and "webhook-signature" not in headers
    assert msgspec.json.decode(body)["data"]["status"] == "FAILED"
    [attempt] = await store.notification_attempts(ev.execution_id)
    assert (attempt.attempt, attempt.ok, attempt.status_code, attempt.next_attempt_at) == (
        1, True, 200, None
    )  # fmt: skip
    assert d.settled == "ack"


async def test_a_500_is_recorded_and_handed_back_with_the_backoff_delay(store: JobStore) -> None:
    _, ev = await finished(store, ExecutionStatus.FAILED)
    sender, clock = Sender(WebhookResult(500, "HTTP 500: b'down'")), FakeClock(T0)
    d = delivery(ev)
    n = notifier(store, sender, clock)

    await n.handle(d)

    [attempt] = await store.notification_attempts(ev.execution_id)
    assert not attempt.ok and attempt.status_code == 500 and attempt.error == "HTTP 500: b'down'"
    assert attempt.next_attempt_at is not None
    delay = (attempt.next_attempt_at - attempt.at).total_seconds()
    assert 4.0 <= delay <= 6.0  # 5 s ± 20 % jitter
    assert d.settled == "nak" and d.nak_delay_seconds == pytest.approx(delay)
    counted = n.metrics.registry.get_sample_value(
        "jobsched_notification_attempts_total", {"status": "failed"}
    )
    assert counted == 1.0


async def test_a_redelivery_before_the_next_attempt_is_due_waits_for_it(store: JobStore) -> None:
    _, ev = await finished(store, ExecutionStatus.FAILED)
    sender, clock = Sender(WebhookResult(500, "HTTP 500")), FakeClock(T0)
    n = notifier(store, sender, clock)
    await n.handle(delivery(ev))
    [first] = await store.notification_attempts(ev.execution_id)
    assert first.next_attempt_at is not None

    early = delivery(ev)  # e.g. a restart: the ack wait ran out before the nak delay
    await n.handle(early)
    assert early.settled == "nak" and len(sender.sent) == 1
    assert early.nak_delay_seconds == (first.next_attempt_at - clock.now()).total_seconds()

    await clock.set(first.next_attempt_at)
    due = delivery(ev)
    await n.handle(due)
    assert [a.attempt for a in await store.notification_attempts(ev.execution_id)] == [1, 2]
    assert due.settled == "ack" and len(sender.sent) == 2
    ids = {headers["webhook-id"] for _, headers, _ in sender.sent}
    assert len(ids) == 1  # the same message for the receiver to de-duplicate


async def test_it_gives_up_after_the_last_attempt_with_growing_delays(store: JobStore) -> None:
    _, ev = await finished(store, ExecutionStatus.FAILED)
    refused = WebhookResult(None, "refused to connect to h: 10.0.0.1 is not globally reachable")
    sender, clock = Sender(*[refused] * 20), FakeClock(T0)
    n = notifier(store, sender, clock)
    settled = []
    for _ in range(MAX_ATTEMPTS + 2):
        d = delivery(ev)
        await n.handle(d)
        settled.append(d.settled)
        attempts = await store.notification_attempts(ev.execution_id)
        if attempts[-1].next_attempt_at is not None:
            await clock.set(attempts[-1].next_attempt_at)

    assert len(sender.sent) == MAX_ATTEMPTS
    assert settled == ["nak"] * (MAX_ATTEMPTS - 1) + ["ack"] * 3
    assert [a.attempt for a in attempts] == list(range(1, MAX_ATTEMPTS + 1))
    assert attempts[-1].next_attempt_at is None
    delays = [
        (a.next_attempt_at - a.at).total_seconds() for a in attempts[:-1] if a.next_attempt_at
    ]
    assert all(later > earlier for earlier, later in itertools.pairwise(delays))
    assert delays[-1] <= 3600.0


@pytest.mark.parametrize(
    ("status", "notify"),
    [
        (ExecutionStatus.SUCCEEDED, HOOK),  # on: failure only
        (ExecutionStatus.CANCELLED, NotifyTarget(url="u", on=["failure", "success"])),
        (ExecutionStatus.RETRYING, HOOK),
        (ExecutionStatus.FAILED, None),  # no webhook, no default
    ],
)
async def test_what_is_not_asked_for_is_acked_unsent(
    store: JobStore, status: ExecutionStatus, notify: NotifyTarget | None
) -> None:
    _, ev = await finished(store, status, notify=notify)
    sender = Sender()
    d = delivery(ev)

    await notifier(store, sender, FakeClock(T0)).handle(d)

    assert sender.sent == [] and d.settled == "ack"
    assert await store.notification_attempts(ev.execution_id) == []


async def test_the_owners_default_applies_to_a_job_without_notify(store: JobStore) -> None:
    await store.set_notification_default("alice", NotifyTarget(url="https://d/", on=["success"]))
    _, ev = await finished(store, ExecutionStatus.SUCCEEDED, notify=None)
    sender = Sender()

    await notifier(store, sender, FakeClock(T0)).handle(delivery(ev))

    assert [url for url, _, _ in sender.sent] == ["https://d/"]


async def test_a_final_event_waits_for_the_recorder_to_store_the_run(store: JobStore) -> None:
    _, ev = await finished(store, ExecutionStatus.FAILED, record=False)
    sender = Sender()
    first, later = delivery(ev), FakeDelivery(_encode(ev), num_delivered=6)

    await notifier(store, sender, FakeClock(T0)).handle(first)
    await notifier(store, sender, FakeClock(T0)).handle(later)

    assert sender.sent == [] and (first.settled, later.settled) == ("nak", "nak")
    assert first.nak_delay_seconds == RECORD_WAIT.first_seconds == 0.05
    assert later.nak_delay_seconds == RECORD_WAIT.max_seconds == 1.0


async def test_a_message_that_is_not_an_event_and_a_deleted_job_are_acked(store: JobStore) -> None:
    job, ev = await finished(store, ExecutionStatus.FAILED)
    await store.delete_job("alice", job.id)
    sender = Sender()
    junk, gone = FakeDelivery(b"not json"), delivery(ev)
    n = notifier(store, sender, FakeClock(T0))

    await n.handle(junk)
    await n.handle(gone)

    assert (junk.settled, gone.settled, sender.sent) == ("ack", "ack", [])


async def test_a_write_the_store_refuses_hands_the_message_back_for_later(
    store: JobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither lost nor a crash of the notifier: it is tried again much later."""
    _, ev = await finished(store, ExecutionStatus.FAILED)

    async def refuse(attempt: object) -> None:
        raise StoreRejected("no")

    monkeypatch.setattr(store, "record_notification_attempt", refuse)
    d = delivery(ev)

    await notifier(store, Sender(), FakeClock(T0))._one(d)

    assert d.settled == "nak" and d.nak_delay_seconds == POISON_WAIT_SECONDS
