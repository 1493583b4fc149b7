"""The job API as operations on the domain, shared by the HTTP and NATS interfaces.

Every method takes the caller (:class:`core.access.Principal`: a token's user, role and scopes)
and raises the project's errors (:mod:`core.errors`), which each interface maps to its own error
format. A user acts on their own jobs; an admin on anyone's (the job's owner is looked up, and
every change is recorded with the admin as its actor). Changes need the ``jobs:write`` scope,
reads ``jobs:read``; the per-user quotas (:mod:`core.quotas`) are checked here, before the
store is changed.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from datetime import datetime
from typing import TypeVar

import msgspec

from core import cron, notifications, quotas
from core import schedule as schedules
from core.access import Principal
from core.audit import AuditAction, AuditQuery, AuditRecord, audit_entry
from core.clock import Clock
from core.concurrency import ConcurrencyPolicy, check_concurrency
from core.errors import (
    BusUnavailable,
    ExecutionNotFound,
    FieldError,
    InvalidCron,
    InvalidRequest,
    JobNotFound,
)
from core.explain import Explanation
from core.ids import new_job_id, partition_of
from core.labels import check_labels, merge_labels
from core.model import (
    CronSchedule,
    Execution,
    Job,
    JobCreate,
    JobEvent,
    JobEventType,
    JobNotice,
    JobPatch,
    JobStatus,
    Page,
    RunMessage,
    StatusEvent,
    patched_spec,
    requested_spec,
    spec_values,
)
from core.ports import (
    UNCHANGED,
    CancelRequests,
    GatewayBus,
    IdempotencyKeyReused,
    JobChange,
    JobQuery,
    JobStatusConflict,
    JobStore,
    ManualDispatch,
    RunInspector,
)
from core.quotas import TokenRequest
from core.runs import dispatched, manual_run
from core.settings import GatewayConfig
from core.tasks import TaskCatalog, validation_field_error
from core.timeutil import to_utc_ms
from core.values import check_parameters, is_text
from gateway.explaining import explanation

log = logging.getLogger(__name__)
T = TypeVar("T")

_canonical = msgspec.json.Encoder(order="sorted")
LIVE = frozenset({JobStatus.SCHEDULED, JobStatus.RUNNING})
CHANGEABLE = frozenset({JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.PAUSED})
COUNTS_KEPT = 10_000
"""Owners whose latest active-jobs count a gateway remembers (least recently used dropped)."""


def request_fingerprint(body: JobCreate) -> str:
    """What an ``Idempotency-Key`` retry is compared by: SHA-256 (hex) of ``body`` with its keys
    sorted and every instant in UTC to the millisecond, so the same request written with another
    UTC offset or precision (``2099-01-01T01:00:00+01:00`` for ``2099-01-01T00:00:00Z``) is the
    same request (draft-ietf-httpapi-idempotency-key-header, "Idempotency Fingerprint").

    An instant is encoded as msgspec encodes it (``2099-01-01T00:00:00Z``, ``….123Z``), so a body
    whose instants are in UTC to the millisecond has the digest the release before this
    normalisation stored: a keyed request made before an upgrade and retried after it (or on a
    gateway of the other release, during a rolling one) is still the same request."""
    values = msgspec.to_builtins(body, builtin_types=(datetime,), order="sorted")
    if values.get("concurrencyPolicy") == ConcurrencyPolicy.QUEUE:
        # the default before a task could set one: releases before left it out of the digest
        del values["concurrencyPolicy"]
    return hashlib.sha256(_canonical.encode(_utc_instants(values))).hexdigest()


def _utc_instants(value: object) -> object:
    if isinstance(value, datetime):
        return to_utc_ms(value)
    if isinstance(value, dict):
        return {k: _utc_instants(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utc_instants(v) for v in value]
    return value


class JobService:
    """Create, read, change and control jobs (see module docstring).

    Args:
        store: the job store.
        bus: the bus (NATS; None: no notices, no events, manual runs recorded but not
            published — for store-only tests).
        catalog: the tasks a job may name.
        clock: wall clock.
        config: the gateway's settings (:class:`core.settings.GatewayConfig`): ``partitions``,
            ``max_deliver``, ``quotas``.
        markers: cancellation markers (None: cancelling does not reach running runs).
        inspector: read-only looks at queues and leases for :meth:`explain` (None: those
            checks are reported unavailable).
    """

    def __init__(
        self,
        store: JobStore,
        bus: GatewayBus | None,
        catalog: TaskCatalog,
        clock: Clock,
        config: GatewayConfig,
        markers: CancelRequests | None = None,
        inspector: RunInspector | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.catalog = catalog
        self.clock = clock
        self.config = config
        self.markers = markers
        self.inspector = inspector
        self._counted: OrderedDict[str, tuple[int, datetime]] = OrderedDict()

    # --- create and read -----------------------------------------------------------------------

    async def create(
        self, who: Principal, body: JobCreate, *, idempotency_key: str | None = None
    ) -> tuple[Job, bool]:
        """Create a job owned by ``who``; ``(job, replayed)``.

        With an ``idempotency_key`` already used by this owner for the same request, the
        original job is returned with ``replayed=True`` (nothing is created).

        Raises:
            Forbidden: a read-only token (403).
            InvalidRequest: unknown task, labels breaking :mod:`core.labels`' rules (naming
                the key), parameters of the wrong shape or outside the stored range
                (:mod:`core.values`), invalid schedule, an interval below the smallest one,
                options beyond this deployment's limits, a malformed idempotency key.
            QuotaExceeded: ``createsPerSecond`` (with a retry time) or ``activeJobs`` (429).
            IdempotencyKeyReused: the key was used for a different request (409).
            NameTaken: the owner has a job of this ``name`` (409).
            StoreUnavailable: nothing was stored (503).
        """
        who.require_write()
        job = self._new_job(who.user, body, idempotency_key)
        await self._check_create_quotas(who.user)
        digest = request_fingerprint(body) if idempotency_key else None
        entry = audit_entry(who, AuditAction.CREATED, job.id, job.owner, job.created_at)
        try:
            job = await self.store.create_job(job, request_hash=digest, audit=entry)
        except IdempotencyKeyReused as e:
            if e.same_request:
                return e.job, True
            raise
        await self._notify(job)
        await self._event(job, "created", who)
        log.info(
            "job %s created (%s)",
            job.id,
            job.task_id,
            extra={"job_id": job.id, "partition": job.partition},
        )
        return job, False

    def _new_job(self, owner: str, body: JobCreate, idempotency_key: str | None) -> Job:
        spec = self.catalog.get(body.task_id)
        spec.decode_params(body.parameters)
        check_parameters(body.parameters)
        check_labels(body.labels)
        now = self.clock.now()
        sched = schedules.normalize(body.schedule, now, grace_seconds=body.misfire_grace_seconds)
        quotas.check_schedule(self.config.quotas, sched, now)
        max_attempts = body.max_attempts or spec.max_attempts
        self._check_attempts(max_attempts)
        if idempotency_key is not None:
            if not 1 <= len(idempotency_key) <= 255:
                raise InvalidRequest(FieldError("Idempotency-Key", "must be 1 to 255 characters"))
            if not is_text(idempotency_key):  # aiohttp keeps bytes that are not UTF-8 as surrogates
                raise InvalidRequest(FieldError("Idempotency-Key", "must be UTF-8 text"))
        key, max_concurrent, policy = spec.job_concurrency(
            body.concurrency_key, body.max_concurrent, body.concurrency_policy, body.parameters
        )
        job_id = new_job_id()
        options = requested_spec(
            body,
            schedule=sched,
            max_attempts=max_attempts,
            timeout_seconds=float(body.timeout_seconds or spec.timeout_seconds),
            notify=notifications.resolve(body.notify),
            concurrency_key=key,
            max_concurrent=max_concurrent or 1,
            concurrency_policy=policy,
        )
        return Job(
            **spec_values(options),
            id=job_id,
            owner=owner,
            status=JobStatus.SCHEDULED,
            partition=partition_of(job_id, self.config.partitions),
            created_at=now,
            updated_at=now,
            next_run_at=schedules.first_run_at(sched, now),
            idempotency_key=idempotency_key,
        )

    def _check_attempts(self, max_attempts: int) -> None:
        if max_attempts > self.config.max_deliver:
            raise InvalidRequest(
                FieldError("maxAttempts", f"must be at most {self.config.max_deliver} here")
            )

    async def _check_create_quotas(self, owner: str) -> None:
        """Take a creation token and, when it can matter (:func:`core.quotas.must_count`),
        count the owner's active jobs — concurrently: a write and a read.

        Raises:
            QuotaExceeded: ``owner`` may not create a job now (the rate is checked first).
        """
        limits = self.config.quotas
        rate = limits.creates
        now = self.clock.now()
        counting = quotas.must_count(limits, self._counted.get(owner), now)
        take = self.store.take_tokens(
            [TokenRequest(quotas.creates_key(owner), 1, rate)] if rate else [], now=now
        )
        count = self.store.count_jobs(owner, quotas.ACTIVE_JOB_STATUSES if counting else ())
        waits, active = await asyncio.gather(take, count, return_exceptions=True)
        for outcome in (waits, active):
            if isinstance(outcome, BaseException):
                raise outcome
        assert isinstance(waits, list) and isinstance(active, int)
        if waits and waits[0]:
            raise quotas.creates_exceeded(limits, waits[0])
        if counting:
            self._remember_count(owner, active, now)
            quotas.check_active_jobs(limits, active)

    def _remember_count(self, owner: str, active: int, at: datetime) -> None:
        self._counted[owner] = (active, at)
        self._counted.move_to_end(owner)
        if len(self._counted) > COUNTS_KEPT:
            self._counted.popitem(last=False)

    async def get(self, who: Principal, job_id: str) -> Job:
        """Raises: Forbidden (no ``jobs:read``), JobNotFound (not the caller's, unless admin)."""
        who.require_read()
        if who.admin:
            return await self._any_job(job_id)
        return await self.store.get_job(who.user, job_id)

    async def list_jobs(
        self,
        who: Principal,
        query: JobQuery,
        *,
        limit: int,
        cursor: str | None,
        owner: str | None = None,
        all_users: bool = False,
    ) -> Page[Job]:
        """The caller's jobs; an admin's choice of ``owner``'s or (``all_users``) everyone's.

        Raises:
            Forbidden: no ``jobs:read``; another user's or everyone's jobs asked by a non-admin.
        """
        who.require_read()
        whose = who.owner_filter(owner, all_users=all_users)
        return await self.store.list_jobs(whose, query, limit=limit, cursor=cursor)

    async def list_executions(
        self, who: Principal, job_id: str, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        who.require_read()
        owner = await self._owner_of(who, job_id)
        return await self.store.list_executions(owner, job_id, limit=limit, cursor=cursor)

    async def get_execution(self, who: Principal, job_id: str, execution_id: str) -> Execution:
        """One run of the job, attempts included.

        Raises:
            JobNotFound: no such job for the caller. ExecutionNotFound: no such run of that job.
        """
        job = await self.get(who, job_id)
        run = await self.store.get_execution(execution_id)
        if run is None or run.job_id != job.id:
            raise ExecutionNotFound(f"execution {execution_id} of job {job.id} not found")
        return run

    async def list_audit(
        self,
        who: Principal,
        query: AuditQuery,
        *,
        limit: int,
        cursor: str | None,
        all_users: bool = False,
    ) -> Page[AuditRecord]:
        """Audit records, newest first: of the caller's jobs, or (admin) of ``query.owner``'s or
        (``all_users``) of everyone's; ``query.actor`` and ``query.job_id`` narrow them.

        A job's records outlive the job (a deleted job's trail stays readable by its owner).

        Raises:
            Forbidden: no ``jobs:read``; another user's or everyone's records asked by a
                non-admin.
        """
        who.require_read()
        owner = who.owner_filter(query.owner, all_users=all_users)
        if query.job_id is not None and who.admin and query.owner is None:
            owner = None  # an admin reads any job's trail by its id
        scoped = AuditQuery(owner=owner, actor=query.actor, job_id=query.job_id)
        return await self.store.list_audit(scoped, limit=limit, cursor=cursor)

    async def job_audit(
        self, who: Principal, job_id: str, *, limit: int, cursor: str | None
    ) -> Page[AuditRecord]:
        """The audit records of one job, newest first (:meth:`list_audit` with ``job_id``).

        Raises:
            Forbidden: no ``jobs:read``.
            JobNotFound: the job has no record the caller may read and is no job of theirs
                (an admin: no job at all).
        """
        page = await self.list_audit(who, AuditQuery(job_id=job_id), limit=limit, cursor=cursor)
        if not page.items and cursor is None:
            await self.get(who, job_id)  # 404 unless the job exists for the caller
        return page

    # --- control -------------------------------------------------------------------------------

    async def pause(self, who: Principal, job_id: str) -> Job:
        """No run starts until :meth:`resume`; a run in progress continues.

        Raises:
            Forbidden: a read-only token.
            JobStatusConflict: the job is not waiting for a run (finished, cancelled, paused).
        """
        who.require_write()
        owner = await self._owner_of(who, job_id)
        job = await self.store.get_job(owner, job_id)
        if job.next_run_at is None and not job.recurring:
            raise JobStatusConflict(job_id, job.status, "paused: it has no run left")
        now = self.clock.now()
        job = await self.store.update_job(
            owner,
            job_id,
            JobChange("paused", allowed_from=LIVE, status=JobStatus.PAUSED, next_run_at=None),
            now=now,
            audit=audit_entry(who, AuditAction.PAUSED, job_id, owner, now),
        )
        await self._event(job, "paused", who)
        log.info("job %s PAUSED", job_id, extra={"job_id": job_id})
        return job

    async def resume(self, who: Principal, job_id: str) -> Job:
        """Schedule the next occurrence after now (no storm of the runs missed while paused).

        Raises:
            Forbidden: a read-only token.
            JobStatusConflict: the job is not paused.
        """
        who.require_write()
        owner = await self._owner_of(who, job_id)
        job = await self.store.get_job(owner, job_id)
        now = self.clock.now()
        anchor = job.last_scheduled_for or job.created_at  # an interval keeps its phase
        nxt = schedules.next_run_from_now(job.schedule, anchor, now)
        job = await self.store.update_job(
            owner,
            job_id,
            JobChange(
                "resumed",
                allowed_from=frozenset({JobStatus.PAUSED}),
                status=JobStatus.SCHEDULED,
                next_run_at=nxt,
            ),
            now=now,
            audit=audit_entry(who, AuditAction.RESUMED, job_id, owner, now),
        )
        await self._notify(job)
        await self._event(job, "resumed", who)
        log.info("job %s resumed; next run %s", job_id, nxt, extra={"job_id": job_id})
        return job

    async def cancel(self, who: Principal, job_id: str) -> Job:
        """No further run starts; a running run is cancelled cooperatively (ends CANCELLED).

        Raises:
            Forbidden: a read-only token.
            JobStatusConflict: the job is finished or cancelled.
        """
        who.require_write()
        owner = await self._owner_of(who, job_id)
        now = self.clock.now()
        job = await self.store.update_job(
            owner,
            job_id,
            JobChange(
                "cancelled", allowed_from=CHANGEABLE, status=JobStatus.CANCELLED, next_run_at=None
            ),
            now=now,
            audit=audit_entry(who, AuditAction.CANCELLED, job_id, owner, now),
        )
        await self._mark_cancelled(job_id)
        await self._event(job, "cancelled", who)
        log.info("job %s CANCELLED", job_id, extra={"job_id": job_id})
        return job

    async def delete(self, who: Principal, job_id: str) -> None:
        """Cancel the job's runs and delete it with its runs (its audit records stay).

        Raises:
            Forbidden: a read-only token.
        """
        who.require_write()
        owner = await self._owner_of(who, job_id)
        job = await self.store.get_job(owner, job_id)
        await self._mark_cancelled(job_id)
        entry = audit_entry(who, AuditAction.DELETED, job_id, owner, self.clock.now())
        await self.store.delete_job(owner, job_id, audit=entry)
        await self._event(job, "deleted", who)
        log.info("job %s deleted", job_id, extra={"job_id": job_id})

    async def trigger(self, who: Principal, job_id: str) -> Execution:
        """An extra run now, outside the schedule (``trigger: manual``), whatever the policies.
        It counts against the job owner's ``runsPerMinute``.

        It takes the schedulers' dispatch path: recorded by :meth:`JobStore.dispatch` (a
        :class:`ManualDispatch`, which leaves the job's schedule as it is) with its audit
        entry, then its QUEUED event and its run message (:mod:`core.runs`) published as a
        scheduler publishes them. A run whose publish fails stays QUEUED in the store, and the
        schedulers' re-dispatch sweep sends it.

        Raises:
            Forbidden: a read-only token.
            JobStatusConflict: the job is cancelled.
            QuotaExceeded: ``runsPerMinute`` of the job's owner (429, with a retry time).
        """
        who.require_write()
        owner = await self._owner_of(who, job_id)
        job = await self.store.get_job(owner, job_id)
        if job.status == JobStatus.CANCELLED:
            raise JobStatusConflict(job_id, job.status, "triggered")
        now = self.clock.now()
        rate = self.config.quotas.runs
        if rate is not None:
            [wait] = await self.store.take_tokens(
                [TokenRequest(quotas.runs_key(owner), 1, rate)], now=now
            )
            if wait:
                raise quotas.runs_exceeded(self.config.quotas, wait)
        run = manual_run(job, now)
        entry = audit_entry(who, AuditAction.TRIGGERED, job_id, owner, now, execution_id=run.id)
        [outcome] = await self.store.dispatch([ManualDispatch(run, audit=entry)])
        await self._publish_run(run, *dispatched(job, run, outcome, now))
        log.info("job %s triggered: run %s", job_id, run.id, extra={"job_id": job_id})
        return run

    async def patch(self, who: Principal, job_id: str, patch: JobPatch) -> Job:
        """Change the schedule, parameters, options, name or labels; the next run is recomputed
        from now when the schedule changes. ``patch.labels`` is merged into the job's labels
        (RFC 7396: null removes a key, :func:`core.labels.merge_labels`).

        Raises:
            Forbidden: a read-only token.
            InvalidRequest: as :meth:`create`, for the changed fields; labels that would break
                the label rules once merged, naming the key.
            NameTaken: another job of the owner has the new name (409).
            JobStatusConflict: the job is finished or cancelled.
        """
        who.require_write()
        owner = await self._owner_of(who, job_id)
        job = await self.store.get_job(owner, job_id)
        now = self.clock.now()
        spec = self.catalog.get(job.task_id)
        spec.decode_params(job.parameters if patch.parameters is None else patch.parameters)
        if patch.parameters is not None:
            check_parameters(patch.parameters)
        grace = (
            patch.misfire_grace_seconds
            if patch.misfire_grace_seconds is not None
            else job.misfire_grace_seconds
        )
        schedule = job.schedule
        next_run_at: datetime | object | None = UNCHANGED
        if patch.schedule is not None:
            schedule = schedules.normalize(patch.schedule, now, grace_seconds=grace)
            quotas.check_schedule(self.config.quotas, schedule, now)
            if job.status != JobStatus.PAUSED:
                next_run_at = schedules.first_run_at(schedule, now)
        max_attempts = patch.max_attempts or job.max_attempts
        self._check_attempts(max_attempts)
        labels = job.labels if patch.labels is None else merge_labels(job.labels, patch.labels)
        check_labels(labels)
        notify = job.notify
        if patch.notify is not msgspec.UNSET:
            notify = notifications.resolve(patch.notify, current=job.notify)
        new_spec = patched_spec(job.spec, patch, schedule=schedule, labels=labels, notify=notify)
        check_concurrency(new_spec.concurrency_key, patch.max_concurrent, new_spec.parameters)
        job = await self.store.update_job(
            owner,
            job_id,
            JobChange("changed", allowed_from=CHANGEABLE, spec=new_spec, next_run_at=next_run_at),
            now=now,
            audit=audit_entry(who, AuditAction.CHANGED, job_id, owner, now),
        )
        await self._notify(job)
        await self._event(job, "changed", who)
        log.info("job %s changed", job_id, extra={"job_id": job_id})
        return job

    # --- explain -------------------------------------------------------------------------------

    async def explain(self, who: Principal, job_id: str) -> Explanation:
        """Why the job's next run has not started, or why its last expected run did not happen
        (:func:`gateway.explaining.explanation`), read without changing anything.

        Raises:
            Forbidden: no ``jobs:read``.
            JobNotFound: not the caller's job (unless admin), as :meth:`get`.
            StoreUnavailable: the store did not answer (503).
        """
        job = await self.get(who, job_id)
        return await explanation(
            self.store, self.inspector, self.config.quotas, job, self.clock.now()
        )

    # --- fire times ----------------------------------------------------------------------------

    async def upcoming(self, who: Principal, job_id: str, count: int) -> list[datetime]:
        """The job's next ``count`` scheduled times (none while paused, cancelled or finished)."""
        job = await self.get(who, job_id)
        if job.status not in LIVE or job.next_run_at is None:
            return []
        return schedules.upcoming(job.schedule, job.next_run_at, count)

    def preview(
        self,
        expression: str,
        timezone: str,
        after: datetime | None,
        count: int,
        gap: str = "shift",
        fold: str = "once",
    ) -> list[datetime]:
        """The next ``count`` fire times of a cron expression strictly after ``after``.

        Raises:
            InvalidRequest: naming ``expression``, ``timezone``, ``gap`` or ``fold``.
        """
        try:
            sched = msgspec.convert(
                {
                    "type": "cron",
                    "expression": expression,
                    "timezone": timezone,
                    "gap": gap,
                    "fold": fold,
                },
                CronSchedule,
            )
        except msgspec.ValidationError as e:
            raise InvalidRequest(validation_field_error(e)) from None
        try:
            expr = cron.parse_cron(expression)
        except InvalidCron as e:
            raise InvalidCron(e.cron_field, e.reason, path="expression") from None
        try:
            tz = cron.resolve_timezone(timezone)
        except InvalidRequest as e:
            raise InvalidRequest([FieldError("timezone", f.reason) for f in e.errors]) from None
        start = after or self.clock.now()
        return expr.fire_times(start, tz, count, gap=sched.gap, fold=sched.fold)

    # --- helpers -------------------------------------------------------------------------------

    async def _any_job(self, job_id: str) -> Job:
        """The job ``job_id`` of whichever owner (for admins). Raises: JobNotFound."""
        found = await self.store.get_jobs([job_id])
        if not found:
            raise JobNotFound(f"job {job_id} not found")
        return found[0]

    async def _owner_of(self, who: Principal, job_id: str) -> str:
        """Whose job ``job_id`` is, as far as ``who`` may know: the caller's own id (the store
        then answers 404 for another user's job), or for an admin the job's real owner (an
        owner never changes, so the lookup cannot go stale). Raises: JobNotFound."""
        if not who.admin:
            return who.user
        return (await self._any_job(job_id)).owner

    async def _notify(self, job: Job) -> None:
        """Tell the partition's scheduler (best effort: its safety scan finds the job anyway)."""
        if self.bus is None or job.next_run_at is None:
            return
        try:
            await self.bus.notify(
                JobNotice(job_id=job.id, partition=job.partition, next_run_at=job.next_run_at)
            )
        except BusUnavailable as e:
            log.warning("job %s stored; notice not sent (%s); the scan will find it", job.id, e)

    async def _event(self, job: Job, event: JobEventType, who: Principal) -> None:
        if self.bus is None:
            return
        await self.bus.publish_events(
            [
                JobEvent(
                    job_id=job.id,
                    owner=job.owner,
                    partition=job.partition,
                    event=event,
                    status=job.status,
                    at=self.clock.now(),
                    next_run_at=job.next_run_at,
                    actor=who.user,
                )
            ]
        )

    async def _publish_run(
        self, run: Execution, event: StatusEvent | None, message: RunMessage | None
    ) -> None:
        """Publish what :func:`core.runs.dispatched` says, as a scheduler does: the event first
        (QUEUED precedes RUNNING), then the message. A failed publish is logged and left to the
        schedulers' re-dispatch sweep (and to them the re-creation of deleted streams: the
        gateway's NATS user may not create streams, :mod:`bus.auth`)."""
        if self.bus is None:
            return
        if event is not None:
            await self.bus.publish_events([event])
        if message is None:
            return
        [error] = await self.bus.publish_runs([message])
        if error is not None:
            log.warning(
                "run %s stored; publish failed (%s): re-dispatch will send it",
                run.id,
                error,
                extra={"job_id": run.job_id, "execution_id": run.id},
            )

    async def _mark_cancelled(self, job_id: str) -> None:
        if self.markers is not None:
            await self.markers.cancel_job(job_id)
