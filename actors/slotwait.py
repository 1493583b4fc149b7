"""A worker's side of a concurrency limit: take a slot for one run, keep it, give it back.

The rules are :mod:`core.concurrency`'s; the slots are shared by every worker
(:class:`core.ports.ConcurrencySlots`, NATS KV: :mod:`bus.slots`). A run that must wait holds its
message with in-progress acks (no redelivery, so no attempt and no delivery of ``max_deliver``
is spent waiting) and sleeps until its key's entry is written by anyone or the decision's
``wake_at_ms`` (a lease ahead of it expires, or its own place is due for renewal). Its worker
starts other runs meanwhile (:meth:`actors.worker.Worker._parked`).
"""

from __future__ import annotations

import asyncio
import logging

import msgspec

from core.clock import Clock
from core.concurrency import (
    ConcurrencyWait,
    Outcome,
    SlotDecision,
    SlotRequest,
    explain_wait,
    should_retry,
    skip_reason,
)
from core.errors import BusUnavailable
from core.model import RunMessage
from core.ports import ConcurrencySlots
from core.retry import Backoff, RetryPolicy, raise_if_cancelling
from core.timeutil import to_epoch_ms

log = logging.getLogger(__name__)

SLOT_RETRY = RetryPolicy(first_seconds=0.5, max_seconds=5.0)
"""A slot decision that NATS did not answer is tried again after 0.5 s, doubling up to 5 s."""


class _Owner(msgspec.Struct):
    owner: str = ""


_owner_decoder = msgspec.json.Decoder(_Owner)


def owner_of(data: bytes) -> str:
    """The ``owner`` of a run message ("" when it cannot be read: it is then refused as
    poison when it runs)."""
    try:
        return _owner_decoder.decode(data).owner
    except msgspec.DecodeError:
        return ""


class SlotWait:
    """The concurrency slot of one delivered run (``run.concurrency_key`` set).

    Args:
        slots: the shared slots.
        run: the run message.
        worker_id: recorded in the slot.
        clock: wall clock (epoch ms of leases).
    """

    def __init__(
        self, slots: ConcurrencySlots, run: RunMessage, worker_id: str, clock: Clock
    ) -> None:
        assert run.concurrency_key is not None
        self.slots = slots
        self.clock = clock
        self.run = run
        self.request = SlotRequest(
            owner=run.owner,
            key=run.concurrency_key,
            execution_id=run.execution_id,
            worker_id=worker_id,
            order_ms=to_epoch_ms(run.scheduled_for),
            max_concurrent=run.max_concurrent,
            policy=run.concurrency_policy,
        )
        self.decision: SlotDecision | None = None

    @property
    def lease_ms(self) -> int:
        return int(self.slots.lease_seconds * 1000)

    @property
    def skip_reason(self) -> str:
        return skip_reason(self.request.key, self.request.max_concurrent)

    def _now_ms(self) -> int:
        return to_epoch_ms(self.clock.now())

    async def first(self) -> Outcome:
        """One decision without waiting: ACQUIRED, SKIPPED, or WAITING (then :meth:`take`
        waits; also when NATS did not answer, which :meth:`take` retries)."""
        try:
            self.decision = await self.slots.acquire(self.request, self._now_ms())
        except BusUnavailable as e:
            log.warning("run %s: no slot decision yet: %s", self.run.execution_id, e)
            return Outcome.WAITING
        return self.decision.outcome

    async def take(self) -> Outcome:
        """Wait for a slot: ACQUIRED (run now) or SKIPPED (policy ``skip``, none free)."""
        backoff = Backoff(SLOT_RETRY, self.clock, log=log)
        logged = False
        while True:
            raise_if_cancelling()
            try:
                decision = await self.slots.acquire(self.request, self._now_ms())
            except BusUnavailable as e:
                await backoff.wait(f"run {self.run.execution_id}: no slot decision", e)
                continue
            backoff.reset()
            self.decision = decision
            if decision.outcome != Outcome.WAITING:
                return decision.outcome
            if not logged:
                logged = True
                log.info(
                    "run %s waits for a slot of concurrency key %r (place %d)",
                    self.run.execution_id,
                    self.request.key,
                    decision.position,
                    extra={"execution_id": self.run.execution_id, "job_id": self.run.job_id},
                )
            await self._until_worth_trying(decision)

    async def _until_worth_trying(self, decision: SlotDecision) -> None:
        """Sleep until the key's entry changes in a way that lets this run go or until
        ``wake_at_ms``; writes by other waiters that change nothing for it do not wake it."""
        assert decision.wake_at_ms is not None
        while True:
            timeout_seconds = max(0.0, (decision.wake_at_ms - self._now_ms()) / 1000)
            changed, state = await self.slots.changed(
                self.request.owner, self.request.key, timeout_seconds
            )
            if not changed or state is None:
                return
            if should_retry(state, self.request, self._now_ms(), self.lease_ms):
                return

    async def keep(self) -> None:
        """Renew the slot every third of the lease until cancelled (a failed renewal is
        retried at the next round; the lease outlives two of them)."""
        period = self.slots.lease_seconds / 3
        while True:
            raise_if_cancelling()
            await asyncio.sleep(period)
            try:
                await self.slots.renew(self.request, self._now_ms())
            except BusUnavailable as e:
                log.warning("run %s: slot renewal failed: %s", self.run.execution_id, e)

    async def release(self) -> None:
        """Give the slot (or place in line) back; idempotent. A release that fails leaves the
        slot to expire with its lease."""
        try:
            await self.slots.release(
                self.request.owner, self.request.key, self.run.execution_id, self._now_ms()
            )
        except BusUnavailable as e:
            log.warning(
                "run %s: slot release failed (%s); it frees when its lease expires",
                self.run.execution_id,
                e,
            )

    def explain(self) -> ConcurrencyWait:
        """What this worker last saw of the run's key (for logs and ``explain``)."""
        state = self.decision.state if self.decision else None
        return explain_wait(
            state,
            self.request.key,
            self.request.max_concurrent,
            self.run.execution_id,
            self._now_ms(),
        )
