"""Dead letters, replays, bulk actions and backfills as operations on the domain, shared by the
HTTP and NATS interfaces (as :class:`gateway.service.JobService` is for jobs).

Tenancy as for jobs: a user lists, replays and backfills the runs of their own jobs only (the
job is looked up under the caller's id, so another user's job or run is a 404); an admin acts on
anyone's, and every change is audited with the admin as its actor. Runs created here take the
manual trigger's dispatch path: :meth:`core.ports.JobStore.dispatch` with a
:class:`core.ports.ManualDispatch`, then their QUEUED events and run messages
(:func:`core.runs.dispatched`); one whose publish fails stays QUEUED and the schedulers'
re-dispatch sweep sends it. Replays and backfills count against the owner's ``runsPerMinute``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from core import quotas
from core.access import Principal
from core.audit import AuditAction, AuditEntry, audit_entry
from core.backfill import (
    MAX_BACKFILL_RUNS,
    BackfillRequest,
    BackfillResult,
    BackfillRun,
    fire_times,
    planned_statuses,
    skip_reason,
)
from core.bulk import (
    CANCELLABLE,
    REPLAYABLE,
    AlreadyReplayed,
    BatchCounts,
    BulkAction,
    BulkCreate,
    BulkFilter,
    BulkKind,
    BulkNotFound,
    NotRecurring,
    RunNotReplayable,
    RunQuery,
    replay_nonce,
    replay_refusal,
    replayed_by_another,
)
from core.errors import BusUnavailable, ExecutionNotFound, FieldError, InvalidRequest
from core.ids import execution_id
from core.labels import parse_selector
from core.model import Execution, ExecutionStatus, Job, JobStatus, OverlapPolicy, Page
from core.ports import DispatchOutcome, JobStatusConflict, ManualDispatch
from core.quotas import TokenRequest
from core.runs import backfill_run, dispatched, replay_run
from core.schedule import checked_instant
from gateway.service import JobService

log = logging.getLogger(__name__)

DISPATCH_CHUNK = 100
"""Runs recorded per store call (and published per bus call) by a backfill."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """What replaying one run did: its new run (None: skipped), or why it was skipped."""

    run: Execution | None
    created: bool = False
    reason: str | None = None
    replayed_as: str | None = None
    """Skipped because the run has a replay already: its latest replay."""


class RunService:
    """Dead letters, replays, bulk actions and backfills (see the module docstring).

    Args:
        jobs: the job service (its store, bus, clock, settings and markers are shared).
    """

    def __init__(self, jobs: JobService) -> None:
        self.jobs = jobs
        self.store = jobs.store
        self.clock = jobs.clock
        self.bulk_created = asyncio.Event()
        """Set when a bulk action is created here (wakes this gateway's bulk runner)."""

    # --- dead letters --------------------------------------------------------------------------

    async def list_runs(
        self,
        who: Principal,
        query: RunQuery,
        *,
        limit: int,
        cursor: str | None,
        owner: str | None = None,
        all_users: bool = False,
    ) -> Page[Execution]:
        """Runs across the caller's jobs (``FAILED``: the dead letters), newest scheduled
        first; an admin's choice of ``owner``'s or (``all_users``) everyone's.

        Raises:
            Forbidden: no ``jobs:read``; another user's or everyone's runs asked by a non-admin.
            InvalidRequest: on field ``cursor``; ``to`` not after ``from`` (as a bulk action's
                filter).
        """
        who.require_read()
        whose = who.owner_filter(owner, all_users=all_users)
        start, end = query.scheduled_from, query.scheduled_to
        if start is not None and end is not None and end <= start:
            raise InvalidRequest(FieldError("to", "must be after from"))
        return await self.store.list_runs(whose, query, limit=limit, cursor=cursor)

    # --- replay --------------------------------------------------------------------------------

    async def replay(
        self, who: Principal, job_id: str, execution_id: str, *, force: bool = False
    ) -> Execution:
        """A new run of the job (a new id, ``replayOf`` = ``execution_id``), dispatched now as
        a manual trigger is, with the job's current parameters and options. A run that has a
        replay already is replayed again only with ``force`` (a retried request, or a second
        click, must not run the job twice; a replay that failed is replayed as itself). The
        refusal is checked before the quota is taken (a run replayed long ago costs no token)
        and again by the store, atomically with the insert (``ManualDispatch.sole_replay``):
        of concurrent replays of one run without ``force``, on any gateway, one is created
        and the others get the same ``AlreadyReplayed`` (having taken their token).

        Raises:
            Forbidden: a read-only token.
            JobNotFound / ExecutionNotFound: no such job for the caller, or no such run of it.
            JobStatusConflict: the job is cancelled (409).
            RunNotReplayable: the run is in progress or was skipped (409).
            AlreadyReplayed: the run has a replay and ``force`` is not set (409, naming the
                latest replay).
            QuotaExceeded: ``runsPerMinute`` of the job's owner (429).
        """
        who.require_write()
        owner = await self.jobs._owner_of(who, job_id)
        job = await self.store.get_job(owner, job_id)
        original = await self.store.get_execution(execution_id)
        if original is None or original.job_id != job.id:
            raise ExecutionNotFound(f"execution {execution_id} of job {job.id} not found")
        if job.status == JobStatus.CANCELLED:
            raise JobStatusConflict(job_id, job.status, "replayed")
        if original.status not in REPLAYABLE:
            raise RunNotReplayable(
                f"run {execution_id} is {original.status}; only a FAILED, CANCELLED or "
                "SUCCEEDED run can be replayed"
            )
        if not force:
            latest = replayed_by_another(original.id, await self.store.replays_of([original.id]))
            if latest is not None:
                raise AlreadyReplayed(original.id, latest)
        now = self.clock.now()
        await self._take_runs({owner: 1}, now)
        [result] = await self.replay_runs(who, [(job, original)], now, force=force)
        if result.replayed_as is not None:
            raise AlreadyReplayed(original.id, result.replayed_as)
        assert result.run is not None
        return result.run

    async def replay_runs(
        self,
        who: Principal,
        pairs: Sequence[tuple[Job | None, Execution]],
        now: datetime,
        *,
        bulk: BulkAction | None = None,
        force: bool = False,
    ) -> list[Replayed]:
        """Replay each ``(job, run)`` (job None: deleted), in one store call: skipped when the
        job is gone or cancelled, the run cannot be replayed, or (unless ``force``) the run has
        a replay already (:func:`core.bulk.replayed_by_another`, which the store applies
        atomically with the insert: ``ManualDispatch.sole_replay``; a replay that failed is a
        run of its own, replayed as any other). A bulk action's replays have ids derived from
        it (:func:`core.bulk.replay_nonce`), at its creation time, so a batch repeated after a
        crash creates none twice (``created`` False for those: its own replay does not make
        the run skipped). Quotas are the caller's to check."""
        results: list[Replayed] = []
        todo: list[tuple[int, Job, Execution]] = []
        for i, (job, original) in enumerate(pairs):
            refusal = replay_refusal(job, original)
            if job is None or refusal is not None:
                results.append(Replayed(None, reason=refusal))
                continue
            at = None if bulk is None else bulk.created_at
            nonce = None if bulk is None else replay_nonce(bulk.id, original.id)
            run = replay_run(job, original, now, nonce=nonce, at=at)
            results.append(Replayed(run))
            todo.append((i, job, run))
        if not todo:
            return results
        dispatches = [
            ManualDispatch(
                run,
                audit=audit_entry(
                    who,
                    AuditAction.REPLAYED,
                    job.id,
                    job.owner,
                    now,
                    execution_id=run.id,
                    replay_of=run.replay_of,
                    bulk_id=None if bulk is None else bulk.id,
                ),
                sole_replay=not force,
            )
            for _, job, run in todo
        ]
        outcomes = await self.store.dispatch(dispatches)
        to_publish = []
        for (i, job, run), outcome in zip(todo, outcomes, strict=True):
            if outcome.replayed_as is not None:
                results[i] = Replayed(
                    None,
                    reason=f"replayed already as {outcome.replayed_as}",
                    replayed_as=outcome.replayed_as,
                )
                continue
            results[i] = Replayed(run, created=outcome.created)
            to_publish.append((job, run, outcome))
            log.info(
                "run %s replayed as %s",
                run.replay_of,
                run.id,
                extra={"job_id": job.id, "execution_id": run.id},
            )
        await self._publish(to_publish, now)
        return results

    # --- backfill ------------------------------------------------------------------------------

    async def backfill(self, who: Principal, job_id: str, body: BackfillRequest) -> BackfillResult:
        """The runs a cron or interval job would have had with ``from <= scheduledFor < to``
        (see :mod:`core.backfill`): listed (``dryRun``) or created and dispatched.

        Raises:
            Forbidden: a read-only token (also for a dry run: it plans a change).
            JobNotFound: no such job for the caller.
            NotRecurring: a one-time job (409). JobStatusConflict: a cancelled job (409).
            InvalidRequest: ``to`` not after ``from``, ``to`` in the future, more than
                :data:`MAX_BACKFILL_RUNS` occurrences in the range (422).
            QuotaExceeded: ``runsPerMinute`` of the job's owner (429).
        """
        who.require_write()
        owner = await self.jobs._owner_of(who, job_id)
        job = await self.store.get_job(owner, job_id)
        start = checked_instant(body.scheduled_from, "from")
        end = checked_instant(body.scheduled_to, "to")
        now = self.clock.now()
        if end <= start:
            raise InvalidRequest(FieldError("to", "must be after from"))
        if end > now:
            raise InvalidRequest(
                FieldError("to", "must not be in the future (the schedule runs what is to come)")
            )
        if not job.recurring:
            raise NotRecurring(f"job {job_id} has a one-time schedule: nothing to backfill")
        if job.status == JobStatus.CANCELLED:
            raise JobStatusConflict(job_id, job.status, "backfilled")
        times = fire_times(job, start, end, limit=MAX_BACKFILL_RUNS)
        if len(times) > MAX_BACKFILL_RUNS:
            raise InvalidRequest(
                FieldError(
                    "to",
                    f"the range holds more than {MAX_BACKFILL_RUNS} fire times of this job; "
                    "backfill a shorter range",
                )
            )
        policy = body.overlap_policy or job.overlap_policy
        active = job.status == JobStatus.RUNNING
        reason = skip_reason(policy, active=active)
        had = {
            e.id: e
            for e in await self.store.get_executions([execution_id(job.id, t) for t in times])
        }
        new_times = [t for t in times if execution_id(job.id, t) not in had]
        plan = planned_statuses(len(new_times), policy, active=active)
        runs = [
            backfill_run(job, t, now, skip_reason=None if s == ExecutionStatus.QUEUED else reason)
            for t, s in zip(new_times, plan, strict=True)
        ]
        queued = sum(1 for r in runs if r.status == ExecutionStatus.QUEUED)
        if body.dry_run:
            return _backfill_result(
                job, times, had, runs, [False] * len(runs), policy, dry_run=True
            )
        rate = self.jobs.config.quotas.runs
        if rate is not None and queued > rate.capacity:
            raise InvalidRequest(
                FieldError(
                    "to",
                    f"{queued} runs would start at once; at most {int(rate.capacity)} may start "
                    "per minute here: backfill a shorter range",
                )
            )
        if queued:
            await self._take_runs({owner: queued}, now)
        created: list[bool] = []
        for i in range(0, len(runs), DISPATCH_CHUNK):
            chunk = runs[i : i + DISPATCH_CHUNK]
            outcomes = await self.store.dispatch([ManualDispatch(r) for r in chunk])
            created += [o.created for o in outcomes]
            await self._publish([(job, r, o) for r, o in zip(chunk, outcomes, strict=True)], now)
        n_created = sum(created)
        entry = audit_entry(who, AuditAction.BACKFILLED, job.id, owner, now, runs=n_created)
        await self.store.record_audit([entry])
        log.info(
            "job %s backfilled: %d occurrences, %d created",
            job.id,
            len(times),
            n_created,
            extra={"job_id": job.id},
        )
        return _backfill_result(job, times, had, runs, created, policy, dry_run=False)

    # --- bulk actions --------------------------------------------------------------------------

    async def create_bulk(self, who: Principal, kind: BulkKind, body: BulkCreate) -> BulkAction:
        """Record a bulk replay or cancel of the runs ``body`` selects (the caller's own, or an
        admin's choice), audited, and wake the bulk runner; the action runs in the background
        (``GET /bulk/{id}`` shows its progress).

        Raises:
            Forbidden: a read-only token; another user's or everyone's runs for a non-admin.
            InvalidRequest: a status the kind does not handle; ``to`` not after ``from``.
        """
        who.require_write()
        whose = who.owner_filter(body.owner, all_users=body.all_users)
        statuses = _bulk_statuses(kind, body.status)
        start = (
            None if body.scheduled_from is None else checked_instant(body.scheduled_from, "from")
        )
        end = None if body.scheduled_to is None else checked_instant(body.scheduled_to, "to")
        if start is not None and end is not None and end <= start:
            raise InvalidRequest(FieldError("to", "must be after from"))
        now = self.clock.now()
        action = BulkAction(
            id=uuid.uuid4().hex,
            kind=kind,
            filter=BulkFilter(
                statuses=statuses,
                task_id=body.task_id,
                scheduled_from=start,
                scheduled_to=end,
                error=body.error,
                owner=whose,
                labels=str(parse_selector(body.labels, "labels")) if body.labels else None,
            ),
            actor=who.user,
            actor_role=who.role,
            created_at=now,
            updated_at=now,
            lease_expires_at=now,
        )
        audit_action = (
            AuditAction.BULK_REPLAY if kind == BulkKind.REPLAY else AuditAction.BULK_CANCEL
        )
        entry = audit_entry(who, audit_action, "", whose or who.user, now, bulk_id=action.id)
        await self.store.create_bulk(action, audit=entry)
        self.bulk_created.set()
        log.info("bulk %s %s created by %s", kind, action.id, who.user)
        return action

    async def get_bulk(self, who: Principal, bulk_id: str) -> BulkAction:
        """One bulk action: the caller's (they made it, or it is about their runs); an admin's
        any.

        Raises:
            Forbidden: no ``jobs:read``.
            BulkNotFound: no such action the caller may see.
        """
        who.require_read()
        action = await self.store.get_bulk(bulk_id)
        if action is None or not (who.admin or who.user in (action.actor, action.filter.owner)):
            raise BulkNotFound(f"bulk action {bulk_id} not found")
        return action

    async def cancel_runs(
        self, who: Principal, runs: Sequence[Execution], now: datetime, *, bulk_id: str
    ) -> BatchCounts:
        """Cancel each run still in progress (its cancellation marker: the worker ends it
        CANCELLED), audited per run; a finished run is skipped."""
        markers = self.jobs.markers
        done = skipped = failed = 0
        entries: list[AuditEntry] = []
        for run in runs:
            if run.status not in CANCELLABLE:
                skipped += 1
                continue
            if markers is None:
                failed += 1
                continue
            try:
                await markers.cancel_run(run.id)
            except BusUnavailable as e:
                log.warning("run %s not cancelled (%s)", run.id, e)
                failed += 1
                continue
            done += 1
            entries.append(
                audit_entry(
                    who,
                    AuditAction.RUN_CANCELLED,
                    run.job_id,
                    run.owner,
                    now,
                    execution_id=run.id,
                    bulk_id=bulk_id,
                )
            )
        await self.store.record_audit(entries)
        return BatchCounts(done=done, skipped=skipped, failed=failed)

    # --- helpers -------------------------------------------------------------------------------

    async def _take_runs(self, counts: dict[str, int], now: datetime) -> None:
        """Take ``runsPerMinute`` tokens of each owner.

        Raises:
            QuotaExceeded: one of them may not start that many runs now (nothing is taken
                from that owner).
        """
        rate = self.jobs.config.quotas.runs
        if rate is None or not counts:
            return
        waits = await self.store.take_tokens(
            [TokenRequest(quotas.runs_key(o), n, rate) for o, n in counts.items()], now=now
        )
        worst = max(waits)
        if worst:
            raise quotas.runs_exceeded(self.jobs.config.quotas, worst)

    async def _publish(
        self, runs: Sequence[tuple[Job, Execution, DispatchOutcome]], now: datetime
    ) -> None:
        """Publish what :func:`core.runs.dispatched` says for each dispatched run: the events
        first (QUEUED precedes RUNNING), then the messages; a failed publish is left to the
        re-dispatch sweep."""
        bus = self.jobs.bus
        if bus is None:
            return
        events, messages = [], []
        for job, run, outcome in runs:
            event, message = dispatched(job, run, outcome, now)
            if event is not None:
                events.append(event)
            if message is not None:
                messages.append(message)
        if events:
            await bus.publish_events(events)
        if messages:
            errors = await bus.publish_runs(messages)
            for message, error in zip(messages, errors, strict=True):
                if error is not None:
                    log.warning(
                        "run %s stored; publish failed (%s): re-dispatch will send it",
                        message.execution_id,
                        error,
                        extra={"job_id": message.job_id, "execution_id": message.execution_id},
                    )


def _bulk_statuses(kind: BulkKind, status: ExecutionStatus | None) -> list[ExecutionStatus]:
    if kind == BulkKind.REPLAY:
        if status is None:
            return [ExecutionStatus.FAILED]
        if status not in REPLAYABLE:
            raise InvalidRequest(
                FieldError("status", "a replay takes FAILED, CANCELLED or SUCCEEDED runs")
            )
        return [status]
    if status is None:
        return list(CANCELLABLE)
    if status not in CANCELLABLE:
        raise InvalidRequest(
            FieldError("status", "a cancel takes QUEUED, RUNNING or RETRYING runs")
        )
    return [status]


def _backfill_result(
    job: Job,
    times: list[datetime],
    had: dict[str, Execution],
    runs: list[Execution],
    created: list[bool],
    policy: OverlapPolicy,
    *,
    dry_run: bool,
) -> BackfillResult:
    """The answer of a backfill: each occurrence with the status of the run it has (``had``)
    or gets (``runs``, ``created`` by this call; on a dry run: planned, created by none), and
    the counts of what the call does or, on a dry run, would do."""
    new = {r.id: (r, c) for r, c in zip(runs, created, strict=True)}
    rows: list[BackfillRun] = []
    queued = skipped = existing = 0
    for t in times:
        run_id = execution_id(job.id, t)
        if run_id in had:
            rows.append(
                BackfillRun(scheduled_for=t, execution_id=run_id, status=had[run_id].status)
            )
            existing += 1
            continue
        run, made = new[run_id]
        rows.append(
            BackfillRun(scheduled_for=t, execution_id=run_id, status=run.status, created=made)
        )
        if made or dry_run:
            queued += run.status == ExecutionStatus.QUEUED
            skipped += run.status == ExecutionStatus.SKIPPED
        else:  # another call created it between the look-up and the dispatch
            existing += 1
    return BackfillResult(
        dry_run=dry_run,
        overlap_policy=policy,
        fire_times=times,
        runs=rows,
        queued=queued,
        skipped=skipped,
        existing=existing,
    )
