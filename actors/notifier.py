"""Notifier actor: tells webhooks about finished runs (see :mod:`core.notifications`).

It reads the status stream through a durable consumer of its own, ``notifier`` (shared by every
notifier of the deployment, apart from the recorders'), so a notification never delays or fails
the run it reports on, and what it has not finished survives its restarts: a message is acked
only once its notification is delivered, given up, or not wanted.

For each final run event (SUCCEEDED or FAILED) whose job's webhook — the job's ``notify``, else
its owner's default — asks for that outcome:

1. the run's final record is read from the store; until the recorder has written it the message
   is handed back for 50 ms, then longer (:data:`RECORD_WAIT`);
2. the attempts recorded so far decide the next one: none after a delivered one or after
   :data:`core.notifications.MAX_ATTEMPTS`; an attempt due later (a redelivery that came early,
   after a restart) waits for its time;
3. the POST goes out through :class:`WebhookSender` (the SSRF guard of the ``http`` task, so a
   refused address is a failed attempt), and the attempt is recorded — status, error, duration,
   attempt number, the next attempt's time — before the message is acked (delivered, or the
   last attempt) or handed back with the backoff delay (:data:`RETRY`: 5 s doubling with 20 %
   jitter up to 1 h, :class:`core.retry.RetryPolicy`).

Attempts are recorded per ``<execution id>#<attempt>`` (idempotent), so a redelivery after a crash
between the POST and the ack repeats at most that one attempt, with the same ``webhook-id`` for
the receiver to de-duplicate (at-least-once delivery, as every webhook sender's).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import msgspec

from actors.metrics import Metrics
from core import notifications as n
from core.clock import Clock, SystemClock
from core.codecs import status_decoder
from core.errors import (
    BusUnavailable,
    ConsumerMissing,
    JobNotFound,
    JobschedError,
    StoreUnavailable,
)
from core.model import TERMINAL_EXECUTION_STATUSES, Execution, StatusEvent
from core.notify_spec import NotifyTarget, Outcome
from core.ports import Consumer, Delivery, JobStore, Streams
from core.retry import Backoff, RetryPolicy, raise_if_cancelling
from core.timeutil import to_utc_ms
from core.values import MAX_ERROR_CHARS, storable_text

log = logging.getLogger(__name__)

RETRY = RetryPolicy(
    first_seconds=n.FIRST_RETRY_SECONDS,
    max_seconds=n.MAX_RETRY_SECONDS,
    jitter=n.RETRY_JITTER,
)
"""Delay after failed delivery attempt number k: ``5 s · 2^(k-1)`` ± 20 %, at most 1 h."""
FETCH_RETRY = RetryPolicy(first_seconds=1.0, max_seconds=1.0)
RECORD_WAIT = RetryPolicy(first_seconds=0.05, max_seconds=1.0)
"""How long a final event waits for the recorder to store the run: 50 ms after its first
delivery (the recorder reads the same event at the same time), doubling to 1 s."""
STORE_WAIT_SECONDS = 2.0
"""How long a message waits while the store is unavailable (seconds)."""
POISON_WAIT_SECONDS = 300.0
"""How long a message waits after an error that is not an outage (seconds): it neither stops
the notifier nor is it dropped."""


@dataclass(frozen=True, slots=True)
class WebhookResult:
    """The answer to one POST: the HTTP status (None: none came), why it failed (None: a
    2xx), and whether a retry cannot help (``final``: the SSRF guard refused the address, as
    the ``http`` task fails such a run at once)."""

    status_code: int | None
    error: str | None
    final: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None


class WebhookSender(Protocol):
    """POSTs a webhook (``jobsched.webhooks.AiohttpSender``: aiohttp, behind the SSRF guard)."""

    async def post(self, url: str, headers: dict[str, str], body: bytes) -> WebhookResult:
        """Send once; never raises for what the target or the network does (it is the
        result's ``error``)."""
        ...


class NotifierBus(Streams, Protocol):
    """What the notifier needs of the bus (NATS: :class:`bus.notifier.NotifierStream`)."""

    async def notifier_consumer(self) -> Consumer:
        """The consumer every notifier shares (created if missing)."""
        ...

    async def ensure_notifier_consumer(self) -> None:
        """Create it again (after :class:`ConsumerMissing`)."""
        ...


class Notifier:
    """Delivers run notifications (see module docstring).

    Args:
        bus: the status stream's ``notifier`` consumer.
        store: jobs, runs, defaults, and where attempts are recorded.
        sender: sends one POST.
        clock: wall clock (attempt times, ``webhook-timestamp``).
        retry: the delays between attempts (default :data:`RETRY`).
        concurrency: notifications in flight at once (one slow receiver holds one slot).
        metrics: where attempts are counted; default: a registry of its own.
    """

    def __init__(
        self,
        bus: NotifierBus,
        store: JobStore,
        sender: WebhookSender,
        *,
        clock: Clock | None = None,
        retry: RetryPolicy = RETRY,
        concurrency: int = 32,
        metrics: Metrics | None = None,
    ) -> None:
        self.bus = bus
        self.store = store
        self.sender = sender
        self.clock = clock or SystemClock()
        self.retry = retry
        self.concurrency = concurrency
        self.name = "notifier"
        self.ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self.attempts = 0
        self.metrics = metrics or Metrics()

    def stop(self) -> None:
        """Take no more messages; the notifications in flight finish (idempotent)."""
        self._stopping.set()

    async def run(self) -> None:
        if not await self.bus.wait_for_streams(self._stopping):
            return
        consumer = await self.bus.notifier_consumer()
        self.ready.set()
        backoff = Backoff(FETCH_RETRY, SystemClock(), stop=self._stopping, log=log)
        in_flight: set[asyncio.Task[None]] = set()
        try:
            async with asyncio.TaskGroup() as tg:
                while not self._stopping.is_set():
                    raise_if_cancelling()
                    if len(in_flight) >= self.concurrency:
                        await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
                        continue
                    try:
                        deliveries = await consumer.fetch(
                            self.concurrency - len(in_flight), timeout_seconds=1.0
                        )
                    except ConsumerMissing as e:
                        log.warning("notifier: %s; re-creating it", e)
                        with contextlib.suppress(BusUnavailable):
                            await self.bus.ensure_notifier_consumer()
                        continue
                    except BusUnavailable as e:
                        await backoff.wait("notifier", e)
                        continue
                    backoff.reset()
                    for d in deliveries:
                        task = tg.create_task(self._one(d), name=f"notifier {d.stored_id}")
                        in_flight.add(task)
                        task.add_done_callback(in_flight.discard)
        finally:
            with contextlib.suppress(BusUnavailable):
                await consumer.quiesce()  # hand back what is still arriving, for the next one
            await consumer.close()

    async def _one(self, d: Delivery) -> None:
        try:
            await self.handle(d)
        except StoreUnavailable as e:
            log.warning("notifier: store unavailable (%s); message handed back", e)
            with contextlib.suppress(BusUnavailable):
                await d.nak(STORE_WAIT_SECONDS)
        except BusUnavailable as e:
            log.warning("notifier: cannot acknowledge (%s); it will be redelivered", e)
        except JobschedError as e:  # e.g. StoreRejected: keep it, away from the others
            log.error("notifier: message %s failed (%s); retried in %g s", d.stored_id, e,
                      POISON_WAIT_SECONDS)  # fmt: skip
            with contextlib.suppress(BusUnavailable):
                await d.nak(POISON_WAIT_SECONDS)

    async def handle(self, d: Delivery) -> None:
        """Act on one status-stream message (acked, or handed back with a delay)."""
        try:
            event = status_decoder.decode(d.data)
        except msgspec.DecodeError:
            await d.ack()  # the recorder sets it aside as a dead letter
            return
        if not isinstance(event, StatusEvent) or event.status not in n.OUTCOME_OF:
            await d.ack()
            return
        target = await self._target(event)
        outcome = n.wanted(target, event.status)
        if target is None or outcome is None:
            await d.ack()
            return
        attempts = await self.store.notification_attempts(event.execution_id)
        if any(a.ok for a in attempts) or len(attempts) >= n.MAX_ATTEMPTS:
            await d.ack()
            return
        now = self.clock.now()
        due = attempts[-1].next_attempt_at if attempts else None
        if due is not None and due > now:
            await d.nak((due - now).total_seconds())
            return
        run = await self.store.get_execution(event.execution_id)
        if run is None or run.status not in TERMINAL_EXECUTION_STATUSES:
            await d.nak(RECORD_WAIT.delay_seconds(max(1, d.num_delivered)))
            return
        number = max((a.attempt for a in attempts), default=0) + 1
        attempt = await self._attempt(target, outcome, run, number)
        await self.store.record_notification_attempt(attempt)
        if attempt.next_attempt_at is None:
            await d.ack()
        else:
            await d.nak((attempt.next_attempt_at - attempt.at).total_seconds())

    async def _target(self, event: StatusEvent) -> NotifyTarget | None:
        try:
            job = await self.store.get_job(event.owner, event.job_id)
        except JobNotFound:
            return None  # deleted since
        if job.notify is not None:
            return job.notify
        return await self.store.get_notification_default(job.owner)

    async def _attempt(
        self, target: NotifyTarget, outcome: Outcome, run: Execution, number: int
    ) -> n.NotificationAttempt:
        at = to_utc_ms(self.clock.now())
        msg_id = n.webhook_id(run.id)
        body = n.payload(outcome, run, at)
        began = time.perf_counter()
        result = await self.sender.post(
            target.url, n.signed_headers(target, msg_id, at, body), body
        )
        duration_ms = round((time.perf_counter() - began) * 1000, 1)
        self.attempts += 1
        outcome_label = "delivered" if result.ok else "failed"
        self.metrics.notification_attempts.labels(status=outcome_label).inc()
        retry = not result.final and n.retry_at_attempt(number, result.ok)
        delay = timedelta(seconds=self.retry.delay_seconds(number))
        next_at = to_utc_ms(at + delay) if retry else None
        extra = {"execution_id": run.id, "job_id": run.job_id, "attempt": number}
        if result.ok:
            log.info("notifier: run %s notified (%s)", run.id, result.status_code, extra=extra)
        else:
            log.warning(
                "notifier: run %s notification attempt %d failed: %s%s",
                run.id,
                number,
                result.error,
                "" if retry else "; giving up",
                extra=extra,
            )
        return n.NotificationAttempt(
            id=n.attempt_id(run.id, number),
            execution_id=run.id,
            job_id=run.job_id,
            owner=run.owner,
            webhook_id=msg_id,
            attempt=number,
            url=target.url,
            event_type=n.EVENT_TYPE[outcome],
            at=at,
            duration_ms=duration_ms,
            status_code=result.status_code,
            ok=result.ok,
            error=None if result.error is None else storable_text(result.error, MAX_ERROR_CHARS),
            next_attempt_at=next_at,
        )
