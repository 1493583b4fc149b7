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
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

import msgspec

from actors.metrics import Metrics
from actors.ownership import Ownership, StaticOwnership
from core.clock import Clock, SystemClock
from core.dispatch import JobPlan, due_at, plan_job
from core.errors import BusUnavailable, StoreRejected, StoreUnavailable
from core.heap import FireHeap, TimedQueue
from core.ids import execution_id
from core.model import (
    ACTIVE_EXECUTION_STATUSES,
    Event,
    Execution,
    ExecutionStatus,
    Job,
    JobNotice,
    JobStatus,
    OverlapPolicy,
    RunMessage,
    RunsFinished,
    RunTrigger,
    StatusEvent,
)
from core.ports import CancelSignals, Dispatch, DispatchOutcome, JobStore, SchedulerBus
from core.quotas import TokenRequest, runs_key
from core.retry import Backoff, RetryPolicy, raise_if_cancelling
from core.runs import recorded_event, run_event, run_message
from core.settings import SchedulerConfig
from core.timeutil import to_epoch_ms

log = logging.getLogger(__name__)


class Scheduler:
    """Dispatches due runs of the partitions it owns (see module docstring).

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
        self.heap = FireHeap()
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._window_end = clock.now()
        self._next_scan = clock.now()
        self._taken: frozenset[int] = frozenset()
        self._unpublished: dict[str, RunMessage] = {}
        self._strikes: dict[str, int] = {}
        self._waiting: dict[str, str] = {}
        self._over_quota: dict[str, int] = {}  # job id -> partition: held by the runs quota
        self._owners_over_quota: set[str] = set()
        self.at_due = FireHeap()
        self.prepared: TimedQueue[RunMessage] = TimedQueue()
        self._prepared_changed = asyncio.Event()
        self.cancel_markers = markers
        self.dispatched = 0
        self.metrics = metrics or Metrics()
        self._rejected: set[str] = set()

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
            left = len(self.prepared) + len(self._unpublished)
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
                heap_size.set(len(self.heap))
                owned_partitions.set(len(self.owned))
            await self.clock.sleep_until(self._next_deadline(), self._wake)
            self._wake.clear()

    async def _publisher(self) -> None:
        """Publish prepared runs at their due time, apart from the store work of the main loop.

        Preparing a run (store reads and writes) happens up to ``prepare_ahead_seconds`` early in
        :meth:`_loop`; this task only waits for the earliest prepared run and publishes, so a
        slow store write never delays a run that is already due.
        """
        # not cut short by stop(): a stopping scheduler still publishes what it prepared
        backoff = Backoff(RETRY, self.clock, log=log)
        while not self._stopping.is_set() or self.prepared or self._unpublished:
            raise_if_cancelling()
            try:
                if self._unpublished:
                    await self._publish(list(self._unpublished.values()))
                await self._publish(self.prepared.pop_due(self.clock.now()))
                backoff.reset()
            except BusUnavailable as e:
                await backoff.wait(self.name, e)
                continue
            if self._stopping.is_set() and not self.prepared and not self._unpublished:
                return
            deadline = self.prepared.peek() or self.clock.now() + timedelta(hours=1)
            if self._unpublished:  # a publish failed: retry after the delay, not at once
                self._prepared_changed.clear()
                retry_at = self.clock.now() + timedelta(seconds=RETRY.delay_s(1))
                deadline = min(deadline, retry_at)
            await self.clock.sleep_until(deadline, self._prepared_changed)
            self._prepared_changed.clear()

    def _gained(self, partitions: frozenset[int]) -> None:
        """New partitions: take over their recorded runs and load their due jobs at once."""
        self._taken |= partitions
        self._next_scan = self.clock.now()
        self._wake.set()

    def _lost(self, partitions: frozenset[int]) -> None:
        """Partitions taken away: stop dispatching them and forget their heap entries."""
        dropped = self.heap.drop_partitions(partitions)
        self.at_due.drop_partitions(partitions)
        self._over_quota = {j: p for j, p in self._over_quota.items() if p not in partitions}
        log.info("%s dropped %d partition(s), %d heap entries", self.name, len(partitions), dropped)

    def _next_deadline(self) -> datetime:
        top = self.heap.peek()
        deadline = self._next_scan
        if top is not None:
            deadline = min(deadline, top - timedelta(seconds=self.config.prepare_ahead_seconds / 2))
        due = self.at_due.peek()
        return deadline if due is None else min(deadline, due)

    async def _step(self) -> None:
        if self._taken:
            await self._take_over(self._taken)
            self._taken = frozenset()
        now = self.clock.now()
        if now >= self._next_scan:  # a scan that fails is tried again with the step
            await self._scan()
            self._next_scan = now + timedelta(seconds=self.config.scan_interval_seconds)
        ahead = timedelta(seconds=self.config.prepare_ahead_seconds)
        while not self._stopping.is_set():
            now = self.clock.now()
            due = self.at_due.pop_due(now, self.config.batch) or self.heap.pop_due(
                now + ahead, self.config.batch
            )
            if not due:
                break
            await self._dispatch([job_id for job_id, _ in due])

    # --- loading -------------------------------------------------------------------------------

    async def _scan(self) -> None:
        """Safety scan: reload the near-term window from the store, re-dispatch lost runs.

        Jobs waiting (``bufferOne``) for a previous run are due, so they are re-checked too:
        a finish notice may have been lost.
        """
        owned = self.owned
        if not owned:
            return
        now = self.clock.now()
        until = now + timedelta(seconds=self.config.lookahead_seconds)
        jobs = await self.store.due_jobs(owned, until, limit=self.config.heap_limit)
        for job in jobs:
            if job.next_run_at is not None:
                self.heap.push(job.id, job.next_run_at, job.partition)
        last = jobs[-1].next_run_at if jobs else None
        truncated = len(jobs) == self.config.heap_limit and last is not None
        self._window_end = last if truncated and last is not None else until
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
        since = now - timedelta(seconds=self.config.duplicate_window_seconds / 2)
        until = now + timedelta(minutes=1)  # records of a previous owner whose clock is ahead
        recorded = await self.store.stale_executions(
            partitions, until, limit=self.config.heap_limit, updated_after=since
        )
        queued = [e for e in recorded if e.status == ExecutionStatus.QUEUED]
        if not queued:
            return
        jobs = {j.id: j for j in await self.store.get_jobs({e.job_id for e in queued})}
        taken = 0
        for run in queued:
            job = jobs.get(run.job_id)
            if job is None or not _resendable(job, run):
                continue  # the re-dispatch sweep closes it
            when = run.scheduled_for + timedelta(milliseconds=run.jitter_ms)
            self.prepared.add(when, run_message(job, run, now))
            taken += 1
        if taken:
            self._prepared_changed.set()
            log.info(
                "%s: publishing %d recorded run(s) of %d taken-over partition(s)",
                self.name,
                taken,
                len(partitions),
            )

    async def _on_notice(self, notice: JobNotice) -> None:
        if notice.next_run_at is None or notice.partition not in self.owned:
            return
        if notice.next_run_at <= self._window_end:
            self.heap.push(notice.job_id, notice.next_run_at, notice.partition)
            self._wake.set()

    # --- dispatching ---------------------------------------------------------------------------

    async def _dispatch(self, job_ids: Collection[str]) -> None:
        """Record the runs of the given due (or soon due) jobs; hold them until their time."""
        now = self.clock.now()
        owned = self.owned
        jobs = [
            j
            for j in await self.store.get_jobs(job_ids)
            if j.next_run_at is not None and j.partition in owned
        ]
        self._forget_over_quota(set(job_ids) - {j.id for j in jobs})
        chain = await self._plan(jobs, now)
        if not chain:
            return
        events: list[Event] = []
        ready: list[tuple[datetime, RunMessage]] = []
        upcoming: dict[str, tuple[datetime | None, int]] = {}
        for (d, job, when), outcome in await self._record(chain):
            if not outcome.advanced:
                continue
            if d.execution.status == ExecutionStatus.QUEUED:
                ready.append((when, run_message(job, d.execution, now)))
            elif d.execution.skip_reason:
                self._skipped(d.execution)
            if outcome.created:
                events.append(recorded_event(d.execution))
            upcoming[job.id] = (d.next_run_at, job.partition)
        for job_id, (nxt, partition) in upcoming.items():
            if nxt is not None and nxt <= self._window_end:
                self.heap.push(job_id, nxt, partition)
        self._recorded_finished(events)
        try:
            if events:
                await self.bus.publish_events(events)  # before the runs: QUEUED precedes RUNNING
        finally:  # recorded runs are published even when their QUEUED events are not
            for when, message in ready:
                self.prepared.add(when, message)
            if ready:
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
        self._rejected.difference_update(job.id for _, job, _ in chain)
        return list(zip(chain, outcomes, strict=True))

    def _held_back(self, job: Job, error: StoreRejected) -> None:
        extra = {"job_id": job.id, "partition": job.partition}
        if job.id in self._rejected:
            log.debug("%s: job %s still cannot be dispatched: %s", self.name, job.id, error)
            return
        if len(self._rejected) >= 10_000:
            self._rejected.clear()
        self._rejected.add(job.id)
        log.error(
            "%s: the store refuses to record a run of job %s for good (%s); holding the job "
            "back, the other jobs are dispatched",
            self.name,
            job.id,
            error,
            extra=extra,
        )

    async def _plan(self, jobs: list[Job], now: datetime) -> list[tuple[Dispatch, Job, datetime]]:
        """The chain to record for ``jobs``: each entry with its job and publish time.

        A job is planned as of its due time (recorded up to ``prepare_ahead_seconds`` early). A job
        whose previous run still runs is decided at its due time instead, not ahead of it.
        """
        previous = await self._previous_runs(jobs, now)
        ahead = now + timedelta(seconds=self.config.prepare_ahead_seconds)
        decided: list[_Decided] = []
        for job in sorted(jobs, key=lambda j: due_at(j) or now):  # earliest first to the quota
            when = max(now, due_at(job) or now)
            if when > ahead:  # not due yet (its entry was stale, or its jitter delays it)
                if when <= self._window_end:
                    self.heap.push(job.id, when, job.partition)
                continue
            prev = previous.get(job.id)
            if when > now and prev is not None and prev.status in ACTIVE_EXECUTION_STATUSES:
                self.at_due.push(job.id, when, job.partition)
                continue
            waited = self._waiting.pop(job.id, None)
            held = job.id in self._over_quota
            try:
                plan = plan_job(
                    job,
                    when,
                    previous=prev,
                    buffered=waited is not None,
                    scheduler_id=self.scheduler_id,
                    held_by=HELD_BY_QUOTA if held else None,
                )
            except Exception:  # a bulkhead: one job that cannot be planned must not stop the rest
                log.exception("%s: cannot plan job %s; skipping it this time", self.name, job.id)
                continue
            decided.append(_Decided(job, plan, when, waited))
        chain: list[tuple[Dispatch, Job, datetime]] = []
        for d in await self._within_quota(decided, now):
            self._over_quota.pop(d.job.id, None)
            chain.extend((x, d.job, d.when) for x in await self._follow(d.job, d.plan))
        return chain

    def _forget_over_quota(self, job_ids: Collection[str]) -> None:
        """Jobs no longer due here (deleted, paused, finished, moved) are no longer held."""
        if self._over_quota:
            for job_id in job_ids:
                self._over_quota.pop(job_id, None)

    async def _within_quota(self, decided: list[_Decided], now: datetime) -> list[_Decided]:
        """The decisions whose runs their owners' runs-per-minute quota allows now; the others
        are held back (see module docstring) and planned again at the time the quota names."""
        rate = self.config.quotas.runs
        asking = [d for d in decided if d.plan.queued]
        if rate is None or not asking:
            return decided
        waits = await self.store.take_tokens(
            [TokenRequest(runs_key(d.job.owner), len(d.plan.queued), rate) for d in asking],
            now=now,
        )
        denied = {id(d): w for d, w in zip(asking, waits, strict=True) if w}
        granted_owners = {d.job.owner for d in asking if id(d) not in denied}
        for owner in granted_owners & self._owners_over_quota:
            self._owners_over_quota.discard(owner)
            log.info("%s: user %r is within the runs-per-minute quota again", self.name, owner)
        for d in decided:
            wait = denied.get(id(d))
            if wait is not None:  # whole milliseconds, at least one: a hold never spins
                self._hold_for_quota(
                    d, now + timedelta(milliseconds=max(1, math.ceil(wait * 1000)))
                )
        return [d for d in decided if id(d) not in denied]

    def _hold_for_quota(self, d: _Decided, until: datetime) -> None:
        """Hold ``d``'s job back until ``until``: planned again then (not earlier — a held job
        must not spin on its bucket), its ``bufferOne`` wait kept."""
        job = d.job
        if d.waited is not None:
            self._waiting[job.id] = d.waited
        self._over_quota[job.id] = job.partition
        self.at_due.push(job.id, until, job.partition)
        self.metrics.held_runs.inc(len(d.plan.queued))
        if job.owner not in self._owners_over_quota and len(self._owners_over_quota) < 10_000:
            self._owners_over_quota.add(job.owner)
            log.info(
                "%s: user %r is over the runs-per-minute quota (%d); holding runs back",
                self.name,
                job.owner,
                self.config.quotas.runs_per_minute,
                extra={"job_id": job.id, "partition": job.partition},
            )
        log.debug("job %s held back by the runs quota until %s", job.id, until)

    def _skipped(self, run: Execution) -> None:
        assert run.skip_reason is not None
        if run.missed is None:
            log.info("run %s SKIPPED: %s", run.id, run.skip_reason)
            self.metrics.skipped(run.skip_reason)
        else:
            self.metrics.skipped(run.skip_reason, run.missed.count)

    async def _follow(self, job: Job, plan: JobPlan) -> list[Dispatch]:
        """Act on the parts of ``plan`` that are not the chain; the chain to record."""
        if plan.not_before is not None:
            if plan.not_before <= self._window_end:
                self.heap.push(job.id, plan.not_before, job.partition)
            return []
        if plan.wait_for is not None:
            log.debug("job %s waits for run %s", job.id, plan.wait_for)
            self._waiting[job.id] = plan.wait_for
            return []
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
        return plan.dispatches

    async def _previous_runs(self, jobs: list[Job], now: datetime) -> dict[str, Execution]:
        """The latest dispatched run of each recurring job whose overlap policy needs it.

        A run the store still shows active is looked up in the work stream only when its job is
        decided now (due at ``now`` or earlier): a job due later waits for its due time and is
        re-planned then, so checking it early would cost a NATS round trip per job for nothing
        — and when the workers fall behind, that is every job.
        """
        wanted = {
            execution_id(j.id, j.last_dispatched_for): j
            for j in jobs
            if j.recurring
            and j.overlap_policy != OverlapPolicy.ALLOW
            and j.last_dispatched_for is not None
        }
        if not wanted:
            return {}
        runs: dict[str, Execution] = {}
        active: list[Execution] = []  # still active in the store, and its job is decided now
        for run in await self.store.get_executions(wanted):
            job = wanted[run.id]
            runs[job.id] = run
            if run.status in ACTIVE_EXECUTION_STATUSES and (due_at(job) or now) <= now:
                active.append(run)
        in_stream = await self.bus.runs_in_stream((run.queue, run.id) for run in active)
        for run in active:
            if run.id not in in_stream:
                # Its message is gone: it ended and the recorder has not written that yet (or
                # it was lost, which the re-dispatch sweep handles): it no longer overlaps.
                del runs[run.job_id]
        return runs

    async def _on_finished(self, finished: RunsFinished) -> None:
        """Runs ended: dispatch the buffered occurrences of jobs that waited for them."""
        woken = [job_id for job_id in finished.job_ids if job_id in self._waiting]
        log.debug("finished runs of %s; waking %s", finished.job_ids, woken)
        if not woken:
            return
        now = self.clock.now()
        for job_id in woken:
            self.heap.push(job_id, now)
        self._wake.set()

    async def _publish(self, messages: list[RunMessage]) -> None:
        if not messages:
            return
        now = self.clock.now()
        messages = [msgspec.structs.replace(m, published_at=now) for m in messages]
        results = await self.bus.publish_runs(messages)
        acked_at = self.clock.now().timestamp()
        delay = self.metrics.schedule_to_publish
        failed = redispatched = 0
        for msg, err in zip(messages, results, strict=True):
            if err is None:
                self._unpublished.pop(msg.execution_id, None)
                if msg.redispatched_at_ms:
                    redispatched += 1
                else:
                    delay.observe(max(0.0, acked_at - msg.scheduled_for.timestamp()))
                log.info(
                    "run %s published to %s",
                    msg.execution_id,
                    msg.queue,
                    extra={"execution_id": msg.execution_id, "partition": msg.partition},
                )
            else:
                failed += 1
                if len(self._unpublished) < 100_000:
                    self._unpublished[msg.execution_id] = msg
        self.metrics.dispatched_runs.inc(len(messages) - failed - redispatched)
        self.dispatched += len(messages) - failed - redispatched
        self.metrics.redispatched_runs.inc(redispatched)
        if failed:
            log.warning("%s: %d run(s) not published yet; retrying", self.name, failed)
            self._prepared_changed.set()  # the publisher retries them within 1 s, whoever failed
            await self.bus.ensure_streams_quietly()

    async def _redispatch_lost(self, owned: frozenset[int]) -> None:
        """Re-publish unfinished runs whose message is gone from the work stream.

        A candidate (unfinished, untouched for the re-dispatch timeout, message absent) is
        re-published only when it is seen again at a later sweep and the recorder has recorded
        every status event that existed at the first sighting: then no event can still be on its
        way to the store (without a message no worker can be running it), so the run was lost.
        """
        cutoff = self.clock.now() - timedelta(seconds=self.config.resolved_redispatch_after_seconds)
        stale = await self.store.stale_executions(owned, cutoff, limit=self.config.batch)
        in_stream = await self.bus.runs_in_stream((e.queue, e.id) for e in stale)
        absent = [e for e in stale if e.id not in in_stream]
        if not absent:
            self._strikes.clear()
            return
        mark = await self.bus.status_last_seq()
        floor = await self.bus.recorder_ack_floor()
        lost = [e for e in absent if e.id in self._strikes and floor >= self._strikes[e.id]]
        lost_ids = {e.id for e in lost}
        self._strikes = {
            e.id: self._strikes.get(e.id, mark) for e in absent if e.id not in lost_ids
        }
        if not lost:
            return
        jobs = {j.id: j for j in await self.store.get_jobs({e.job_id for e in lost})}
        at = self.clock.now()
        live = [e for e in lost if e.job_id in jobs and _resendable(jobs[e.job_id], e)]
        dead = [e for e in lost if e not in live]
        if dead:
            closing = [_closing_event(e, jobs.get(e.job_id), at) for e in dead]
            await self.store.apply_events(closing)
            for event in closing:
                if event.status == ExecutionStatus.SKIPPED and event.error:
                    self.metrics.skipped(event.error)
            log.info("%s: closed %d run(s) that must not run any more", self.name, len(dead))
        messages = [
            run_message(
                jobs[e.job_id], e, at, attempt_offset=e.attempt, redispatched_at_ms=to_epoch_ms(at)
            )
            for e in live
            if e.id not in self._unpublished
        ]
        log.warning("%s: re-dispatching %d run(s) whose message was lost", self.name, len(messages))
        await self._publish(messages)


RETRY = RetryPolicy(first_s=1.0, max_s=1.0)
"""After a store or NATS outage the scheduler tries again every second."""

HELD_BY_QUOTA = "held back by the owner's runs-per-minute quota"
"""Named in the misfire record of a job that the runs quota held past its misfire grace."""


@dataclass(frozen=True, slots=True)
class _Decided:
    """A due job's plan, before its owner's runs quota allows it: ``waited`` is the bufferOne
    run it was waiting for (restored if the job is held back)."""

    job: Job
    plan: JobPlan
    when: datetime
    waited: str | None


def _resendable(job: Job, run: Execution) -> bool:
    """Whether a lost run may be re-published: its job is not cancelled, and the job was
    advanced past it (a run recorded just before its scheduler died without advancing the job —
    possible on MongoDB, which has no transaction around the two — never became due)."""
    if job.status == JobStatus.CANCELLED:
        return False
    if run.trigger == RunTrigger.MANUAL:
        return True
    return job.last_scheduled_for is not None and job.last_scheduled_for >= run.scheduled_for


def _closing_event(run: Execution, job: Job | None, at: datetime) -> StatusEvent:
    """The terminal event of a lost run that must not be re-published."""
    if job is None or job.status == JobStatus.CANCELLED:
        status, reason = ExecutionStatus.CANCELLED, "cancelled: the job was cancelled or deleted"
    else:
        status, reason = ExecutionStatus.SKIPPED, "orphan: recorded but never dispatched"
    return run_event(run, status, attempt=run.attempt, at=at, finished_at=at, error=reason)
