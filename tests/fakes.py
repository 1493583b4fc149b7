"""In-memory fakes of the bus ports (:mod:`core.ports`), for actor unit tests without NATS.

They keep the semantics the actors rely on — de-duplication of runs by execution id, "is the
run's message still held", status sequence numbers and the recorders' ack floor, notices to
every subscriber, acknowledgement verbs per delivery — and record what was asked of them, so a
test asserts on what an actor published, settled and when. Failures are injected per operation
(:meth:`FakeBus.fail`): the next ``n`` calls raise :class:`BusUnavailable`, as the NATS adapter
does for an outage.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from core.clock import FakeClock
from core.concurrency import ConcurrencyWait, SlotState, explain_wait, slot_id
from core.errors import BusUnavailable, ConsumerMissing, LeaseLost
from core.explain import LeaseView, QueueState
from core.ids import owner_key, run_key
from core.live import EventBatch, StoredEvent
from core.model import Event, JobNotice, RunMessage, RunsFinished, StatusEvent
from core.ports import LeaseSnapshot

_encode = msgspec.json.Encoder().encode
_sequence = itertools.count(1)


class FakeDelivery:
    """One delivered message; records how it was settled."""

    def __init__(
        self,
        data: bytes,
        *,
        subject: str = "",
        msg_id: str | None = None,
        num_delivered: int = 1,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self._on_done = on_done
        self.data = data
        self.subject = subject
        self.msg_id = msg_id
        self.num_delivered = num_delivered
        self.stored_id = f"FAKE:{next(_sequence)}"
        self.settled: str | None = None
        """``ack``, ``nak`` or ``term`` once settled (the last verb wins, as on the server)."""
        self.nak_delay_seconds: float | None = None
        self.in_progress_count = 0
        self.done = asyncio.Event()
        self.fail_settle = 0
        """The next this many ack/nak/term calls raise BusUnavailable (and do not settle)."""

    async def _settle(self, verb: str) -> None:
        if self.fail_settle > 0:
            self.fail_settle -= 1
            raise BusUnavailable(f"fake: {verb} failed")
        self.settled = verb
        self.done.set()
        if verb != "nak" and self._on_done is not None:
            self._on_done()  # acked or terminated: a work queue drops the message

    async def ack(self) -> None:
        await self._settle("ack")

    async def nak(self, delay_seconds: float | None = None) -> None:
        self.nak_delay_seconds = delay_seconds
        await self._settle("nak")

    async def in_progress(self) -> None:
        self.in_progress_count += 1

    async def term(self) -> None:
        await self._settle("term")


class FakeConsumer:
    """A durable consumer: messages :meth:`put` are handed out by :meth:`fetch`."""

    def __init__(self) -> None:
        self.ready: list[FakeDelivery] = []
        self.handed_out: list[FakeDelivery] = []
        self._changed = asyncio.Event()
        self.missing = False
        """The next fetch raises ConsumerMissing (then the consumer exists again)."""
        self.closed = False
        self.failures = 0
        """The next this many fetches raise BusUnavailable (an outage)."""

    def put(self, delivery: FakeDelivery) -> FakeDelivery:
        self.ready.append(delivery)
        self._changed.set()
        return delivery

    def wake(self) -> None:
        """End a waiting fetch now (empty), as its timeout would."""
        self._changed.set()

    async def fetch(self, batch: int, timeout_seconds: float) -> Sequence[FakeDelivery]:
        if self.failures > 0:
            self.failures -= 1
            raise BusUnavailable("fake: pull request failed")
        if not self.ready and not self.missing:
            self._changed.clear()
            try:
                async with asyncio.timeout(timeout_seconds):
                    await self._changed.wait()
            except TimeoutError:
                return []
        if self.missing:
            self.missing = False
            raise ConsumerMissing("fake: the consumer does not exist")
        out, self.ready = self.ready[:batch], self.ready[batch:]
        self.handed_out += out
        return out

    async def quiesce(self) -> int:
        left = self.take_unprocessed()
        for d in left:
            await d.nak()
        return len(left)

    def take_unprocessed(self) -> list[FakeDelivery]:
        out, self.ready = self.ready, []
        return out

    async def close(self) -> None:
        self.closed = True


class FakeSubscription:
    def __init__(self, unsubscribe: Callable[[], None]) -> None:
        self._unsubscribe: Callable[[], None] | None = unsubscribe

    async def close(self) -> None:
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()


@dataclass
class Published:
    """One publish of a run, as the work stream saw it."""

    run: RunMessage
    stored: bool
    """False: a duplicate of a held run (same execution id), dropped."""


@dataclass
class FakeBus:
    """The bus of one deployment in memory: every role of :mod:`core.ports` (scheduler,
    worker and recorder side).

    Attributes:
        published: every run publish, duplicates included, in order.
        held: the runs the work stream holds now, by execution id (a worker's ack or term
            removes one: :meth:`settle_run`).
        statuses: status reports stored (workers' :meth:`publish_status`), in order.
        status_batches: the size of each :meth:`publish_statuses` call, in order.
        events: events published for live clients (QUEUED, SKIPPED, job changes).
        stream: everything the status stream stored (reports and events, de-duplicated by
            their ``Nats-Msg-Id``); a message's sequence is its index + 1. The recorders'
            consumer (:attr:`status_consumer`) receives each.
        finished: finished-runs notices sent.
        ack_floor: the recorders' ack floor (set by the test).
    """

    published: list[Published] = field(default_factory=list)
    held: dict[str, RunMessage] = field(default_factory=dict)
    statuses: list[StatusEvent] = field(default_factory=list)
    status_batches: list[int] = field(default_factory=list)
    stream: list[Event] = field(default_factory=list)
    _stream_ids: set[str] = field(default_factory=set)
    events: list[Event] = field(default_factory=list)
    finished: list[list[str]] = field(default_factory=list)
    ack_floor: int = 0
    streams_ensured: int = 0
    work: dict[str, FakeConsumer] = field(default_factory=dict)
    status_consumer: FakeConsumer = field(default_factory=FakeConsumer)
    _failures: dict[str, int] = field(default_factory=dict)
    _failed: dict[str, int] = field(default_factory=dict)
    _notice_handlers: list[Callable[[JobNotice], Awaitable[None]]] = field(default_factory=list)
    _finished_handlers: list[Callable[[RunsFinished], Awaitable[None]]] = field(
        default_factory=list
    )
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def fail(self, operation: str, times: int = 1) -> None:
        """Make the next ``times`` calls of ``operation`` (a method name) raise
        BusUnavailable; ``publish_runs`` reports it per run instead, as the adapter does."""
        self._failures[operation] = self._failures.get(operation, 0) + times

    def recover(self) -> None:
        """The outage is over: no injected failure is left."""
        self._failures.clear()

    def failed_calls(self, operation: str) -> int:
        """How many calls of ``operation`` failed so far."""
        return self._failed.get(operation, 0)

    def _check(self, operation: str) -> None:
        left = self._failures.get(operation, 0)
        if left > 0:
            self._failures[operation] = left - 1
            self._failed[operation] = self._failed.get(operation, 0) + 1
            raise BusUnavailable(f"fake: {operation} failed")

    def _touch(self) -> None:
        self.changed.set()

    @property
    def stored_runs(self) -> list[RunMessage]:
        return [p.run for p in self.published if p.stored]

    def settle_run(self, execution_id: str) -> None:
        """A worker acked or terminated the run: the work stream no longer holds it."""
        self.held.pop(execution_id, None)

    def wake(self) -> None:
        """End every waiting fetch (to let a stopping worker or recorder see its stop)."""
        for consumer in (*self.work.values(), self.status_consumer):
            consumer.wake()

    # --- RunQueue ---------------------------------------------------------------------------

    async def publish_runs(self, runs: Sequence[RunMessage]) -> list[BusUnavailable | None]:
        results: list[BusUnavailable | None] = []
        for run in runs:
            try:
                self._check("publish_runs")
            except BusUnavailable as e:
                results.append(e)
                continue
            stored = run.execution_id not in self.held
            self.published.append(Published(run, stored))
            if stored:
                self.held[run.execution_id] = run
                self.work_queue(run.queue).put(
                    FakeDelivery(
                        _encode(run),
                        subject=f"work.{run.queue}",
                        msg_id=run.msg_id,
                        on_done=functools.partial(self.settle_run, run.execution_id),
                    )
                )
            results.append(None)
        self._touch()
        return results

    async def runs_in_stream(self, runs: Iterable[tuple[str, str]]) -> set[str]:
        self._check("runs_in_stream")
        return {e for _, e in runs if e in self.held}

    async def ping(self) -> None:
        self._check("ping")

    async def ensure_streams_quietly(self) -> None:
        self.streams_ensured += 1

    # --- RecorderProgress ----------------------------------------------------------------------

    async def status_last_seq(self) -> int:
        self._check("status_last_seq")
        return len(self.stream)

    async def recorder_ack_floor(self) -> int:
        self._check("recorder_ack_floor")
        return self.ack_floor

    # --- EventFeed, Notices -----------------------------------------------------------------

    def _store(self, event: Event) -> bool:
        """Append ``event`` to the status stream unless its ``Nats-Msg-Id`` is there."""
        if isinstance(event, StatusEvent):
            msg_id = f"{event.execution_id}|{event.status}|{event.attempt}"
        else:
            msg_id = f"{event.job_id}|{event.event}|{event.at.timestamp()}"
        if msg_id in self._stream_ids:
            return False
        self._stream_ids.add(msg_id)
        self.stream.append(event)
        self.status_consumer.put(FakeDelivery(_encode(event), subject="status", msg_id=msg_id))
        return True

    async def publish_events(self, events: Sequence[Event]) -> int:
        self.events += events
        for event in events:
            self._store(event)
        self._touch()
        return len(events)

    async def notify(self, notice: JobNotice) -> None:
        self._check("notify")
        for handler in list(self._notice_handlers):
            await handler(notice)

    async def subscribe_notices(
        self, handler: Callable[[JobNotice], Awaitable[None]]
    ) -> FakeSubscription:
        self._notice_handlers.append(handler)
        return FakeSubscription(lambda: self._notice_handlers.remove(handler))

    async def publish_finished(self, job_ids: list[str]) -> None:
        self._check("publish_finished")
        self.finished.append(job_ids)
        self._touch()
        for handler in list(self._finished_handlers):
            await handler(RunsFinished(job_ids=job_ids))

    async def subscribe_finished(
        self, handler: Callable[[RunsFinished], Awaitable[None]]
    ) -> FakeSubscription:
        self._finished_handlers.append(handler)
        return FakeSubscription(lambda: self._finished_handlers.remove(handler))

    # --- Streams, WorkIntake, StatusReports, StatusIntake ------------------------------------

    async def wait_for_streams(self, stop: asyncio.Event, *, interval_seconds: float = 1.0) -> bool:
        return True

    def work_queue(self, queue: str) -> FakeConsumer:
        return self.work.setdefault(queue, FakeConsumer())

    async def work_consumer(self, queue: str) -> FakeConsumer:
        self._check("work_consumer")
        return self.work_queue(queue)

    async def ensure_work_consumer(self, queue: str) -> None:
        self._check("ensure_work_consumer")

    async def publish_status(self, event: StatusEvent) -> None:
        self._check("publish_status")
        if self._store(event):
            self.statuses.append(event)
        self._touch()

    async def publish_statuses(self, events: Sequence[StatusEvent]) -> list[BusUnavailable | None]:
        self.status_batches.append(len(events))
        results: list[BusUnavailable | None] = []
        for event in events:
            try:
                await self.publish_status(event)
                results.append(None)
            except BusUnavailable as e:
                results.append(e)
        return results

    async def recorder_consumer(self) -> FakeConsumer:
        return self.status_consumer

    async def ensure_recorder_consumer(self) -> None:
        self._check("ensure_recorder_consumer")


class FakeCancelSignals:
    """Cancellation markers in memory; watchers hear every marker set after they started."""

    def __init__(self) -> None:
        self.jobs: set[str] = set()
        self.runs: set[str] = set()
        self.cancelled_runs: list[str] = []
        self.ready = asyncio.Event()
        self._watchers: list[Callable[[str | None, str | None], None]] = []

    async def cancel_job(self, job_id: str) -> None:
        self.jobs.add(job_id)
        for w in self._watchers:
            w(job_id, None)

    async def cancel_run(self, execution_id: str) -> None:
        self.cancelled_runs.append(execution_id)
        key = run_key(execution_id)
        self.runs.add(key)
        for w in self._watchers:
            w(None, key)

    def is_cancelled(self, job_id: str, execution_id: str) -> bool:
        return job_id in self.jobs or run_key(execution_id) in self.runs

    async def watch(self, on_marker: Callable[[str | None, str | None], None]) -> None:
        self._watchers.append(on_marker)
        self.ready.set()
        try:
            await asyncio.Event().wait()
        finally:
            self._watchers.remove(on_marker)


class FakeLiveFeed:
    """One feed of a :class:`FakeStatusStream` from ``next_seq`` on."""

    def __init__(self, stream: FakeStatusStream, start_seq: int) -> None:
        self.stream = stream
        self.next_seq = max(1, start_seq)
        self.closed = False

    async def next_batch(self, timeout_seconds: float) -> list[StoredEvent]:
        events = self.stream.events
        if len(events) < self.next_seq:
            self.stream.changed.clear()
            try:
                async with asyncio.timeout(timeout_seconds):
                    await self.stream.changed.wait()
            except TimeoutError:
                return []
        if self.stream.fail_batches > 0:
            self.stream.fail_batches -= 1
            raise BusUnavailable("fake: feed lost")
        batch = events[self.next_seq - 1 :]
        self.next_seq = len(events) + 1
        return batch

    async def close(self) -> None:
        self.closed = True


@dataclass
class FakeStatusStream:
    """The status stream as live clients read it (:class:`core.ports.StatusStream`), in memory:
    :meth:`append` stores an event on ``p.status.<owner key>.<job id>``.

    Attributes:
        events: every stored event; an event's sequence is its index + 1.
        feeds: the start sequence of each feed opened, in order.
        fail_batches: the next this many feed batches raise BusUnavailable (after waiting).
    """

    events: list[StoredEvent] = field(default_factory=list)
    feeds: list[int] = field(default_factory=list)
    fail_batches: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, owner: str, job_id: str, data: bytes = b"{}") -> StoredEvent:
        event = StoredEvent(len(self.events) + 1, f"p.status.{owner_key(owner)}.{job_id}", data)
        self.events.append(event)
        self.changed.set()
        return event

    async def status_last_seq(self) -> int:
        return len(self.events)

    def feed(self, start_seq: int) -> FakeLiveFeed:
        self.feeds.append(start_seq)
        return FakeLiveFeed(self, start_seq)

    def status_filter(self, owner: str, job_id: str | None = None) -> str:
        return f"p.status.{owner_key(owner)}.{job_id or '>'}"

    def _matching(self, subject_filter: str, start_seq: int) -> list[StoredEvent]:
        prefix, _, last = subject_filter.rpartition(".")
        return [
            e
            for e in self.events[max(1, start_seq) - 1 :]
            if (e.subject.startswith(prefix + ".") if last == ">" else e.subject == subject_filter)
        ]

    async def read(
        self, subject_filter: str, start_seq: int, *, batch: int, max_bytes: int
    ) -> EventBatch:
        found = self._matching(subject_filter, start_seq)
        return EventBatch(found[:batch], len(found) > batch)

    async def next_on_leader(self, subject_filter: str, start_seq: int) -> StoredEvent | None:
        found = self._matching(subject_filter, start_seq)
        return found[0] if found else None


@dataclass
class _Key:
    owner: str
    revision: int


class FakeLeases:
    """A lease bucket in memory: revision-checked writes; :meth:`expire` and :meth:`steal`
    play the server expiring a lease and another scheduler taking it."""

    def __init__(self) -> None:
        self.keys: dict[int, _Key] = {}
        self.members: set[str] = set()
        self._revision = itertools.count(1)
        self.failures = 0
        """The next this many calls raise BusUnavailable (an outage)."""
        self.opened = False

    def _check(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise BusUnavailable("fake: the lease bucket is unavailable")

    def expire(self, partition: int) -> None:
        self.keys.pop(partition, None)

    def steal(self, partition: int, owner: str) -> None:
        self.keys[partition] = _Key(owner, next(self._revision))

    async def open(self) -> None:
        self.opened = True

    async def acquire(self, partition: int, owner: str) -> int | None:
        self._check()
        key = self.keys.get(partition)
        if key is not None and key.owner != owner:
            return None
        self.keys[partition] = _Key(owner, next(self._revision))
        return self.keys[partition].revision

    async def renew(self, partition: int, owner: str, revision: int) -> int:
        self._check()
        key = self.keys.get(partition)
        if key is None or key.owner != owner:
            raise LeaseLost(f"fake: lease of partition {partition} lost")
        key.revision = next(self._revision)
        return key.revision

    async def release(self, partition: int, revision: int) -> None:
        self._check()
        key = self.keys.get(partition)
        if key is not None and key.revision == revision:
            del self.keys[partition]

    async def heartbeat(self, member: str) -> None:
        self._check()
        self.members.add(member)

    async def leave(self, member: str) -> None:
        self._check()
        self.members.discard(member)

    async def snapshot(self) -> LeaseSnapshot:
        self._check()
        return LeaseSnapshot(frozenset(self.members), frozenset(self.keys))


class FakeInspector:
    """:class:`core.ports.RunInspector` over a :class:`FakeBus` and :class:`FakeLeases`: a
    queue's consumer exists once something bound to it or published to it (on NATS a publish
    alone creates no consumer: tests/bus/test_inspect_contract.py creates it first); runs
    ``pending`` are its ready messages, ``in_progress`` those handed out and not settled;
    ``waiting_pulls`` is 0 (the fake keeps no pull requests). Leases carry no expiry."""

    def __init__(
        self, bus: FakeBus, leases: FakeLeases, slots: dict[str, SlotState] | None = None
    ) -> None:
        self.bus = bus
        self.leases = leases
        self.slots: dict[str, SlotState] = {} if slots is None else slots
        """Slot states by :func:`core.concurrency.slot_id` (e.g. ``MemorySlots.states``)."""
        self.failures = 0
        """The next this many calls raise BusUnavailable (an outage)."""

    def _check(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise BusUnavailable("fake: inspection failed")

    async def queue_state(self, queue: str) -> QueueState:
        self._check()
        consumer = self.bus.work.get(queue)
        if consumer is None:
            return QueueState(queue=queue, consumer_exists=False)
        unsettled = [d for d in consumer.handed_out if d.settled in (None, "nak")]
        return QueueState(
            queue=queue,
            consumer_exists=True,
            pending=len(consumer.ready),
            in_progress=len(unsettled),
        )

    async def concurrency_wait(
        self, owner: str, key: str, max_concurrent: int, execution_id: str | None, now_ms: int
    ) -> ConcurrencyWait:
        self._check()
        state = self.slots.get(slot_id(owner, key))
        return explain_wait(state, key, max_concurrent, execution_id, now_ms)

    async def partition_lease(self, partition: int) -> LeaseView:
        self._check()
        key = self.leases.keys.get(partition)
        return LeaseView(partition=partition, owner=key.owner if key is not None else None)


async def until(condition: Callable[[], bool], *, timeout_seconds: float = 5.0) -> None:
    """Wait (real time, bounded) until ``condition()`` holds, checking at every loop turn."""
    async with asyncio.timeout(timeout_seconds):
        while not condition():
            await asyncio.sleep(0.001)


if TYPE_CHECKING:  # the fakes implement the ports (checked by mypy)
    from core.ports import (
        CancelSignals,
        GatewayBus,
        Leases,
        RecorderBus,
        SchedulerBus,
        StatusStream,
        WorkerBus,
    )

    def _conforms(bus: FakeBus) -> tuple[SchedulerBus, WorkerBus, RecorderBus, GatewayBus]:
        return bus, bus, bus, bus

    def _signals(s: FakeCancelSignals, leases: FakeLeases) -> tuple[CancelSignals, Leases]:
        return s, leases

    def _stream(s: FakeStatusStream) -> StatusStream:
        return s


async def waits(clock: FakeClock, count: int) -> list[float]:
    """Let a lone task sleeping on ``clock`` through ``count`` waits (a retry loop's pauses),
    moving the clock to each deadline; the length of each wait, in seconds."""
    lengths = []
    for _ in range(count):
        await clock.until_asleep(1)
        [deadline] = clock.deadlines()
        lengths.append((deadline - clock.now()).total_seconds())
        await clock.set(deadline)
    return lengths
