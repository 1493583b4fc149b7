"""The live status of one gateway process: one feed of the status stream, fanned out.

:class:`LiveStatus` reads every status event once, through one feed of the status stream
(:class:`core.ports.StatusStream`, on the gateway's own live-status NATS connection), and hands
each to the WebSocket connections of the event's user (:class:`Subscriber`, looked up by the
subject's user token, without decoding the event). Handing over never waits: a connection whose
buffer is full stops taking live events and catches up from the stream instead
(:mod:`gateway.ws`).

Replays — connections resuming from a ``lastEventId`` or catching up — read the stream through
:meth:`LiveStatus.replay`, each read holding one of ``replay_concurrency`` slots: the process
never has more than ``replay_concurrency`` replay reads (each at most
:data:`REPLAY_BATCH_EVENTS` events and :data:`REPLAY_MAX_BYTES` bytes) in flight, however many
clients replay; and they read at most ``replay_events_per_second`` events per second together (a
token bucket), which bounds the CPU replays take from the other roles of the process. A read
over either limit waits for its turn; none is refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from actors.metrics import Metrics
from core.backoff import retry_delay
from core.errors import BusUnavailable
from core.live import EventBatch, StoredEvent
from core.ports import LiveFeed, StatusStream
from core.ratelimit import TokenBucket
from core.retry import raise_if_cancelling

log = logging.getLogger(__name__)

REPLAY_BATCH_EVENTS = 128
"""Most events one replay read asks for (and a replaying connection holds ahead of its writer)."""
REPLAY_MAX_BYTES = 256 * 1024
"""Bytes after which the server ends a replay read's batch (about; at least one event)."""
READY_TIMEOUT_SECONDS = 10.0
"""How long a subscription waits for the feed to find its starting point (seconds)."""
FEED_POLL_SECONDS = 5.0
"""Longest wait of the feed for its next batch before it asks again (seconds)."""
FEED_IDLE_SECONDS = 60.0
"""With no subscriber for this long the feed stops reading; the next subscriber restarts it."""


class Subscriber(Protocol):
    """A WebSocket connection as the feed sees it."""

    def offer(self, event: StoredEvent) -> None:
        """Take ``event`` (one of this user's, in stream order) or drop it; never blocks."""
        ...

    @property
    def catching_up(self) -> bool:
        """Reading from the stream rather than taking the feed's events."""
        ...


class LiveStatus:
    """The feed, the subscribers and the replay slots of one gateway (see module docstring).

    Args:
        stream: the status stream on the gateway's live-status connection; None runs the
            gateway without live status.
        replay_concurrency: replay reads in flight at once in this process.
        replay_events_per_second: events per second replays read, all together; 0 for no limit.
        metrics: where the WebSocket gauges and counters live; default: a registry of its own.
    """

    def __init__(
        self,
        stream: StatusStream | None,
        *,
        replay_concurrency: int = 4,
        replay_events_per_second: float = 0.0,
        metrics: Metrics | None = None,
    ) -> None:
        self.stream = stream
        self.metrics = metrics or Metrics()
        self.position = 0
        """Stream sequence of the last event handed out: every later event is still to come."""
        self._subscribers: dict[str, set[Subscriber]] = {}
        self._slots = asyncio.Semaphore(replay_concurrency)
        self._budget: TokenBucket | None = None
        if replay_events_per_second > 0:
            burst = max(REPLAY_BATCH_EVENTS, replay_events_per_second / 10)
            self._budget = TokenBucket(replay_events_per_second, burst, time.monotonic())
        self._wanted = asyncio.Event()
        self._ready = asyncio.Event()
        self.metrics.ws_catching_up.set_function(self._catching_up)

    def _catching_up(self) -> int:
        return sum(s.catching_up for subs in self._subscribers.values() for s in subs)

    def add(self, owner_key: str, subscriber: Subscriber) -> None:
        self._subscribers.setdefault(owner_key, set()).add(subscriber)

    def discard(self, owner_key: str, subscriber: Subscriber) -> None:
        subscribers = self._subscribers.get(owner_key)
        if subscribers is not None:
            subscribers.discard(subscriber)
            if not subscribers:
                del self._subscribers[owner_key]

    async def started(self) -> None:
        """Start the feed if it is not running yet, and wait until :attr:`position` is known.

        Raises:
            BusUnavailable: no NATS, or the stream could not be read within 10 s.
        """
        if self.stream is None:
            raise BusUnavailable("live status needs NATS")
        self._wanted.set()
        try:
            async with asyncio.timeout(READY_TIMEOUT_SECONDS):
                await self._ready.wait()
        except TimeoutError:
            raise BusUnavailable(
                "live status is not available: the status stream is unreadable"
            ) from None

    async def replay(self, subject_filter: str, start_seq: int, *, batch: int) -> EventBatch:
        """One replay read (:meth:`core.ports.StatusStream.read`, at most ``batch`` events), in
        one of the process's replay slots and within its replay budget: waits for both.

        Raises:
            BusUnavailable: the read failed.
        """
        assert self.stream is not None
        async with self._slots:
            if self._budget is not None:
                await asyncio.sleep(self._budget.reserve(batch, time.monotonic()))
            result = await self.stream.read(
                subject_filter, start_seq, batch=batch, max_bytes=REPLAY_MAX_BYTES
            )
            if self._budget is not None:
                self._budget.refund(batch - len(result.events), time.monotonic())
        self.metrics.ws_replayed_events.inc(len(result.events))
        return result

    async def next_on_leader(self, subject_filter: str, start_seq: int) -> StoredEvent | None:
        """:meth:`core.ports.StatusStream.next_on_leader`."""
        assert self.stream is not None
        return await self.stream.next_on_leader(subject_filter, start_seq)

    async def run(self) -> None:
        """Read the feed until cancelled, whenever a subscription wants it: it starts on the
        first, and stops after :data:`FEED_IDLE_SECONDS` without any. After a NATS failure it
        resumes from :attr:`position` + 1, so subscribers never see a gap."""
        if self.stream is None:
            return
        while True:
            await self._wanted.wait()
            await self._read_feed(self.stream)

    async def _read_feed(self, stream: StatusStream) -> None:
        """The feed until it has been idle for :data:`FEED_IDLE_SECONDS`."""
        feed: LiveFeed | None = None
        failures, idle_since = 0, time.monotonic()
        try:
            while True:
                raise_if_cancelling()
                try:
                    if feed is None:
                        if not self._ready.is_set():
                            self.position = await stream.status_last_seq()
                        feed = stream.feed(self.position + 1)
                        self._ready.set()
                    events = await feed.next_batch(FEED_POLL_SECONDS)
                    failures = 0
                except BusUnavailable as e:
                    failures += 1
                    log.warning("live-status feed: %s", e)
                    if feed is not None:
                        await feed.close()
                        feed = None
                    await asyncio.sleep(retry_delay(failures, base_seconds=0.2, max_seconds=5.0))
                    continue
                for event in events:
                    self._dispatch(event)
                if self._subscribers:
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > FEED_IDLE_SECONDS:
                    self._ready.clear()
                    self._wanted.clear()
                    return
        finally:
            if feed is not None:
                await feed.close()

    def _dispatch(self, event: StoredEvent) -> None:
        if event.seq <= self.position:
            return
        subscribers = self._subscribers.get(event.owner_key)
        if subscribers:
            for subscriber in tuple(subscribers):
                subscriber.offer(event)
        self.position = event.seq
