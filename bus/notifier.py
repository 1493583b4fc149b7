"""The status stream as the notifier reads it (:class:`actors.notifier.NotifierBus`): a durable
pull consumer of its own, ``notifier``, next to the recorders' (same filter, same ack wait), so
the notifiers neither take events from the recorders nor wait for them."""

from __future__ import annotations

import asyncio

from bus.nats import Bus, PullConsumer

NOTIFIER_CONSUMER = "notifier"
"""Durable pull consumer of the status stream that the notifiers share."""


class NotifierStream:
    """:class:`actors.notifier.NotifierBus` over one connection (the notifier's own NATS user).

    Args:
        bus: a connected adapter.
    """

    def __init__(self, bus: Bus) -> None:
        self.bus = bus

    async def wait_for_streams(self, stop: asyncio.Event, *, interval_seconds: float = 1.0) -> bool:
        return await self.bus.wait_for_streams(stop, interval_seconds=interval_seconds)

    async def notifier_consumer(self) -> PullConsumer:
        return await self.bus.recorder_consumer(NOTIFIER_CONSUMER)

    async def ensure_notifier_consumer(self) -> None:
        await self.bus.ensure_recorder_consumer(NOTIFIER_CONSUMER)
