"""The scheduler's state and its transitions, without I/O.

:class:`Scheduling` holds everything a scheduler remembers between two steps: which jobs are
due when (the fire-time heap of the lookahead window and the jobs re-decided at their due
time), the runs recorded ahead and not published yet, the runs whose publish failed, the
``bufferOne`` jobs waiting for a previous run, the jobs held back by their owner's runs quota,
the re-dispatch sweep's strikes, and when the next safety scan is due. Each method takes
``now`` and what an I/O call returned (jobs loaded by a scan, a partition gained or lost, a
notice, runs recorded, published or not, runs finished, the store's quota answer) and returns
what to do next (jobs to dispatch, records to write, messages to publish, when to wake up).

:class:`actors.scheduler.Scheduler` is the shell that performs the store and bus calls and feeds
their results back; ``tests/core/test_scheduling.py`` tests the transitions directly.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from core.dispatch import JobPlan, due_at, plan_job, previous_active
from core.fairness import round_robin
from core.heap import FireHeap, TimedQueue
from core.ids import execution_id
from core.model import (
    Event,
    Execution,
    ExecutionStatus,
    Job,
    JobNotice,
    JobStatus,
    OverlapPolicy,
    RunMessage,
    RunTrigger,
    StatusEvent,
)
from core.ports import Dispatch, DispatchOutcome, DueJob
from core.quotas import TokenRequest, runs_key
from core.runs import dispatched, run_event, run_message
from core.settings import SchedulerConfig
from core.timeutil import to_epoch_ms

log = logging.getLogger(__name__)

HELD_BY_QUOTA = "held back by the owner's runs-per-minute quota"
"""Named in the misfire record of a job that the runs quota held past its misfire grace."""

MAX_UNPUBLISHED = 100_000
"""Most runs kept for a publish retry; beyond, the re-dispatch sweep publishes them."""

MAX_REMEMBERED = 10_000
"""Most jobs refused by the store, and most owners over quota, remembered for the log."""


def _owner(message: RunMessage) -> str:
    return message.owner


@dataclass(frozen=True, slots=True)
class Decided:
    """A due job's plan, before its owner's runs quota allows it.

    Attributes:
        when: the time it is decided as of (its due time, or now if later).
        waited: the ``bufferOne`` run it was waiting for (restored if the job is held back).
    """

    job: Job
    plan: JobPlan
    when: datetime
    waited: str | None


@dataclass(frozen=True, slots=True)
class Recorded:
    """What the store's answer to a chain of dispatches leads to.

    Attributes:
        ready: the runs recorded now, each with its publish time (hand them to
            :meth:`Scheduling.prepare` once their events are out).
        events: the QUEUED and SKIPPED events of the records created, for live clients.
        skipped: the SKIPPED records written (misfires, overlaps), for the metrics.
    """

    ready: list[tuple[datetime, RunMessage]]
    events: list[Event]
    skipped: list[Execution]


@dataclass(frozen=True, slots=True)
class Resend:
    """The re-dispatch sweep's answer for the runs found lost.

    Attributes:
        messages: runs to publish again (same execution id, ``redispatched_at_ms`` set).
        closing: terminal events for lost runs that must not run any more.
    """

    messages: list[RunMessage]
    closing: list[StatusEvent]


class Scheduling:
    """The state machine of one scheduler (see module docstring). Not thread-safe; no I/O.

    Args:
        now: the wall-clock time it starts at: the first scan is due then.
        config: the scheduler's settings section: ``lookahead_seconds`` (how far ahead a scan
            loads jobs), ``scan_interval_seconds`` (the safety scan's period),
            ``prepare_ahead_seconds`` (runs are recorded up to this long before they are due),
            ``batch`` (most jobs one :meth:`due` hands out), ``heap_limit`` (most jobs one scan
            loads; a full scan shortens the window), ``duplicate_window_seconds`` (the work
            stream's de-duplication window), ``resolved_redispatch_after_seconds`` (an unfinished
            run untouched this long is a re-dispatch candidate), ``quotas`` (the runs-per-minute
            quota applies here).
        scheduler_id: recorded on the runs it dispatches.
        name: the scheduler's name, in log lines.
    """

    def __init__(
        self,
        now: datetime,
        config: SchedulerConfig,
        *,
        scheduler_id: str,
        name: str = "scheduler",
    ) -> None:
        self.scheduler_id = scheduler_id
        self.name = name
        self.lookahead = timedelta(seconds=config.lookahead_seconds)
        self.scan_interval = timedelta(seconds=config.scan_interval_seconds)
        self.ahead = timedelta(seconds=config.prepare_ahead_seconds)
        self.batch = config.batch
        self.heap_limit = config.heap_limit
        self.duplicate_window = timedelta(seconds=config.duplicate_window_seconds)
        self.redispatch_after = timedelta(seconds=config.resolved_redispatch_after_seconds)
        self.quotas = config.quotas
        self.runs_quota = self.quotas.runs
        self.heap = FireHeap()
        """Jobs of the lookahead window by due time; recorded up to ``prepare_ahead_seconds``
        early."""
        self.at_due = FireHeap()
        """Jobs decided at their due time exactly: previous run active, held by the quota."""
        self.prepared: TimedQueue[RunMessage] = TimedQueue()
        """Runs recorded, published at their time."""
        self.unpublished: dict[str, RunMessage] = {}
        """Runs whose publish failed, by execution id: retried."""
        self.strikes: dict[str, int] = {}
        """Re-dispatch candidates seen once: execution id -> status stream's last sequence then."""
        self.waiting: dict[str, str] = {}
        """``bufferOne`` jobs waiting: job id -> the previous run's execution id."""
        self.over_quota: dict[str, int] = {}
        """Jobs held back by the runs quota: job id -> partition."""
        self.owners_over_quota: set[str] = set()
        self.rejected: set[str] = set()
        """Jobs whose dispatch the store refused for good (logged once)."""
        self.taken: frozenset[int] = frozenset()
        """Partitions gained whose recorded runs are not taken over yet."""
        self.window_end = now
        """The heap holds every job of the owned partitions due up to here."""
        self.next_scan = now

    # --- ownership ------------------------------------------------------------------------------

    def gained(self, partitions: frozenset[int], now: datetime) -> None:
        """New partitions: take their recorded runs over and scan them at once."""
        self.taken |= partitions
        self.next_scan = now

    def lost(self, partitions: frozenset[int]) -> int:
        """Partitions taken away (fenced): forget what is due in them; how many heap entries."""
        dropped = self.heap.drop_partitions(partitions)
        self.at_due.drop_partitions(partitions)
        self.over_quota = {j: p for j, p in self.over_quota.items() if p not in partitions}
        return dropped

    def takeover_window(self, now: datetime) -> tuple[datetime, datetime]:
        """Which records of a taken-over partition to publish again: those updated after the
        first time and scheduled before the second (see :meth:`taken_over`)."""
        # until: records of a previous owner whose clock is ahead
        return now - self.duplicate_window / 2, now + timedelta(minutes=1)

    def taken_over(
        self,
        partitions: frozenset[int],
        recorded: Iterable[Execution],
        jobs: Mapping[str, Job],
        now: datetime,
    ) -> int:
        """Prepare the QUEUED runs of ``partitions`` that their previous owner recorded.

        Each is published at its due time under its execution id: if the first publish did
        happen, JetStream drops the copy. Runs that must not be re-published are left to the
        re-dispatch sweep, which closes them. Returns how many were prepared.
        """
        self.taken -= partitions
        taken = 0
        for run in recorded:
            if run.status != ExecutionStatus.QUEUED:
                continue
            job = jobs.get(run.job_id)
            if job is None or not resendable(job, run):
                continue
            when = run.scheduled_for + timedelta(milliseconds=run.jitter_ms)
            self.prepared.add(when, run_message(job, run, now))
            taken += 1
        return taken

    # --- loading --------------------------------------------------------------------------------

    def scan_due(self, now: datetime) -> bool:
        return now >= self.next_scan

    def scan_until(self, now: datetime) -> datetime:
        """The end of the window a scan at ``now`` loads."""
        return now + self.lookahead

    def loaded(self, jobs: Sequence[DueJob], until: datetime) -> None:
        """A scan returned ``jobs`` (due up to ``until``, earliest first, at most
        ``heap_limit``): load them; a full answer ends the window at its last job."""
        for job in jobs:
            self.heap.push(job.id, job.next_run_at, job.partition)
        truncated = len(jobs) == self.heap_limit  # a positive limit: jobs[-1] exists
        self.window_end = jobs[-1].next_run_at if truncated else until

    def scanned(self, started: datetime) -> None:
        """The scan (and its sweep) begun at ``started`` succeeded: the next one is due a scan
        interval later. A scan that failed is tried again at the next step."""
        self.next_scan = started + self.scan_interval

    def notice(self, notice: JobNotice, owned: Container[int]) -> bool:
        """A job was created or changed; whether it entered the heap (then wake up)."""
        if notice.next_run_at is None or notice.partition not in owned:
            return False
        if notice.next_run_at > self.window_end:
            return False
        self.heap.push(notice.job_id, notice.next_run_at, notice.partition)
        return True

    def finished(self, job_ids: Iterable[str], now: datetime) -> list[str]:
        """Runs of ``job_ids`` ended: the ``bufferOne`` jobs waiting among them are due now
        (returned: wake up if any)."""
        woken = [job_id for job_id in job_ids if job_id in self.waiting]
        for job_id in woken:
            self.heap.push(job_id, now)
        return woken

    # --- when -----------------------------------------------------------------------------------

    def due(self, now: datetime) -> list[str]:
        """Remove and return the next jobs to dispatch (at most ``batch``): those re-decided at
        their due time first, else those due within the prepare-ahead lead."""
        due = self.at_due.pop_due(now, self.batch) or self.heap.pop_due(
            now + self.ahead, self.batch
        )
        return [job_id for job_id, _ in due]

    def next_deadline(self) -> datetime:
        """When the main loop must wake up: the next scan, half the lead before the earliest
        job (it then records every job due within the whole lead), or a re-decided job's due
        time, whichever is first."""
        deadline = self.next_scan
        top = self.heap.peek()
        if top is not None:
            deadline = min(deadline, top - self.ahead / 2)
        due = self.at_due.peek()
        return deadline if due is None else min(deadline, due)

    # --- deciding -------------------------------------------------------------------------------

    def to_dispatch(
        self, job_ids: Collection[str], jobs: Iterable[Job], owned: Container[int]
    ) -> list[Job]:
        """The jobs of ``job_ids`` (as loaded from the store) still due here: scheduled and in
        an owned partition. The others (deleted, paused, finished, moved) are no longer held."""
        kept = [j for j in jobs if j.next_run_at is not None and j.partition in owned]
        if self.over_quota:
            for job_id in set(job_ids) - {j.id for j in kept}:
                self.over_quota.pop(job_id, None)
        return kept

    def decide(
        self,
        jobs: Iterable[Job],
        previous: Mapping[str, Execution],
        now: datetime,
        *,
        ended: Container[str] = (),
    ) -> list[Decided]:
        """Plan ``jobs`` as of their due times (recorded up to ``prepare_ahead_seconds`` early).

        A job not due within the lead goes back to the heap; a job whose previous run is active
        is decided at its due time instead, not ahead of it. The others are planned, earliest
        first (so the quota goes to them first); a job that cannot be planned is skipped this
        time and logged (a bulkhead).

        Args:
            previous: the latest dispatched run of the jobs that need it (see
                :func:`previous_lookups`), by job id.
            ended: those of them whose message is gone from the work stream
                (see :func:`stream_checks`).
        """
        ahead = now + self.ahead
        decided: list[Decided] = []
        for job in sorted(jobs, key=lambda j: due_at(j) or now):
            when = max(now, due_at(job) or now)
            if when > ahead:  # not due yet (its entry was stale, or its jitter delays it)
                if when <= self.window_end:
                    self.heap.push(job.id, when, job.partition)
                continue
            prev = previous.get(job.id)
            if when > now and previous_active(prev):
                self.at_due.push(job.id, when, job.partition)
                continue
            waited = self.waiting.pop(job.id, None)
            try:
                plan = plan_job(
                    job,
                    when,
                    previous=prev,
                    buffered=waited is not None,
                    scheduler_id=self.scheduler_id,
                    held_by=HELD_BY_QUOTA if job.id in self.over_quota else None,
                    ended=ended,
                )
            except Exception:  # a bulkhead: one job that cannot be planned must not stop the rest
                log.exception("%s: cannot plan job %s; skipping it this time", self.name, job.id)
                continue
            decided.append(Decided(job, plan, when, waited))
        return decided

    def quota_requests(self, decided: Sequence[Decided]) -> list[TokenRequest]:
        """What to take from the owners' token buckets for ``decided`` (one request per
        decision that queues runs, in order; none without a runs quota)."""
        rate = self.runs_quota
        if rate is None:
            return []
        return [
            TokenRequest(runs_key(d.job.owner), len(d.plan.queued), rate)
            for d in decided
            if d.plan.queued
        ]

    def within_quota(
        self, decided: Sequence[Decided], waits: Sequence[float], now: datetime
    ) -> tuple[list[Decided], int]:
        """The decisions the quota allows, given the store's answer to :meth:`quota_requests`
        (``waits``: seconds until each request could be granted, 0 = granted), and how many runs
        were held back. A held job is re-decided when its bucket will have refilled enough
        (whole milliseconds, at least one: a hold never spins), its ``bufferOne`` wait kept."""
        asking = [d for d in decided if d.plan.queued] if self.runs_quota is not None else []
        denied = {id(d): w for d, w in zip(asking, waits, strict=True) if w}
        for owner in {d.job.owner for d in asking if id(d) not in denied} & self.owners_over_quota:
            self.owners_over_quota.discard(owner)
            log.info("%s: user %r is within the runs-per-minute quota again", self.name, owner)
        held = 0
        for d in decided:
            wait = denied.get(id(d))
            if wait is not None:
                until = now + timedelta(milliseconds=max(1, math.ceil(wait * 1000)))
                self._hold(d, until)
                held += len(d.plan.queued)
        return [d for d in decided if id(d) not in denied], held

    def _hold(self, d: Decided, until: datetime) -> None:
        job = d.job
        if d.waited is not None:
            self.waiting[job.id] = d.waited
        self.over_quota[job.id] = job.partition
        self.at_due.push(job.id, until, job.partition)
        if job.owner not in self.owners_over_quota and len(self.owners_over_quota) < MAX_REMEMBERED:
            self.owners_over_quota.add(job.owner)
            log.info(
                "%s: user %r is over the runs-per-minute quota (%d); holding runs back",
                self.name,
                job.owner,
                self.quotas.runs_per_minute,
                extra={"job_id": job.id, "partition": job.partition},
            )
        log.debug("job %s held back by the runs quota until %s", job.id, until)

    def accept(self, d: Decided) -> list[Dispatch]:
        """A decision the quota allows: the chain to record (the shell cancels
        ``d.plan.cancel`` first). A job not due yet goes back to the heap; a ``bufferOne`` job
        waits for its previous run."""
        self.over_quota.pop(d.job.id, None)
        plan, job = d.plan, d.job
        if plan.not_before is not None:
            if plan.not_before <= self.window_end:
                self.heap.push(job.id, plan.not_before, job.partition)
            return []
        if plan.wait_for is not None:
            log.debug("job %s waits for run %s", job.id, plan.wait_for)
            self.waiting[job.id] = plan.wait_for
            return []
        return plan.dispatches

    # --- recording ------------------------------------------------------------------------------

    def refused(self, job: Job) -> bool:
        """The store refused ``job``'s dispatch for good: it is held back until the next scan.
        Whether this is news (log it) rather than a repeat."""
        if job.id in self.rejected:
            return False
        if len(self.rejected) >= MAX_REMEMBERED:
            self.rejected.clear()
        self.rejected.add(job.id)
        return True

    def accepted(self, job_ids: Iterable[str]) -> None:
        """The store recorded a chain of these jobs: any refusal of theirs is over."""
        self.rejected.difference_update(job_ids)

    def recorded(
        self,
        results: Iterable[tuple[tuple[Dispatch, Job, datetime], DispatchOutcome]],
        now: datetime,
    ) -> Recorded:
        """The store recorded (or not: another scheduler advanced the job first) each dispatch
        of a chain. The jobs advanced go back to the heap at their next occurrence."""
        ready: list[tuple[datetime, RunMessage]] = []
        events: list[Event] = []
        skipped: list[Execution] = []
        upcoming: dict[str, tuple[datetime | None, int]] = {}
        for (d, job, when), outcome in results:
            if not outcome.advanced:
                continue
            event, message = dispatched(job, d.execution, outcome, now)
            if message is not None:
                ready.append((when, message))
            elif d.execution.skip_reason:
                skipped.append(d.execution)
            if event is not None:
                events.append(event)
            upcoming[job.id] = (d.next_run_at, job.partition)
        for job_id, (nxt, partition) in upcoming.items():
            if nxt is not None and nxt <= self.window_end:
                self.heap.push(job_id, nxt, partition)
        return Recorded(ready, events, skipped)

    def prepare(self, ready: Iterable[tuple[datetime, RunMessage]]) -> None:
        """Runs recorded: publish each at its time."""
        for when, message in ready:
            self.prepared.add(when, message)

    # --- publishing -----------------------------------------------------------------------------

    @property
    def pending(self) -> bool:
        """Whether runs wait to be published (prepared or failed)."""
        return bool(self.prepared) or bool(self.unpublished)

    def due_runs(self, now: datetime) -> list[RunMessage]:
        """Remove and return the prepared runs due at ``now``: their owners in turns, each
        owner's earliest first (:func:`core.fairness.round_robin`: a burst of one user's runs
        due together is not published ahead of every run of the others)."""
        return round_robin(self.prepared.pop_due(now), _owner)

    def published(
        self, messages: Sequence[RunMessage], errors: Sequence[Exception | None]
    ) -> list[RunMessage]:
        """The bus answered a publish of ``messages`` (an error or None each): the failed ones
        are kept for a retry (up to :data:`MAX_UNPUBLISHED`); returns the published ones."""
        done: list[RunMessage] = []
        for msg, err in zip(messages, errors, strict=True):
            if err is None:
                self.unpublished.pop(msg.execution_id, None)
                done.append(msg)
            elif len(self.unpublished) < MAX_UNPUBLISHED:
                self.unpublished[msg.execution_id] = msg
        return done

    def publish_deadline(self, now: datetime, retry_seconds: float) -> datetime:
        """When the publisher must wake up: the earliest prepared run, or ``retry_seconds`` after
        ``now`` while a failed publish waits for its retry (at most an hour)."""
        deadline = self.prepared.peek() or now + timedelta(hours=1)
        if self.unpublished:
            deadline = min(deadline, now + timedelta(seconds=retry_seconds))
        return deadline

    # --- re-dispatch ----------------------------------------------------------------------------

    def stale_before(self, now: datetime) -> datetime:
        """Unfinished runs last touched before this are re-dispatch candidates."""
        return now - self.redispatch_after

    def sighted(
        self, absent: Iterable[Execution], last_seq: int, ack_floor: int
    ) -> list[Execution]:
        """The sweep found ``absent``: candidates whose message is gone from the work stream.

        A candidate is lost when it is seen again at a later sweep and the recorders have
        recorded every status event that existed at the first sighting (``ack_floor`` at least
        the status stream's ``last_seq`` then): no event can still be on its way to the store,
        and without a message no worker can be running it. Returns the lost runs; the others
        are remembered with ``last_seq`` (strikes), those no longer absent forgotten.

        Args:
            last_seq: the status stream's newest sequence now (unused when ``absent`` is empty).
            ack_floor: the sequence up to which the recorders have recorded every event.
        """
        absent = list(absent)
        lost = [e for e in absent if e.id in self.strikes and ack_floor >= self.strikes[e.id]]
        lost_ids = {e.id for e in lost}
        self.strikes = {
            e.id: self.strikes.get(e.id, last_seq) for e in absent if e.id not in lost_ids
        }
        return lost

    def resend(self, lost: Iterable[Execution], jobs: Mapping[str, Job], at: datetime) -> Resend:
        """What to do with the ``lost`` runs (their jobs loaded in ``jobs``): publish again the
        ones that may still run (not those already waiting for a publish retry), close the
        others (job deleted or cancelled, or the run never became due)."""
        messages: list[RunMessage] = []
        closing: list[StatusEvent] = []
        for e in lost:
            job = jobs.get(e.job_id)
            if job is None or not resendable(job, e):
                closing.append(closing_event(e, job, at))
            elif e.id not in self.unpublished:
                messages.append(
                    run_message(
                        job, e, at, attempt_offset=e.attempt, redispatched_at_ms=to_epoch_ms(at)
                    )
                )
        return Resend(messages, closing)


def previous_lookups(jobs: Iterable[Job]) -> dict[str, Job]:
    """The previous runs the overlap policies need: execution id -> job, for each recurring job
    whose policy is not ``allow`` and that has dispatched a run."""
    return {
        execution_id(j.id, j.last_dispatched_for): j
        for j in jobs
        if j.recurring
        and j.overlap_policy != OverlapPolicy.ALLOW
        and j.last_dispatched_for is not None
    }


def stream_checks(
    runs: Iterable[Execution], lookups: Mapping[str, Job], now: datetime
) -> list[Execution]:
    """Which of the previous ``runs`` to look up in the work stream: those the store still
    shows active whose job is decided now (due at ``now`` or earlier). A job due later is
    re-decided at its due time, so checking it early would cost a round trip per job for
    nothing — and when the workers fall behind, that is every job."""
    return [run for run in runs if previous_active(run) and (due_at(lookups[run.id]) or now) <= now]


def resendable(job: Job, run: Execution) -> bool:
    """Whether a lost run may be re-published: its job is not cancelled, and the job was
    advanced past it (a run recorded just before its scheduler died without advancing the job —
    possible on MongoDB, which has no transaction around the two — never became due)."""
    if job.status == JobStatus.CANCELLED:
        return False
    if run.trigger == RunTrigger.MANUAL:
        return True
    return job.last_scheduled_for is not None and job.last_scheduled_for >= run.scheduled_for


def closing_event(run: Execution, job: Job | None, at: datetime) -> StatusEvent:
    """The terminal event of a lost run that must not be re-published."""
    if job is None or job.status == JobStatus.CANCELLED:
        status, reason = ExecutionStatus.CANCELLED, "cancelled: the job was cancelled or deleted"
    else:
        status, reason = ExecutionStatus.SKIPPED, "orphan: recorded but never dispatched"
    return run_event(run, status, attempt=run.attempt, at=at, finished_at=at, error=reason)
