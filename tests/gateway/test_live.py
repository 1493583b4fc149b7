"""The live-status feed of one gateway (:class:`gateway.live.LiveStatus`) on an in-memory status
stream (:class:`tests.fakes.FakeStatusStream`): who gets which event, and no gap or duplicate
when the feed is lost.
"""

from __future__ import annotations

import asyncio

import pytest

from core.errors import BusUnavailable
from core.ids import owner_key
from core.live import StoredEvent
from gateway.live import LiveStatus
from tests.fakes import FakeStatusStream, until


class Collecting:
    """A subscriber that takes every event it is offered."""

    def __init__(self) -> None:
        self.got: list[StoredEvent] = []

    def offer(self, event: StoredEvent) -> None:
        self.got.append(event)

    @property
    def catching_up(self) -> bool:
        return False


async def test_each_event_reaches_its_users_subscribers_once_across_a_lost_feed() -> None:
    stream = FakeStatusStream()
    before = stream.append("alice", "j1")  # stored before the feed starts: replay, not live
    live = LiveStatus(stream)
    alice, bob = Collecting(), Collecting()
    live.add(owner_key("alice"), alice)
    live.add(owner_key("bob"), bob)
    async with asyncio.TaskGroup() as tg:
        feed = tg.create_task(live.run())
        await live.started()
        assert live.position == before.seq
        first, other = stream.append("alice", "j1"), stream.append("bob", "j2")
        await until(lambda: live.position == other.seq)
        stream.fail_batches = 1
        after = stream.append("alice", "j3")  # its batch is lost with the feed
        await until(lambda: live.position == after.seq)
        feed.cancel()

    assert alice.got == [first, after]
    assert bob.got == [other]
    assert stream.feeds == [before.seq + 1, after.seq]  # resumed where it stopped


async def test_a_gateway_without_a_status_stream_has_no_live_status() -> None:
    live = LiveStatus(None)
    await live.run()  # returns at once
    with pytest.raises(BusUnavailable):
        await live.started()
