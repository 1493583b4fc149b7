"""Reading the status stream for live clients: one ordered feed of every event, and replays.

Both read at the pace of their caller, never faster: nothing here buffers more than the caller
asked for, so a gateway with many slow or stalled WebSocket clients cannot fill its NATS
connection (nats-server cuts a connection whose outbound buffer passes ``max_pending``, 64 MiB
by default, as a slow consumer).

- :class:`StatusFeed` — every event of ``<p>.status.>`` from a sequence on, in stream order,
  gap-free: an ordered consumer (ephemeral, ``AckPolicy.NONE``, memory storage, R1) read with
  pull requests of one bounded batch at a time, and re-created from the next sequence after a
  gap, a lost connection or its own loss (ADR-17's ordered consumer, over pull instead of push).
- :class:`StatusReader` — one user's events from a sequence on, in batches of at most
  ``batch`` events and about ``max_bytes`` bytes (batched Direct Get, ADR-31, nats-server 2.11+;
  the status stream has ``allow_direct``), and the next event as the stream's leader has it
  (``STREAM.MSG.GET``): a Direct Get may be answered by a replica that lags, the leader is the
  reference for "there is nothing more".
- :class:`LiveStream` — both, as :class:`core.ports.StatusStream` (what the gateway's live
  status depends on).

No nats exception escapes: failures surface as :class:`core.errors.BusUnavailable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bus.nats import Bus, PullConsumer, translated
from core.errors import BusUnavailable, ConsumerMissing
from core.live import EventBatch, StoredEvent

log = logging.getLogger(__name__)

FEED_BATCH = 512
"""Events a :class:`StatusFeed` asks for per pull request."""
FEED_INACTIVE_THRESHOLD_SECONDS = 60.0
"""The server deletes a feed's consumer after this long without a pull request (seconds)."""


