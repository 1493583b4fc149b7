"""Worker actor: executes due runs from the work queues and reports every transition.

For each delivered run (at-least-once, JetStream ack-wait redelivery):

1. decode it; an undecodable message or an unknown task is recorded FAILED and terminated
   (``+TERM``), never redelivered forever (case S06);
2. attempt = attempts spent before publication + JetStream's delivery count; past the job's
   ``maxAttempts`` (earlier attempts died with their worker) it is recorded FAILED and terminated;
3. report RUNNING (with ``running_grace_seconds``: only once the attempt has run that long), run the
   task with its timeout while an in-progress ack (``+WPI``) every third of the ack wait keeps
   the message from being redelivered (case S05);
4. success: report SUCCEEDED, then ack. Failure: report RETRYING and ``-NAK`` with an exponential
   backoff delay, or after the last attempt report FAILED and terminate.

A status report is published to the status stream and acknowledged by JetStream *before* the
work message is acked, so no transition is lost. The worker needs NATS only, never the store.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Coroutine
from datetime import datetime, timedelta
from typing import Any

import msgspec

from actors.cpu import CpuPool
from actors.metrics import UNKNOWN_TASK, Metrics, TaskMetrics
from actors.reports import ReportBatcher
from actors.slotwait import SlotWait, owner_of
from core.backoff import retry_delay
from core.clock import Clock, SystemClock
from core.cluster import PRESENCE_HEARTBEAT_SECONDS, WorkerHeartbeat, release
from core.codecs import run_decoder
from core.concurrency import Outcome
from core.errors import BusUnavailable, ConsumerMissing, InvalidRequest
from core.fairness import FairQueue
from core.ids import execution_id_of_msg_id, run_key
from core.model import ExecutionStatus, RunMessage, StatusEvent
from core.ports import (
    CancelSignals,
    ConcurrencySlots,
    Consumer,
    Delivery,
    WorkerBus,
    WorkerPresenceBoard,
)
from core.retry import Backoff, RetryPolicy, raise_if_cancelling
from core.runs import poison_event, run_event
from core.settings import WorkerConfig
from core.tasks import TaskCatalog, TaskContext, TaskError, TaskSpec
from core.values import storable_event

log = logging.getLogger(__name__)


PULL_RETRY = RetryPolicy(first_seconds=1.0, max_seconds=1.0)
"""A failed pull (NATS unreachable) is tried again every second."""
PRESENCE_MIN_GAP_SECONDS = 1.0
"""Between two heartbeats at least this long (seconds): runs starting and ending in between
are told in one."""
RETRY_AFTER_MAX_SECONDS = 3600.0
"""The longest a task's :class:`core.tasks.TaskError` ``retry_after_seconds`` (an HTTP
``Retry-After``) delays the next attempt (seconds): a target cannot park a run for days."""
REPORT_RETRY = RetryPolicy(first_seconds=0.1, max_seconds=5.0)
"""A status report is published until it is stored: after 0.1 s, then twice as long each time
up to 5 s, for as long as it takes (never cut short by a stop: the transition must reach the
store)."""


class RunCancelled(Exception):
    """A cancellation marker stopped the run."""


class Worker:
    """Consumes the work queues of ``config.queues`` and executes runs.

    Args:
        bus: the work queues and the status stream (NATS: :class:`bus.nats.Bus`).
        catalog: the tasks this worker can run.
        clock: wall clock for timestamps.
        config: see :class:`WorkerConfig`.
        markers: cancellation markers to watch (None: runs are not cancelled while running).
        metrics: where it observes runs (per task of ``catalog``) and redeliveries; default: a
            registry of its own.
        timer: what retry pauses are measured on; default: real time, whatever ``clock`` is
            (unit tests pass their fake clock).
        slots: the concurrency slots shared by every worker (:mod:`actors.slotwait`); None:
            runs with a concurrency key run unlimited (logged).
        presence: where it sends a :class:`core.cluster.WorkerHeartbeat` every
            :data:`core.cluster.PRESENCE_HEARTBEAT_SECONDS` while it consumes, withdrawn when
            it stops (None: it announces nothing; the Cluster page knows it by its runs only).
    """

    def __init__(
        self,
        bus: WorkerBus,
        catalog: TaskCatalog,
        clock: Clock,
        config: WorkerConfig,
        markers: CancelSignals | None = None,
        metrics: Metrics | None = None,
        timer: Clock | None = None,
        slots: ConcurrencySlots | None = None,
        presence: WorkerPresenceBoard | None = None,
    ) -> None:
        self.timer = timer or SystemClock()
        self.bus = bus
        self.catalog = catalog
        self.clock = clock
        self.config = config
        self._allowed_networks = tuple(str(n) for n in config.egress.allowed)
        # resolved once: Path.resolve() is a realpath() walk, ~5 % of a worker's CPU per run
        self._data_dir = config.resolved_data_dir
        self._secrets_dir = config.resolved_secrets_dir
        self.name = f"worker[{config.resolved_worker_id}]"
        self.ready = asyncio.Event()
        self._stopping = asyncio.Event()
        self._active = 0
        self._freed = asyncio.Event()
        self._runs: set[asyncio.Task[None]] = set()
        self.markers = markers
        self._executing: dict[str, tuple[str, asyncio.Task[Any]]] = {}
        self._cancel_requested: set[str] = set()
        self._cpu = CpuPool(config.cpu_slots)
        self._cpu_slots = asyncio.Semaphore(self._cpu.slots)
        self._finished: collections.OrderedDict[str, bool] = collections.OrderedDict()
        self.metrics = metrics or Metrics()
        self._task_metrics = {spec.name: self.metrics.task(spec.name) for spec in catalog}
        self._unknown_task = self.metrics.task(UNKNOWN_TASK)
        self.slots = slots
        self.presence = presence
        self._intake: FairQueue[Delivery] = FairQueue()
        self._resuming: collections.deque[asyncio.Future[None]] = collections.deque()
        self._waiting = 0
        self._tg: asyncio.TaskGroup | None = None
        self._owner_of: dict[asyncio.Task[None], str] = {}
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._reports = ReportBatcher(bus, self.name)
        self._graces = _GraceTimer(self.timer)
        self._load_changed = asyncio.Event()

    def stop(self) -> None:
        """Stop taking work and drain (idempotent)."""
        self._stopping.set()

    async def run(self) -> None:
        """Consume until :meth:`stop`; then drain in-flight runs up to the drain timeout.

        Raises:
            BusUnavailable: when the work consumers cannot be created at start.
        """
        consumers: dict[str, Consumer] = {}
        if not await self.bus.wait_for_streams(self._stopping):
            return
        try:
            for queue in self.config.queues:
                consumers[queue] = await self.bus.work_consumer(queue)
            log.info("%s consuming %s", self.name, ", ".join(self.config.queues))
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                helpers = [
                    tg.create_task(
                        self._keep_intake_alive(), name=f"{self.name} intake in-progress"
                    ),
                    tg.create_task(self._reports.run(), name=f"{self.name} status reports"),
                    tg.create_task(self._graces.run(), name=f"{self.name} running grace"),
                ]
                if self.slots is not None:
                    helpers.append(tg.create_task(self.slots.watch(), name=f"{self.name} slots"))
                if self.presence is not None:
                    helpers.append(
                        tg.create_task(
                            self._heartbeat(self.presence), name=f"{self.name} heartbeat"
                        )
                    )
                watch = None
                if self.markers is not None:
                    watch = tg.create_task(
                        self.markers.watch(self._on_marker), name=f"{self.name} cancel markers"
                    )
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(5):
                            await self.markers.ready.wait()
                pulls = [
                    tg.create_task(self._pull(q, c, tg), name=f"{self.name} pull {q}")
                    for q, c in consumers.items()
                ]
                self.ready.set()
                await asyncio.wait(pulls)
                await self._drain(list(consumers.values()))
                if watch is not None:
                    watch.cancel()
                for helper in helpers:
                    helper.cancel()
        finally:
            for consumer in consumers.values():
                for d in consumer.take_unprocessed():
                    await _shielded(d.nak(), 2.0)
                await consumer.close()
            if self.presence is not None:
                await _shielded(self._withdraw(self.presence), 2.0)
            self._cpu.close()

    def heartbeat(self, started_at: datetime) -> WorkerHeartbeat:
        """What this worker says of itself now (``in_flight``: runs executing or waiting for a
        concurrency slot)."""
        c = self.config
        return WorkerHeartbeat(
            worker_id=c.resolved_worker_id,
            queues=list(c.queues),
            concurrency=c.concurrency,
            in_flight=len(self._runs),
            started_at=started_at,
            version=release(),
        )

    async def _heartbeat(self, presence: WorkerPresenceBoard) -> None:
        """Announce this worker every :data:`PRESENCE_HEARTBEAT_SECONDS` and, at most every
        :data:`PRESENCE_MIN_GAP_SECONDS`, when a run starts or ends, until cancelled (a failed
        write is logged and tried again at the next beat)."""
        started_at, period = self.clock.now(), timedelta(seconds=PRESENCE_HEARTBEAT_SECONDS)
        gap, never = timedelta(seconds=PRESENCE_MIN_GAP_SECONDS), asyncio.Event()
        while True:
            raise_if_cancelling()
            self._load_changed.clear()
            written = self.timer.now()
            try:
                await presence.announce(self.heartbeat(started_at))
            except BusUnavailable as e:
                log.warning("%s: heartbeat not stored: %s", self.name, e)
            await self.timer.sleep_until(written + period, self._load_changed)
            if self._load_changed.is_set():  # a run started or ended: say so, coalesced
                await self.timer.sleep_until(written + gap, never)

    async def _withdraw(self, presence: WorkerPresenceBoard) -> None:
        try:
            await presence.withdraw(self.config.resolved_worker_id)
        except BusUnavailable as e:
            log.warning("%s: presence not withdrawn (it expires by itself): %s", self.name, e)

    async def _recreate(self, queue: str, backoff: Backoff) -> None:
        try:
            await self.bus.ensure_work_consumer(queue)  # the stream is a scheduler's to create
        except BusUnavailable as e:
            await backoff.wait(f"{self.name}: cannot re-create the consumer of {queue} yet", e)

    async def _pull(self, queue: str, consumer: Consumer, tg: asyncio.TaskGroup) -> None:
        redelivered = self.metrics.redeliveries.labels(queue=queue)
        backoff = Backoff(PULL_RETRY, self.timer, stop=self._stopping, log=log)
        while not self._stopping.is_set():
            raise_if_cancelling()
            free = self._room()
            if free <= 0:
                self._freed.clear()
                await self._freed.wait()
                continue
            try:
                deliveries = await consumer.fetch(free, timeout_seconds=1.0)
            except ConsumerMissing as e:
                log.warning("%s: %s; re-creating it", self.name, e)
                await self._recreate(queue, backoff)
                continue
            except BusUnavailable as e:
                await backoff.wait(self.name, e)
                continue
            backoff.reset()
            for d in deliveries:
                if d.num_delivered > 1:
                    redelivered.inc()
                if self._stopping.is_set():
                    await _shielded(d.nak(), 2.0)
                    continue
                self._intake.push(owner_of(d.data), d)
            self._start_queued()

    def _room(self) -> int:
        """Messages the pull loops may fetch now, only when a run could start: this worker
        holds at most ``2 x concurrency + prefetch`` messages — running ones, up to
        ``prefetch`` fetched ahead for fairness, and runs waiting for a concurrency slot
        (which hold no execution slot, so that the worker's other runs start meanwhile)."""
        c = self.config
        if self._active >= c.concurrency:
            return 0
        held = self._active + len(self._intake) + self._waiting
        return max(
            0,
            min(
                c.concurrency + c.prefetch - self._active - len(self._intake),
                2 * c.concurrency + c.prefetch - held,
            ),
        )

    def _start_queued(self) -> None:
        """Start runs while execution slots are free: first runs that waited for a concurrency
        slot and got it, then fetched messages round-robin across owners (:mod:`core.fairness`)."""
        tg = self._tg
        while self._active < self.config.concurrency:
            if self._resuming:
                fut = self._resuming.popleft()
                if not fut.done():
                    self._active += 1
                    fut.set_result(None)
                continue
            if self._stopping.is_set() or tg is None:
                return
            d = self._intake.pop(self._below_cap)
            if d is None:
                return
            self._active += 1
            task = tg.create_task(self._guarded(d), name=f"{self.name} run")
            owner = owner_of(d.data)
            self._owner_of[task] = owner
            self._in_flight[owner] += 1
            self._runs.add(task)
            self._load_changed.set()
            task.add_done_callback(self._done)

    def _below_cap(self, owner: str) -> bool:
        cap = self.config.user_concurrency
        return cap <= 0 or self._in_flight[owner] < cap

    def _done(self, task: asyncio.Task[None]) -> None:
        self._runs.discard(task)
        self._load_changed.set()
        owner = self._owner_of.pop(task, None)
        if owner is not None:
            self._in_flight[owner] -= 1
            if self._in_flight[owner] <= 0:
                del self._in_flight[owner]
        self._active -= 1
        self._freed.set()
        self._start_queued()

    async def _keep_intake_alive(self) -> None:
        """In-progress acks for fetched messages not started yet, every third of the ack wait
        (so that holding them for fairness never lets JetStream redeliver them)."""
        period = self.config.ack_wait_seconds / 3
        while True:
            raise_if_cancelling()
            await asyncio.sleep(period)
            for d in list(self._intake):
                try:
                    await d.in_progress()
                except BusUnavailable as e:
                    log.warning("in-progress ack failed: %s", e)
                    break

    async def _drain(self, consumers: list[Consumer]) -> None:
        """Second phase of a stop: let in-flight runs finish up to the drain timeout, then hand
        the rest back (nak). Runs are handed back only after the last pull request of each
        consumer ended, so JetStream cannot deliver them straight back to this worker."""
        tasks = set(self._runs)
        if tasks:
            log.info(
                "%s draining %d run(s) for up to %g s",
                self.name,
                len(tasks),
                self.config.drain_timeout_seconds,
            )
        finished = asyncio.ensure_future(
            asyncio.wait(tasks, timeout=self.config.drain_timeout_seconds)
            if tasks
            else asyncio.sleep(0)
        )
        try:
            await asyncio.gather(*(c.quiesce() for c in consumers))
            for d in self._intake.clear():
                await _shielded(d.nak(), 2.0)
            await finished
        finally:
            finished.cancel()
        pending = [t for t in tasks if not t.done()]
        for t in pending:
            t.cancel()
        if pending:
            log.info("%s handed back %d run(s) still running", self.name, len(pending))

    async def _guarded(self, d: Delivery) -> None:
        """One run; an unexpected error is logged and the message left to redelivery."""
        try:
            await self._handle(d)
        except BusUnavailable as e:
            log.warning("%s: run left for redelivery: %s", self.name, e)
        except Exception:
            log.exception("%s: unexpected error; run left for redelivery", self.name)

    # --- one run -------------------------------------------------------------------------------

    async def _handle(self, d: Delivery) -> None:
        try:
            run = run_decoder.decode(d.data)
        except msgspec.DecodeError as e:
            await self._poison(d, f"undecodable run message: {e}")
            return
        if run.execution_id in self._finished:
            await (d.ack() if self._finished[run.execution_id] else d.term())
            return
        if self.markers is not None and self.markers.is_cancelled(run.job_id, run.execution_id):
            await self._cancelled(d, run, d.num_delivered + run.attempt_offset, started=None)
            return
        try:
            spec = self.catalog.get(run.task_id)
            params = spec.decode_params(run.parameters)
        except InvalidRequest as e:
            await self._give_up(d, run, d.num_delivered + run.attempt_offset, f"cannot run: {e}")
            return
        attempt = run.attempt_offset + d.num_delivered
        if attempt > run.max_attempts:
            await self._give_up(
                d,
                run,
                run.max_attempts,
                f"gave up after {run.max_attempts} attempt(s) without an outcome "
                "(the worker running it was lost)",
            )
            return
        try:
            async with asyncio.TaskGroup() as tg:
                keepalive = tg.create_task(
                    self._keep_alive(d), name=f"{self.name} in-progress {run.execution_id}"
                )
                try:
                    await self._limited(d, run, spec, params, attempt, tg)
                finally:
                    keepalive.cancel()
        except asyncio.CancelledError:
            await _shielded(d.nak(), 5.0)
            raise

    async def _limited(
        self,
        d: Delivery,
        run: RunMessage,
        spec: TaskSpec,
        params: msgspec.Struct,
        attempt: int,
        tg: asyncio.TaskGroup,
    ) -> None:
        """The attempt, within the run's concurrency limit when it has one: wait for a slot
        (:mod:`actors.slotwait`), keep it renewed while the task runs, give it back after the
        outcome is reported (so that no run of the key reports RUNNING before it)."""
        if run.concurrency_key is None or self.slots is None:
            if run.concurrency_key is not None:
                log.warning("run %s: no slot bucket; concurrency key ignored", run.execution_id)
            await self._attempt(d, run, spec, params, attempt, tg)
            return
        wait = SlotWait(self.slots, run, self.config.resolved_worker_id, self.clock)
        try:
            outcome = await wait.first()  # uncontended: keeps its execution slot
            if outcome == Outcome.WAITING:
                outcome = await self._parked(wait.take())
            if outcome == Outcome.SKIPPED:
                await self._skipped(d, run, wait)
                return
            if self.markers is not None and self.markers.is_cancelled(run.job_id, run.execution_id):
                await self._cancelled(d, run, attempt, started=None)
                return
            renewal = tg.create_task(wait.keep(), name=f"{self.name} slot {run.execution_id}")
            try:
                await self._attempt(d, run, spec, params, attempt, tg)
            finally:
                renewal.cancel()
        finally:
            await _shielded(wait.release(), 5.0)

    async def _parked(self, take: Coroutine[Any, Any, Outcome]) -> Outcome:
        """Await ``take`` (a concurrency slot) without holding an execution slot of this
        worker, so that its other runs start meanwhile; then take an execution slot back
        (before fetched messages: :meth:`_start_queued`)."""
        self._active -= 1
        self._waiting += 1
        self._freed.set()
        self._start_queued()
        resumed = False
        try:
            outcome = await take
            await self._resume()
            resumed = True
            return outcome
        finally:
            self._waiting -= 1
            if not resumed:
                self._active += 1

    async def _resume(self) -> None:
        if self._active < self.config.concurrency and not self._resuming:
            self._active += 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._resuming.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._active -= 1
            raise

    async def _skipped(self, d: Delivery, run: RunMessage, wait: SlotWait) -> None:
        """``concurrencyPolicy: skip`` and every slot taken: the run is recorded SKIPPED."""
        now = self.clock.now()
        await self._report(
            msgspec.structs.replace(
                self._event_base(run, 0, None),  # it never had an attempt
                status=ExecutionStatus.SKIPPED,
                at=now,
                finished_at=now,
                error=wait.skip_reason,
            )
        )
        await self._settle(d, run.execution_id, ack=False)
        log.info(
            "run %s SKIPPED: %s",
            run.execution_id,
            wait.skip_reason,
            extra={"execution_id": run.execution_id},
        )

    async def _attempt(
        self,
        d: Delivery,
        run: RunMessage,
        spec: TaskSpec,
        params: msgspec.Struct,
        attempt: int,
        tg: asyncio.TaskGroup,
    ) -> None:
        """One attempt. The RUNNING report is acknowledged while the task runs (not before it
        starts); every later report of the run waits for it, so the stream keeps their order."""
        started = self.clock.now()
        base = self._event_base(run, attempt, started)
        running = _RunningReport(
            self, msgspec.structs.replace(base, status=ExecutionStatus.RUNNING, at=started), tg
        )
        self._graces.add(running)
        metrics = self._metrics_of(run.task_id)
        if attempt == 1:
            metrics.schedule_to_start.observe(
                max(0.0, started.timestamp() - run.scheduled_for.timestamp())
            )
        log.info(
            "run %s attempt %d/%d RUNNING",
            run.execution_id,
            attempt,
            run.max_attempts,
            extra={"job_id": run.job_id, "execution_id": run.execution_id, "attempt": attempt},
        )
        ctx = TaskContext(
            run.execution_id,
            run.job_id,
            attempt,
            run.scheduled_for,
            self._data_dir,
            self._secrets_dir,
            self._allowed_networks,
        )
        began = time.perf_counter()
        try:
            result = await self._execute(spec, params, ctx, run.timeout_seconds)
        except asyncio.CancelledError:
            running.drop()
            raise
        except Exception as e:
            metrics.duration.observe(time.perf_counter() - began)
            await running.settle()
            if isinstance(e, RunCancelled):
                await self._cancelled(d, run, attempt, started=started)
            else:
                await self._failed(d, run, base, attempt, e)
            return
        metrics.duration.observe(time.perf_counter() - began)
        now = self.clock.now()
        await running.settle()
        await self._report(
            msgspec.structs.replace(
                base,
                status=ExecutionStatus.SUCCEEDED,
                at=now,
                finished_at=now,
                result=result,
            )
        )
        await self._settle(d, run.execution_id, ack=True)
        metrics.succeeded.inc()
        log.info(
            "run %s SUCCEEDED",
            run.execution_id,
            extra={"job_id": run.job_id, "execution_id": run.execution_id, "attempt": attempt},
        )

    async def _execute(
        self, spec: TaskSpec, params: msgspec.Struct, ctx: TaskContext, timeout_seconds: float
    ) -> Any:
        """Run the task in a child task that a cancellation marker can cancel.

        Raises:
            RunCancelled: a marker cancelled the run (job cancelled or deleted, run replaced).
            TimeoutError: the task ran past ``timeout_seconds`` seconds.
        """
        call = asyncio.ensure_future(self._call(spec, params, ctx, timeout_seconds))
        self._executing[ctx.idempotency_key] = (ctx.job_id, call)
        try:
            return await call
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if ctx.idempotency_key in self._cancel_requested and not (me and me.cancelling()):
                raise RunCancelled(ctx.idempotency_key) from None
            call.cancel()
            raise
        finally:
            self._executing.pop(ctx.idempotency_key, None)
            self._cancel_requested.discard(ctx.idempotency_key)

    async def _call(
        self, spec: TaskSpec, params: msgspec.Struct, ctx: TaskContext, timeout_seconds: float
    ) -> Any:
        if spec.kind == "cpu":
            async with self._cpu_slots:
                return await self._cpu.run(spec, params, ctx, timeout_seconds)
        try:
            async with asyncio.timeout(timeout_seconds):
                return await spec.fn(params, ctx)
        except TimeoutError as e:
            raise TimeoutError(f"task ran past its timeout of {timeout_seconds:g} s") from e

    def _on_marker(self, job_id: str | None, key: str | None) -> None:
        """A cancellation marker appeared: cancel the matching runs executing here."""
        for execution_id, (run_job, call) in list(self._executing.items()):
            if run_job == job_id or (key is not None and run_key(execution_id) == key):
                self._cancel_requested.add(execution_id)
                call.cancel()
                log.info("run %s: cancellation requested", execution_id)

    async def _cancelled(
        self, d: Delivery, run: RunMessage, attempt: int, *, started: datetime | None
    ) -> None:
        now = self.clock.now()
        base = self._event_base(run, attempt, started)
        reason = (
            "cancelled: its job was cancelled or deleted, or the run itself was cancelled "
            "(a bulk cancel, or a newer run under overlapPolicy replace)"
        )
        await self._report(
            msgspec.structs.replace(
                base, status=ExecutionStatus.CANCELLED, at=now, finished_at=now, error=reason
            )
        )
        await self._settle(d, run.execution_id, ack=False)
        self._metrics_of(run.task_id).cancelled.inc()
        log.info("run %s CANCELLED", run.execution_id, extra={"execution_id": run.execution_id})

    async def _failed(
        self, d: Delivery, run: RunMessage, base: StatusEvent, attempt: int, e: Exception
    ) -> None:
        now = self.clock.now()
        extra = {"job_id": run.job_id, "execution_id": run.execution_id, "attempt": attempt}
        error = _describe(e)
        retryable = not isinstance(e, TaskError) or e.retryable
        if retryable and attempt < run.max_attempts:
            delay = retry_delay(
                attempt,
                base_seconds=self.config.retry_backoff_seconds,
                max_seconds=self.config.retry_backoff_max_seconds,
            )
            if isinstance(e, TaskError) and e.retry_after_seconds is not None:
                delay = max(delay, min(e.retry_after_seconds, RETRY_AFTER_MAX_SECONDS))
            await self._report(
                msgspec.structs.replace(
                    base,
                    status=ExecutionStatus.RETRYING,
                    at=now,
                    error=error,
                    next_attempt_at=now + timedelta(seconds=delay),
                )
            )
            self._metrics_of(run.task_id).retries.inc()
            await d.nak(delay)
            log.info(
                "run %s attempt %d failed (%s); retry in %.2f s",
                run.execution_id,
                attempt,
                error,
                delay,
                extra=extra,
            )
            return
        await self._report(
            msgspec.structs.replace(
                base, status=ExecutionStatus.FAILED, at=now, finished_at=now, error=error
            )
        )
        await self._settle(d, run.execution_id, ack=False)
        self._metrics_of(run.task_id).failed.inc()
        log.info(
            "run %s FAILED after %d attempt(s): %s", run.execution_id, attempt, error, extra=extra
        )

    async def _give_up(self, d: Delivery, run: RunMessage, attempt: int, error: str) -> None:
        now = self.clock.now()
        base = self._event_base(run, attempt, None)
        await self._report(
            msgspec.structs.replace(
                base, status=ExecutionStatus.FAILED, at=now, finished_at=now, error=error
            )
        )
        await self._settle(d, run.execution_id, ack=False)
        self._metrics_of(run.task_id).failed.inc()
        log.warning(
            "run %s FAILED: %s", run.execution_id, error, extra={"execution_id": run.execution_id}
        )

    async def _poison(self, d: Delivery, error: str) -> None:
        """A message that is not a run: record what can be recorded, then terminate it."""
        exec_id = execution_id_of_msg_id(d.msg_id) if d.msg_id else None
        log.error("terminating poison message %s: %s", exec_id or "(no Nats-Msg-Id)", error)
        event = None
        if exec_id:
            event = poison_event(
                exec_id,
                attempt=d.num_delivered,
                at=self.clock.now(),
                worker_id=self.config.resolved_worker_id,
                error=error,
            )
        if event is not None:
            await self._report(event)
        await d.term()
        self._unknown_task.failed.inc()

    def _metrics_of(self, task_id: str) -> TaskMetrics:
        return self._task_metrics.get(task_id, self._unknown_task)

    def _event_base(self, run: RunMessage, attempt: int, started: datetime | None) -> StatusEvent:
        return run_event(
            run,
            ExecutionStatus.RUNNING,
            attempt=attempt,
            at=started or self.clock.now(),
            published_at=run.published_at,
            started_at=started,
            worker_id=self.config.resolved_worker_id,
        )

    async def _report(self, event: StatusEvent) -> None:
        """Publish ``event`` until JetStream acknowledges it (retrying through NATS outages).

        Its result and error are first brought within the stored range
        (:func:`core.values.storable_event`: bounded, stringified where a store could not hold
        them), so what live clients see is what the store records, and no report is unencodable.
        """
        event = storable_event(event)
        backoff = Backoff(REPORT_RETRY, self.timer, log=log)
        while True:
            raise_if_cancelling()
            try:
                await self._reports.publish(event)
                return
            except BusUnavailable as e:
                await backoff.wait(f"cannot report {event.execution_id} {event.status} yet", e)

    async def _settle(self, d: Delivery, execution_id: str, *, ack: bool) -> None:
        self._finished[execution_id] = ack
        while len(self._finished) > 10_000:
            self._finished.popitem(last=False)
        try:
            await (d.ack() if ack else d.term())
        except BusUnavailable as e:
            log.warning(
                "cannot settle %s (%s); the redelivery will be settled without running",
                execution_id,
                e,
            )

    async def _keep_alive(self, d: Delivery) -> None:
        period = self.config.ack_wait_seconds / 3
        while True:
            raise_if_cancelling()
            await asyncio.sleep(period)
            try:
                await d.in_progress()
            except BusUnavailable as e:
                log.warning("in-progress ack failed: %s", e)


class _RunningReport:
    """The RUNNING report of one attempt, published while the task runs: at once, or once the
    worker's ``running_grace_seconds`` (:class:`core.settings.WorkerConfig`) passed
    (:class:`_GraceTimer`) unless the attempt ended first."""

    __slots__ = ("_event", "_task", "_tg", "_worker", "deadline", "pending")

    def __init__(self, worker: Worker, event: StatusEvent, tg: asyncio.TaskGroup) -> None:
        self._worker = worker
        self._event = event
        self._tg = tg
        self._task: asyncio.Task[None] | None = None
        grace_seconds = worker.config.running_grace_seconds
        self.deadline = worker.timer.now() + timedelta(seconds=grace_seconds)
        self.pending = grace_seconds > 0
        """Within its grace: not published (yet)."""
        if not self.pending:
            self.publish()

    def publish(self) -> None:
        """Start publishing it (its grace passed). Not when the run's task group is shutting
        down (one of the run's own tasks failed, so its attempt is being cancelled): the report
        is dropped there, and the worker's other runs go on."""
        self.pending = False
        report = self._worker._report(self._event)
        try:
            self._task = self._tg.create_task(
                report, name=f"{self._worker.name} report RUNNING {self._event.execution_id}"
            )
        except RuntimeError:  # TaskGroup.create_task: "... is shutting down"
            report.close()
            log.debug("run %s ending: its RUNNING report is dropped", self._event.execution_id)

    def drop(self) -> None:
        """Never publish it (the attempt ended within its grace, or was cancelled)."""
        self.pending = False

    async def settle(self) -> None:
        """The attempt ended: wait until RUNNING is stored, or drop it if its grace has not
        passed (it was never sent), so that the outcome is reported after it or alone."""
        self.drop()
        if self._task is not None:
            await self._task


class _GraceTimer:
    """One sleeper for the RUNNING reports of every attempt of a worker still within its grace
    (instead of a task each): wakes at the earliest deadline and publishes the reports due.
    Deadlines are added in order (now + one grace), so a queue keeps them sorted."""

    def __init__(self, timer: Clock) -> None:
        self.timer = timer
        self._due: collections.deque[_RunningReport] = collections.deque()
        self._added = asyncio.Event()

    def add(self, report: _RunningReport) -> None:
        if report.pending:
            self._due.append(report)
            if len(self._due) == 1:
                self._added.set()

    async def run(self) -> None:
        """Publish reports as their grace passes, until cancelled."""
        due = self._due
        while True:
            while due and not due[0].pending:
                due.popleft()
            self._added.clear()
            if not due:
                await self._added.wait()
                continue
            first = due[0]
            if self.timer.now() < first.deadline:
                await self.timer.sleep_until(first.deadline, asyncio.Event())
                continue
            due.popleft()
            first.publish()


def _describe(e: BaseException) -> str:
    if isinstance(e, TaskError):  # the task's own words
        return str(e) or type(e).__name__
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


async def _shielded(coro: Any, timeout_seconds: float) -> None:
    with contextlib.suppress(BusUnavailable, TimeoutError):
        async with asyncio.timeout(timeout_seconds):
            await asyncio.shield(coro)
