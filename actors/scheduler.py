"""Scheduler actor: turns due jobs of its partitions into published runs.

It keeps a heap of the next-run times of the jobs of its partitions that are due within the
lookahead window (the store holds the rest), and sleeps until the earliest is due, a gateway's
notice wakes it, or the periodic safety scan is due. A due job is dispatched in three steps:

1. ``store.dispatch``: compare-and-set of the job's ``nextRunAt`` (the next occurrence computed
   from the *scheduled* time, never from now) and, only if it advanced, insert the execution
   record (QUEUED) with its deterministic id — in one transaction on SQLite;
2. publish the run to its queue's work stream with ``Nats-Msg-Id`` = execution id;
3. push the job's next occurrence into the heap.

A crash between 1 and 2 leaves a QUEUED record without a message. The scheduler that takes the
partition over publishes such runs at once (:meth:`Scheduler._take_over`), and a clean stop
publishes its prepared runs before it hands its partitions back. Behind both, the re-dispatch
sweep publishes every unfinished run whose last transition is older than the re-dispatch timeout
and whose message is no longer in the work stream (lost, purged, or acked while its final status
event was lost), with the same execution id. The store, not NATS, is the source of truth.

Runs-per-minute quota: before step 1, the runs a batch would record are taken from their owners'
token buckets in the store (shared with the other schedulers and the gateways' manual
triggers). A job whose runs the quota does not allow now is *held back*: nothing is recorded,
its ``nextRunAt`` stays where it is, and it is planned again when its owner's bucket will have
refilled enough. A job held past its misfire grace then follows its misfire policy like a job
that was due while no scheduler ran, and its misfire record names the quota. No occurrence is
dropped without a record; other users' runs are never delayed by one user's.

The decisions and the state between steps live in :class:`core.scheduling.Scheduling`, a state
machine without I/O; this actor is its shell: it performs the store and bus calls, feeds their
results to it, and sleeps until the time it names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection
from datetime import datetime

import msgspec

from actors.metrics import Metrics
from actors.ownership import Ownership, StaticOwnership
from core.clock import Clock, SystemClock
from core.errors import BusUnavailable, StoreRejected, StoreUnavailable
from core.model import (
    Event,
    Execution,
    ExecutionStatus,
    Job,
    JobNotice,
    RunMessage,
    RunsFinished,
    StatusEvent,
)
from core.ports import CancelSignals, Dispatch, DispatchOutcome, JobStore, SchedulerBus
from core.retry import Backoff, RetryPolicy, raise_if_cancelling
from core.scheduling import Decided, Scheduling, previous_lookups, stream_checks
from core.settings import SchedulerConfig

log = logging.getLogger(__name__)


class Scheduler:
    """Dispatches due runs of the partitions it owns (see module docstring).

    Its state is :attr:`state` (:class:`core.scheduling.Scheduling`); it keeps only its
    dependencies, the events its loops sleep on, and a counter of the runs it published.

    Args:
        store: the job store (source of truth).
        bus: the work queue, notices and the recorders' progress (NATS: :class:`bus.nats.Bus`).
        clock: wall clock (a fake one in tests); the publisher's waits, retries included.
        timer: what the main loop's retry pauses are measured on; default: real time,
            whatever ``clock`` is (unit tests pass their fake clock).
        config: see :class:`SchedulerConfig`.
        markers: cancellation markers (``overlapPolicy: replace`` cancels the previous run).
        ownership: which partitions it may dispatch; default: all of them, alone.
        scheduler_id: unique id of this scheduler, recorded on the runs it dispatches.
        metrics: where it observes scheduling delays, skips, its heap and partitions; default:
            a registry of its own.
        on_finished_records: called with the ids of jobs it wrote a finished (SKIPPED) record
            for, so their history can be pruned (the pruner's ``mark``).
    """

    def __init__(
        self,
        store: JobStore,
        bus: SchedulerBus,
        clock: Clock,
        config: SchedulerConfig,
        *,
        markers: CancelSignals,
        ownership: Ownership | None = None,
        scheduler_id: str = "scheduler",
        metrics: Metrics | None = None,
        on_finished_records: Callable[[list[str]], None] | None = None,
        timer: Clock | None = None,
    ) -> None:
        self.timer = timer or SystemClock()
        self.store = store
        self._on_finished_records = on_finished_records
        self.bus = bus
        self.clock = clock
        self.config = config
        self.scheduler_id = scheduler_id
        self.name = f"scheduler[{scheduler_id}]"
        self.ownership = ownership or StaticOwnership(frozenset(range(config.partitions)))
        self.ready = asyncio.Event()
        self.state = Scheduling(clock.now(), config, scheduler_id=scheduler_id, name=self.name)
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._prepared_changed = asyncio.Event()
        self.cancel_markers = markers
        self.dispatched = 0
        self.metrics = metrics or Metrics()

    @property
    def owned(self) -> frozenset[int]:
        return self.ownership.owned

    def stop(self) -> None:
        """Stop after the current step and release the partitions (idempotent)."""
        self._stopping.set()
        self._wake.set()

    def wake(self) -> None:
        """Re-evaluate the heap now (a new near-term job, a test's clock move)."""
        self._wake.set()

    async def run(self) -> None:
        """Schedule until :meth:`stop`. Store and NATS outages are retried, never fatal.

        On a clean stop the runs already recorded are published at their due times (at most
        ``prepare_ahead_seconds + drain_seconds``) before the partitions are handed back, so a
        rolling restart delays no run.
        """
        sub = await self.bus.subscribe_notices(self._on_notice)
        finished = await self.bus.subscribe_finished(self._on_finished)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(
                    self.ownership.run(self._gained, self._lost), name=f"{self.name} ownership"
                )
                publisher = tg.create_task(self._publisher(), name=f"{self.name} publisher")
                self.ready.set()
                try:
                    await self._loop()
                    await self._drain(publisher)
                finally:
                    self.ownership.stop()
                    publisher.cancel()
        finally:
            await sub.close()
            await finished.close()

    async def _drain(self, publisher: asyncio.Task[None]) -> None:
        """Let the publisher send what is prepared, then return (bounded; see :meth:`run`)."""
        self._prepared_changed.set()
        limit = self.config.prepare_ahead_seconds + self.config.drain_seconds
        try:
            async with asyncio.timeout(limit):
                await asyncio.shield(publisher)
        except TimeoutError:
            left = len(self.state.prepared) + len(self.state.unpublished)
            log.warning(
                "%s: %d prepared run(s) not published within %.1f s of stopping; the next "
                "owner of their partitions publishes them",
                self.name,
                left,
                limit,
            )

    async def _loop(self) -> None:
        heap_size, owned_partitions = self.metrics.heap_size, self.metrics.owned_partitions
        backoff = Backoff(RETRY, self.timer, stop=self._stopping, log=log)
        while not self._stopping.is_set():
            raise_if_cancelling()
            try:
                await self._step()
                backoff.reset()
            except (StoreUnavailable, BusUnavailable) as e:
                await backoff.wait(self.name, e)
                continue
            except StoreRejected as e:  # a read or a sweep write: a bug, never a crash loop
                await backoff.wait(self.name, e, level=logging.ERROR)
                continue
            finally:
                heap_size.set(len(self.state.heap))
                owned_partitions.set(len(self.owned))
            await self.clock.sleep_until(self.state.next_deadline(), self._wake)
            self._wake.clear()

    async def _publisher(self) -> None:
        """Publish prepared runs at their due time, apart from the store work of the main loop.

        Preparing a run (store reads and writes) happens up to ``prepare_ahead_seconds`` early in
        :meth:`_loop`; this task only waits for the earliest prepared run and publishes, so a
        slow store write never delays a run that is already due.
        """
        # not cut short by stop(): a stopping scheduler still publishes what it prepared
        state = self.state
        backoff = Backoff(RETRY, self.clock, log=log)
        while not self._stopping.is_set() or state.pending:
            raise_if_cancelling()
            try:
                if state.unpublished:
                    await self._publish(list(state.unpublished.values()))
                await self._publish(state.due_runs(self.clock.now()))
                backoff.reset()
            except BusUnavailable as e:
                await backoff.wait(self.name, e)
                continue
            if self._stopping.is_set() and not state.pending:
                return
            if state.unpublished:  # a publish failed: retry after the delay, not at once
                self._prepared_changed.clear()
            deadline = state.publish_deadline(self.clock.now(), RETRY.delay_seconds(1))
            await self.clock.sleep_until(deadline, self._prepared_changed)
            self._prepared_changed.clear()

    def _gained(self, partitions: frozenset[int]) -> None:
        """New partitions: take over their recorded runs and load their due jobs at once."""
        self.state.gained(partitions, self.clock.now())
        self._wake.set()

    def _lost(self, partitions: frozenset[int]) -> None:
        """Partitions taken away: stop dispatching them and forget their heap entries."""
        dropped = self.state.lost(partitions)
        log.info("%s dropped %d partition(s), %d heap entries", self.name, len(partitions), dropped)

    async def _step(self) -> None:
        if self.state.taken:
            await self._take_over(self.state.taken)
        now = self.clock.now()
        if self.state.scan_due(now):  # a scan that fails is tried again with the step
            await self._scan()
            self.state.scanned(now)
        while not self._stopping.is_set():
            due = self.state.due(self.clock.now())
            if not due:
                break
            await self._dispatch(due)

    # --- loading -------------------------------------------------------------------------------

    async def _scan(self) -> None:
        """Safety scan: reload the near-term window from the store, re-dispatch lost runs.

        Jobs waiting (``bufferOne``) for a previous run are due, so they are re-checked too:
        a finish notice may have been lost.
        """
        owned = self.owned
        if not owned:
            return
        until = self.state.scan_until(self.clock.now())
        jobs = await self.store.due_jobs(owned, until, limit=self.config.heap_limit)
        self.state.loaded(jobs, until)
        await self._redispatch_lost(owned)

    async def _take_over(self, partitions: frozenset[int]) -> None:
        """Publish the runs that a partition's previous owner recorded and may not have sent.

        A scheduler records a run (QUEUED) up to ``prepare_ahead_seconds`` before its due time and
        publishes it then; one that died in between left the record without a message. Every
        QUEUED run of ``partitions`` recorded within half the duplicate window is published
        again at its due time under its execution id: if the first publish did happen,
        JetStream drops the copy. Older ones are left to the re-dispatch sweep, which checks
        the work stream first.
        """
        now = self.clock.now()
        since, until = self.state.takeover_window(now)
        recorded = await self.store.stale_executions(
            partitions, until, limit=self.config.heap_limit, updated_after=since
        )
        queued = {e.job_id for e in recorded if e.status == ExecutionStatus.QUEUED}
        jobs = {j.id: j for j in await self.store.get_jobs(queued)} if queued else {}
        taken = self.state.taken_over(partitions, recorded, jobs, now)
        if taken:
            self._prepared_changed.set()
            log.info(
                "%s: publishing %d recorded run(s) of %d taken-over partition(s)",
                self.name,
                taken,
                len(partitions),
            )

    async def _on_notice(self, notice: JobNotice) -> None:
        if self.state.notice(notice, self.owned):
            self._wake.set()

    async def _on_finished(self, finished: RunsFinished) -> None:
        """Runs ended: dispatch the buffered occurrences of jobs that waited for them."""
        woken = self.state.finished(finished.job_ids, self.clock.now())
        log.debug("finished runs of %s; waking %s", finished.job_ids, woken)
        if woken:
            self._wake.set()

    # --- dispatching ---------------------------------------------------------------------------

    async def _dispatch(self, job_ids: Collection[str]) -> None:
        """Record the runs of the given due (or soon due) jobs; hold them until their time."""
        now = self.clock.now()
        owned = self.owned
        jobs = self.state.to_dispatch(job_ids, await self.store.get_jobs(job_ids), owned)
        chain = await self._plan(jobs, now)
        if not chain:
            return
        recorded = self.state.recorded(await self._record(chain), now)
        for run in recorded.skipped:
            self._skipped(run)
        self._recorded_finished(recorded.events)
        try:
            if recorded.events:  # before the runs: QUEUED precedes RUNNING
                await self.bus.publish_events(recorded.events)
        finally:  # recorded runs are published even when their QUEUED events are not
            self.state.prepare(recorded.ready)
            if recorded.ready:
                self._prepared_changed.set()

    def _recorded_finished(self, events: list[Event]) -> None:
        """Tell the pruner about the jobs that got a finished (SKIPPED) record now."""
        jobs = [
            e.job_id
            for e in events
            if isinstance(e, StatusEvent) and e.status == ExecutionStatus.SKIPPED
        ]
        if jobs and self._on_finished_records is not None:
            self._on_finished_records(jobs)

    async def _record(
        self, chain: list[tuple[Dispatch, Job, datetime]]
    ) -> list[tuple[tuple[Dispatch, Job, datetime], DispatchOutcome]]:
        """Dispatch ``chain`` in one store call; each entry with its outcome.

        A chain the store refuses for good (:class:`StoreRejected`) is halved until the refused
        dispatch stands alone: its job is held back (logged once; the next scan tries it again)
        and every other job's run goes out. The store's compare-and-set keeps a job's chain
        consistent whichever half its entries land in.
        """
        try:
            outcomes = await self.store.dispatch([d for d, _, _ in chain])
        except StoreRejected as e:
            if len(chain) == 1:
                self._held_back(chain[0][1], e)
                return []
            mid = len(chain) // 2
            return await self._record(chain[:mid]) + await self._record(chain[mid:])
        self.state.accepted(job.id for _, job, _ in chain)
        return list(zip(chain, outcomes, strict=True))

    def _held_back(self, job: Job, error: StoreRejected) -> None:
        if not self.state.refused(job):
            log.debug("%s: job %s still cannot be dispatched: %s", self.name, job.id, error)
            return
        log.error(
            "%s: the store refuses to record a run of job %s for good (%s); holding the job "
            "back, the other jobs are dispatched",
            self.name,
            job.id,
            error,
            extra={"job_id": job.id, "partition": job.partition},
        )

    async def _plan(self, jobs: list[Job], now: datetime) -> list[tuple[Dispatch, Job, datetime]]:
        """The chain to record for ``jobs``: each entry with its job and publish time.

        The previous runs the overlap policies need are read from the store; those still
        active there whose job is decided now are looked up in the work stream (see
        :func:`core.scheduling.stream_checks`). The state machine decides; the runs quota is
        taken from the store; the previous runs that ``replace`` replaces are cancelled.
        """
        previous, ended = await self._previous_runs(jobs, now)
        decided = self.state.decide(jobs, previous, now, ended=ended)
        chain: list[tuple[Dispatch, Job, datetime]] = []
        for d in await self._within_quota(decided, now):
            chain.extend((x, d.job, d.when) for x in await self._follow(d))
        return chain

    async def _within_quota(self, decided: list[Decided], now: datetime) -> list[Decided]:
        """The decisions whose runs their owners' runs-per-minute quota allows now; the others
        are held back (see module docstring) and planned again at the time the quota names."""
        requests = self.state.quota_requests(decided)
        if not requests:
            return decided
        waits = await self.store.take_tokens(requests, now=now)
        granted, held = self.state.within_quota(decided, waits, now)
        self.metrics.held_runs.inc(held)
        return granted

    async def _follow(self, d: Decided) -> list[Dispatch]:
        """Act on ``d``'s plan: cancel the run it replaces, log its misfire; the chain."""
        job, plan = d.job, d.plan
        dispatches = self.state.accept(d)
        if plan.cancel is not None:
            await self.cancel_markers.cancel_run(plan.cancel)
            log.info("job %s: replacing run %s", job.id, plan.cancel, extra={"job_id": job.id})
        if plan.misfire is not None:
            log.warning(
                "job %s misfired: %d occurrence(s) from %s to %s missed (%s)",
                job.id,
                plan.misfire.missed,
                plan.misfire.first_missed,
                plan.misfire.last_missed,
                plan.misfire.policy,
                extra={"job_id": job.id, "partition": job.partition},
            )
        return dispatches

    def _skipped(self, run: Execution) -> None:
        assert run.skip_reason is not None
        if run.missed is None:
            log.info("run %s SKIPPED: %s", run.id, run.skip_reason)
            self.metrics.skipped(run.skip_reason)
        else:
            self.metrics.skipped(run.skip_reason, run.missed.count)

    async def _previous_runs(
        self, jobs: list[Job], now: datetime
    ) -> tuple[dict[str, Execution], set[str]]:
        """The latest dispatched run of each job whose overlap policy needs it (by job id),
        and those of them that have ended though the store does not show it yet: still active
        in the store, their job decided now, and their message gone from the work stream."""
        lookups = previous_lookups(jobs)
        if not lookups:
            return {}, set()
        runs = await self.store.get_executions(lookups)
        checks = stream_checks(runs, lookups, now)
        in_stream = await self.bus.runs_in_stream((run.queue, run.id) for run in checks)
        ended = {run.id for run in checks if run.id not in in_stream}
        return {lookups[run.id].id: run for run in runs}, ended

    async def _publish(self, messages: list[RunMessage]) -> None:
        if not messages:
            return
        now = self.clock.now()
        messages = [msgspec.structs.replace(m, published_at=now) for m in messages]
        results = await self.bus.publish_runs(messages)
        acked_at = self.clock.now().timestamp()
        delay = self.metrics.schedule_to_publish
        done = self.state.published(messages, results)
        redispatched = 0
        logged = log.isEnabledFor(logging.INFO)  # not a dict per run for a line nobody keeps
        for msg in done:
            if msg.redispatched_at_ms:
                redispatched += 1
            else:
                delay.observe(max(0.0, acked_at - msg.scheduled_for.timestamp()))
            if logged:
                log.info(
                    "run %s published to %s",
                    msg.execution_id,
                    msg.queue,
                    extra={"execution_id": msg.execution_id, "partition": msg.partition},
                )
        failed = len(messages) - len(done)
        self.metrics.dispatched_runs.inc(len(done) - redispatched)
        self.dispatched += len(done) - redispatched
        self.metrics.redispatched_runs.inc(redispatched)
        if failed:
            log.warning("%s: %d run(s) not published yet; retrying", self.name, failed)
            self._prepared_changed.set()  # the publisher retries them within 1 s, whoever failed
            await self.bus.ensure_streams_quietly()

    async def _redispatch_lost(self, owned: frozenset[int]) -> None:
        """Re-publish unfinished runs whose message is gone from the work stream.

        A candidate (unfinished, untouched for the re-dispatch timeout, message absent) is
        re-published only when it is seen again at a later sweep and the recorder has recorded
        every status event that existed at the first sighting (see
        :meth:`core.scheduling.Scheduling.sighted`, which gets the recorders' progress).
        """
        cutoff = self.state.stale_before(self.clock.now())
        stale = await self.store.stale_executions(owned, cutoff, limit=self.config.batch)
        in_stream = await self.bus.runs_in_stream((e.queue, e.id) for e in stale)
        absent = [e for e in stale if e.id not in in_stream]
        last_seq = ack_floor = 0
        if absent:
            last_seq = await self.bus.status_last_seq()
            ack_floor = await self.bus.recorder_ack_floor()
        lost = self.state.sighted(absent, last_seq, ack_floor)
        if not lost:
            return
        jobs = {j.id: j for j in await self.store.get_jobs({e.job_id for e in lost})}
        resend = self.state.resend(lost, jobs, self.clock.now())
        if resend.closing:
            await self.store.apply_events(resend.closing)
            for event in resend.closing:
                if event.status == ExecutionStatus.SKIPPED and event.error:
                    self.metrics.skipped(event.error)
            log.info(
                "%s: closed %d run(s) that must not run any more", self.name, len(resend.closing)
            )
        log.warning(
            "%s: re-dispatching %d run(s) whose message was lost", self.name, len(resend.messages)
        )
        await self._publish(resend.messages)


RETRY = RetryPolicy(first_seconds=1.0, max_seconds=1.0)
"""After a store or NATS outage the scheduler tries again every second."""