class StatusFeed:
    """Every status event from ``start_seq`` on, in order and without gaps (see module docstring).

    Args:
        bus: a connected adapter (the gateway's live-status connection).
        start_seq: the first stream sequence to deliver.
        batch: events per pull request: the most that can be in flight to this feed.
    """

    def __init__(self, bus: Bus, start_seq: int, *, batch: int = FEED_BATCH) -> None:
        self.bus = bus
        self.next_seq = max(1, start_seq)
        self.batch = batch
        self._consumer: PullConsumer | None = None
        self._name = ""
        self._consumer_seq = 0

    async def next_batch(self, timeout_seconds: float) -> list[StoredEvent]:
        """The next events (at most ``batch``); waits up to ``timeout_seconds`` seconds for the
        first and returns [] if none came. After a gap or a lost consumer the feed re-creates its
        consumer from the next sequence it has not delivered, so callers never see a gap.

        Raises:
            BusUnavailable: NATS cannot be reached (the caller backs off and calls again).
        """
        if self._consumer is None:
            await self._open()
        assert self._consumer is not None
        try:
            deliveries = await self._consumer.fetch(self.batch, timeout_seconds)
        except ConsumerMissing:
            log.info("live-status feed: consumer %s gone; re-creating it", self._name)
            await self._reset()
            return []
        events: list[StoredEvent] = []
        for d in deliveries:
            consumer_seq, stream_seq = d.sequences
            if consumer_seq != self._consumer_seq + 1:
                log.info(
                    "live-status feed: gap at consumer sequence %d (expected %d); re-creating",
                    consumer_seq,
                    self._consumer_seq + 1,
                )
                await self._reset()
                break
            self._consumer_seq = consumer_seq
            if stream_seq < self.next_seq:
                continue
            self.next_seq = stream_seq + 1
            events.append(StoredEvent(stream_seq, d.subject, d.data))
        return events

    async def _open(self) -> None:
        c = self.bus.config
        self._name = f"live-{uuid.uuid4().hex[:16]}"
        cfg = ConsumerConfig(
            name=self._name,
            filter_subject=f"{c.prefix}.status.>",
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.next_seq,
            ack_policy=AckPolicy.NONE,
            mem_storage=True,
            num_replicas=1,
            inactive_threshold=FEED_INACTIVE_THRESHOLD_SECONDS,
            max_waiting=4,
        )
        with translated("create live-status consumer"):
            await self.bus.js.add_consumer(c.status_stream, cfg)
        consumer = PullConsumer(
            self.bus.nc, f"$JS.API.CONSUMER.MSG.NEXT.{c.status_stream}.{self._name}"
        )
        await consumer.start()
        self._consumer = consumer
        self._consumer_seq = 0

    async def _reset(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.close()
        with contextlib.suppress(BusUnavailable):
            await self._delete()

    async def _delete(self) -> None:
        with (
            translated("delete live-status consumer"),
            contextlib.suppress(nats.js.errors.NotFoundError),
        ):
            await self.bus.js.delete_consumer(self.bus.config.status_stream, self._name)

    async def close(self) -> None:
        """Stop reading and delete the consumer (best effort; idempotent)."""
        await self._reset()


class DirectGetRequest(msgspec.Struct, omit_defaults=True):
    seq: int
    next_by_subj: str
    batch: int
    max_bytes: int


_direct_get_encoder = msgspec.json.Encoder()


class _Read:
    """One replay read in flight: what arrived, and whether it ended (with ``more``)."""

    __slots__ = ("batch", "done", "events")

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.events: list[StoredEvent] = []
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()


class StatusReader:
    """Replay reads of the status stream (see module docstring).

    Answers come to one wildcard inbox subscription per reader, routed to the read they answer
    by their last token, so a read costs one publish: no subscription per read.

    Args:
        bus: a connected adapter (the gateway's live-status connection).
        timeout_seconds: how long one read may take (seconds).
    """

    def __init__(self, bus: Bus, *, timeout_seconds: float = 5.0) -> None:
        self.bus = bus
        self.timeout_seconds = timeout_seconds
        self._inbox = ""
        self._subscribing = asyncio.Lock()
        self._reads: dict[str, _Read] = {}
        self._ids = itertools.count(1)

    async def _subscribed(self) -> str:
        async with self._subscribing:
            if not self._inbox:
                inbox = self.bus.nc.new_inbox()
                with translated("subscribe replay inbox"):
                    await self.bus.nc.subscribe(f"{inbox}.*", cb=self._on_msg)
                self._inbox = inbox
        return self._inbox

    async def _on_msg(self, msg: Msg) -> None:
        read = self._reads.get(msg.subject.rsplit(".", 1)[1])
        if read is None or read.done.done():
            return  # an answer to a read that timed out or was abandoned
        headers = msg.headers or {}
        seq = headers.get("Nats-Sequence")
        if seq is not None:
            if len(read.events) < read.batch:
                read.events.append(StoredEvent(int(seq), headers["Nats-Subject"], msg.data))
            return
        status = headers.get("Status")
        if status == "204":  # end of batch
            read.done.set_result(int(headers.get("Nats-Num-Pending", 0)) > 0)
        elif status == "404":  # nothing (more) matches
            read.done.set_result(False)
        else:
            description = headers.get("Description", "")
            read.done.set_exception(
                BusUnavailable(f"NATS: replay read failed: {status} {description}")
            )

    async def read(
        self, subject_filter: str, start_seq: int, *, batch: int, max_bytes: int
    ) -> EventBatch:
        """Events on ``subject_filter`` from sequence ``start_seq`` on: at most ``batch`` of
        them, and no more once about ``max_bytes`` bytes were sent (at least one event).

        Raises:
            BusUnavailable: no answer (NATS down, or a stream without ``allow_direct``) or an
                error status; a read cut short by its timeout returns what arrived instead.
        """
        inbox = await self._subscribed()
        request = DirectGetRequest(
            seq=max(1, start_seq), next_by_subj=subject_filter, batch=batch, max_bytes=max_bytes
        )
        token = str(next(self._ids))
        read = self._reads[token] = _Read(batch)
        try:
            with translated("replay read"):
                await self.bus.nc.publish(
                    f"$JS.API.DIRECT.GET.{self.bus.config.status_stream}",
                    _direct_get_encoder.encode(request),
                    reply=f"{inbox}.{token}",
                )
            try:
                async with asyncio.timeout(self.timeout_seconds):
                    more = await read.done
            except TimeoutError:
                if not read.events:
                    raise BusUnavailable(
                        f"NATS: replay read got no answer in {self.timeout_seconds:g} s"
                    ) from None
                more = True
            return EventBatch(read.events, more)
        finally:
            del self._reads[token]

    async def next_on_leader(self, subject_filter: str, start_seq: int) -> StoredEvent | None:
        """The first event on ``subject_filter`` at or after ``start_seq`` as the stream's leader
        holds it now, or None when there is none.

        Raises:
            BusUnavailable: the leader did not answer.
        """
        c = self.bus.config
        with translated("replay read from the leader"):
            try:
                raw = await self.bus.js.get_msg(
                    c.status_stream, seq=max(1, start_seq), subject=subject_filter, next=True
                )
            except nats.js.errors.NotFoundError:
                return None
        if raw.seq is None or raw.subject is None:
            return None
        return StoredEvent(int(raw.seq), raw.subject, raw.data or b"")


class LiveStream:
    """The status stream for a gateway's live status (:class:`core.ports.StatusStream`), over
    one connection: a :class:`StatusFeed` per :meth:`feed`, one :class:`StatusReader` for every
    replay read.

    Args:
        bus: a connected adapter (the gateway's live-status connection).
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.reader = StatusReader(bus)

    async def status_last_seq(self) -> int:
        return await self.bus.status_last_seq()

    def feed(self, start_seq: int) -> StatusFeed:
        return StatusFeed(self.bus, start_seq)

    def status_filter(self, owner: str, job_id: str | None = None) -> str:
        return self.bus.config.status_filter(owner, job_id)

    async def read(
        self, subject_filter: str, start_seq: int, *, batch: int, max_bytes: int
    ) -> EventBatch:
        return await self.reader.read(subject_filter, start_seq, batch=batch, max_bytes=max_bytes)

    async def next_on_leader(self, subject_filter: str, start_seq: int) -> StoredEvent | None:
        return await self.reader.next_on_leader(subject_filter, start_seq)
