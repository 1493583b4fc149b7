"""``gateway.ws.Follower`` on a fake stream and feed: every event of a subscription exactly once,
in order, whatever interleaves with its catch-up and its switch to the live feed.

The fake stream plays both sides of :class:`gateway.live.LiveStatus`: it stores events, hands
them to the follower in order as the feed would (``position``), answers replay reads from a
replica that may lag behind, and answers leader reads from everything stored. Events are stored
and fed *while* the follower awaits its reads, which is where a gap or a duplicate would come from.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from core.ids import owner_key
from core.live import EventBatch, StoredEvent
from gateway.ws import Follower, Outbox, Stalled

ME, OTHER = owner_key("alice"), owner_key("bob")


def subject(owner: str, job: str) -> str:
    return f"t.status.{owner}.{job}"


def matches(subject_filter: str, event: StoredEvent) -> bool:
    if subject_filter.endswith(".>"):
        return event.subject.startswith(subject_filter[:-1])
    return event.subject == subject_filter


class FakeStream:
    """The status stream, the feed over it, and replay reads (see module docstring); with
    ``lag``, replay reads come from a replica that lags one read behind the leader."""

    def __init__(self, rng: random.Random, *, lag: bool = False) -> None:
        self.rng = rng
        self.events: list[StoredEvent] = []
        self.stored_at: list[int] = []  # the number of replay reads when each was stored
        self.position = 0
        self.lag = lag
        self.followers: list[Follower] = []
        self.replays = 0
        self.churns_left = 200

    def store(self, owner: str = ME, job: str = "j1") -> StoredEvent:
        seq = len(self.events) + 1
        event = StoredEvent(seq, subject(owner, job), json.dumps({"n": seq}).encode())
        self.events.append(event)
        self.stored_at.append(self.replays)
        return event

    def feed(self, n: int | None = None) -> None:
        """Hand the next ``n`` stored events (all by default) to the followers, in order."""
        end = len(self.events) if n is None else min(len(self.events), self.position + n)
        for event in self.events[self.position : end]:
            if event.owner_key == ME:
                for follower in self.followers:
                    follower.offer(event)
            self.position = event.seq

    def churn(self) -> None:
        """What happens elsewhere while a read is in flight: events stored and fed (a bounded
        number of times: a client catches up only once events stop coming faster than it reads)."""
        if self.churns_left <= 0:
            return
        self.churns_left -= 1
        for _ in range(self.rng.randrange(4)):
            self.store(self.rng.choice([ME, ME, OTHER]), self.rng.choice(["j1", "j2"]))
        if self.rng.random() < 0.7:
            self.feed(self.rng.randrange(1, 6))

    async def replay(self, subject_filter: str, start_seq: int, *, batch: int) -> EventBatch:
        self.replays += 1
        await asyncio.sleep(0)
        self.churn()
        # a lagging replica has what was stored before the previous read, not since
        horizon = self.replays - 1 if self.lag else self.replays + 1
        visible = [e for e, t in zip(self.events, self.stored_at, strict=True) if t < horizon]
        found = [e for e in visible if e.seq >= start_seq and matches(subject_filter, e)]
        await asyncio.sleep(0)
        self.churn()
        return EventBatch(found[:batch], more=len(found) > batch)

    async def next_on_leader(self, subject_filter: str, start_seq: int) -> StoredEvent | None:
        await asyncio.sleep(0)
        found = next(
            (e for e in self.events if e.seq >= start_seq and matches(subject_filter, e)), None
        )
        self.churn()
        return found


def follow(
    stream: FakeStream,
    outbox: Outbox,
    *,
    start: int | None,
    job_ids: set[str] | None = None,
    subject_filter: str | None = None,
    stall_seconds: float = 30.0,
) -> Follower:
    follower = Follower(
        stream,
        outbox,
        subject_filter=subject_filter or f"t.status.{ME}.>",
        job_ids=job_ids,
        start=start,
        stall_seconds=stall_seconds,
    )
    stream.followers.append(follower)
    return follower


async def drain(outbox: Outbox, into: list[int], *, slowness: int = 0) -> None:
    """The writer: takes every frame, yielding ``slowness`` extra times after each."""
    while True:
        frame = json.loads(await outbox.get())
        into.append(frame["id"])
        for _ in range(slowness + 1):
            await asyncio.sleep(0)


async def settle(stream: FakeStream, follower: Follower, outbox: Outbox) -> None:
    """Feed everything, until the follower is live with nothing left to send."""
    async with asyncio.timeout(10):
        while follower.catching_up or len(outbox) or stream.position < len(stream.events):
            stream.feed()
            await asyncio.sleep(0)


def wanted(stream: FakeStream, start: int, jobs: set[str] | None = None) -> list[int]:
    return [
        e.seq
        for e in stream.events
        if e.seq >= start and e.owner_key == ME and (jobs is None or e.job_id in jobs)
    ]


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("lag", [False, True])
async def test_a_resumed_subscription_gets_every_event_once_in_order(seed: int, lag: bool) -> None:
    rng = random.Random(seed)
    stream = FakeStream(rng, lag=lag)
    for _ in range(rng.randrange(0, 400)):
        stream.store(rng.choice([ME, OTHER]), rng.choice(["j1", "j2"]))
    stream.feed()
    start = rng.randrange(1, len(stream.events) + 2)
    outbox = Outbox(rng.choice([3, 20, 1000]))
    follower = follow(stream, outbox, start=start)
    sent: list[int] = []
    async with asyncio.TaskGroup() as tg:
        running = tg.create_task(follower.run())
        writer = tg.create_task(drain(outbox, sent, slowness=rng.choice([0, 3])))
        for _ in range(rng.randrange(0, 60)):
            stream.churn()
            for _ in range(rng.randrange(3)):
                await asyncio.sleep(0)
        await settle(stream, follower, outbox)
        running.cancel()
        writer.cancel()
    assert sent == wanted(stream, start)


async def test_a_subscription_from_now_gets_only_new_events() -> None:
    stream = FakeStream(random.Random(1))
    for _ in range(10):
        stream.store()
    stream.feed()
    outbox = Outbox(100)
    follower = follow(stream, outbox, start=None)
    new = [stream.store().seq, stream.store(OTHER).seq, stream.store().seq]
    stream.feed()
    sent: list[int] = []
    while len(outbox):
        sent.append(json.loads(outbox.take())["id"])
    assert sent == [new[0], new[2]]
    assert not follower.catching_up and stream.replays == 0


async def test_a_live_client_whose_outbox_fills_catches_up_from_the_stream() -> None:
    stream = FakeStream(random.Random(2))
    outbox = Outbox(5)
    follower = follow(stream, outbox, start=None)
    for _ in range(50):
        stream.store()
    stream.feed()  # 5 fit, the 6th finds the outbox full
    assert follower.catching_up
    sent: list[int] = []
    async with asyncio.TaskGroup() as tg:
        running = tg.create_task(follower.run())
        writer = tg.create_task(drain(outbox, sent))
        await settle(stream, follower, outbox)
        running.cancel()
        writer.cancel()
    assert sent == wanted(stream, 1)
    assert stream.replays > 0


async def test_only_the_subscribed_jobs_are_sent() -> None:
    rng = random.Random(3)
    stream = FakeStream(rng)
    for i in range(100):
        stream.store(job=f"j{i % 4}")
    stream.feed()
    outbox = Outbox(1000)
    follower = follow(stream, outbox, start=1, job_ids={"j1", "j3"})
    sent: list[int] = []
    async with asyncio.TaskGroup() as tg:
        running = tg.create_task(follower.run())
        writer = tg.create_task(drain(outbox, sent))
        for i in range(20):
            stream.store(job=f"j{i % 4}")
            await asyncio.sleep(0)
        await settle(stream, follower, outbox)
        running.cancel()
        writer.cancel()
    assert sent == wanted(stream, 1, {"j1", "j3"})


async def test_a_replay_never_holds_more_than_its_read_ahead() -> None:
    """A client that takes nothing costs at most one read-ahead of events, then stalls."""
    stream = FakeStream(random.Random(4))
    for _ in range(5000):
        stream.store()
    stream.feed()
    outbox = Outbox(1000)
    follower = follow(stream, outbox, start=1, stall_seconds=0.05)
    with pytest.raises(Stalled):
        async with asyncio.timeout(10):
            await follower.run()
    assert len(outbox) == follower.read_ahead < 1000
    assert stream.replays == 1
