"""The job API as operations on the domain, shared by the HTTP and NATS interfaces.

Every method takes the caller's identity (``owner``, a token's ``sub``) and raises the project's
errors (:mod:`core.errors`), which each interface maps to its own error format.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import msgspec

from bus.cancel import CancelMarkers
from bus.nats import Bus
from core import cron
from core import schedule as schedules
from core.clock import Clock
from core.dispatch import recorded_event
from core.errors import BusUnavailable, FieldError, InvalidCron, InvalidRequest
from core.ids import new_job_id, partition_of
from core.model import (
    CronSchedule,
    Execution,
    ExecutionStatus,
    Job,
    JobCreate,
    JobEvent,
    JobEventType,
    JobNotice,
    JobPatch,
    JobStatus,
    Page,
    RunMessage,
    RunTrigger,
)
from core.ports import (
    UNCHANGED,
    IdempotencyKeyReused,
    JobChange,
    JobQuery,
    JobSpec,
    JobStatusConflict,
    JobStore,
)
from core.tasks import TaskCatalog, validation_field_error
from core.timeutil import isoformat_z
from core.values import check_parameters, is_text

log = logging.getLogger(__name__)
T = TypeVar("T")

_canonical = msgspec.json.Encoder(order="sorted")
LIVE = frozenset({JobStatus.SCHEDULED, JobStatus.RUNNING})
CHANGEABLE = frozenset({JobStatus.SCHEDULED, JobStatus.RUNNING, JobStatus.PAUSED})
MAX_PREVIEW = 1000


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Settings of the job service.

    Attributes:
        partitions: number of partitions (to assign a new job its partition).
        max_attempts_limit: the work consumers' max deliveries; ``maxAttempts`` may not exceed it.
    """

    partitions: int = 64
    max_attempts_limit: int = 20


class JobService:
    """Create, read, change and control jobs (see module docstring).

    Args:
        store: the job store.
        bus: NATS (None: no notices, no manual triggers — for store-only tests).
        catalog: the tasks a job may name.
        clock: wall clock.
        config: see :class:`ServiceConfig`.
        markers: cancellation markers (None: cancelling does not reach running runs).
    """

    def __init__(
        self,
        store: JobStore,
        bus: Bus | None,
        catalog: TaskCatalog,
        clock: Clock,
        config: ServiceConfig,
        markers: CancelMarkers | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.catalog = catalog
        self.clock = clock
        self.config = config
        self.markers = markers

    # --- create and read -----------------------------------------------------------------------

    async def create(
        self, owner: str, body: JobCreate, *, idempotency_key: str | None = None
    ) -> tuple[Job, bool]:
        """Create a job; ``(job, replayed)``.

        With an ``idempotency_key`` already used by this owner for the same request, the
        original job is returned with ``replayed=True`` (nothing is created).

        Raises:
            InvalidRequest: unknown task, parameters of the wrong shape or outside the stored range
                (:mod:`core.values`), invalid schedule,
                options beyond this deployment's limits, a malformed idempotency key.
            IdempotencyKeyReused: the key was used for a different request (409).
            StoreUnavailable: nothing was stored (503).
        """
        job = self._new_job(owner, body, idempotency_key)
        digest = hashlib.sha256(_canonical.encode(body)).hexdigest() if idempotency_key else None
        try:
            job = await self.store.create_job(job, request_hash=digest)
        except IdempotencyKeyReused as e:
            if e.same_request:
                return e.job, True
            raise
        await self._notify(job)
        await self._event(job, "created")
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
        now = self.clock.now()
        sched = schedules.normalize(body.schedule, now, grace_s=body.misfire_grace_seconds)
        max_attempts = body.max_attempts or spec.max_attempts
        self._check_attempts(max_attempts)
        if idempotency_key is not None:
            if not 1 <= len(idempotency_key) <= 255:
                raise InvalidRequest(FieldError("Idempotency-Key", "must be 1 to 255 characters"))
            if not is_text(idempotency_key):  # aiohttp keeps bytes that are not UTF-8 as surrogates
                raise InvalidRequest(FieldError("Idempotency-Key", "must be UTF-8 text"))
        job_id = new_job_id()
        return Job(
            id=job_id,
            owner=owner,
            task_id=body.task_id,
            schedule=sched,
            parameters=body.parameters,
            queue=body.queue,
            max_attempts=max_attempts,
            timeout_seconds=float(body.timeout_seconds or spec.timeout_seconds),
            misfire_policy=body.misfire_policy,
            misfire_grace_seconds=body.misfire_grace_seconds,
            max_catch_up=body.max_catch_up,
            overlap_policy=body.overlap_policy,
            history_limit=body.history_limit,
            history_max_age_seconds=body.history_max_age_seconds,
            status=JobStatus.SCHEDULED,
            partition=partition_of(job_id, self.config.partitions),
            created_at=now,
            updated_at=now,
            next_run_at=schedules.first_run_at(sched, now),
            idempotency_key=idempotency_key,
        )

    def _check_attempts(self, max_attempts: int) -> None:
        if max_attempts > self.config.max_attempts_limit:
            raise InvalidRequest(
                FieldError("maxAttempts", f"must be at most {self.config.max_attempts_limit} here")
            )

    async def get(self, owner: str, job_id: str) -> Job:
        return await self.store.get_job(owner, job_id)

    async def list_jobs(
        self, owner: str, query: JobQuery, *, limit: int, cursor: str | None
    ) -> Page[Job]:
        return await self.store.list_jobs(owner, query, limit=limit, cursor=cursor)

    async def list_executions(
        self, owner: str, job_id: str, *, limit: int, cursor: str | None
    ) -> Page[Execution]:
        return await self.store.list_executions(owner, job_id, limit=limit, cursor=cursor)

    # --- control -------------------------------------------------------------------------------

    async def pause(self, owner: str, job_id: str) -> Job:
        """No run starts until :meth:`resume`; a run in progress continues.

        Raises:
            JobStatusConflict: the job is not waiting for a run (finished, cancelled, paused).
        """
        job = await self.store.get_job(owner, job_id)
        if job.next_run_at is None and not job.recurring:
            raise JobStatusConflict(job_id, job.status, "paused: it has no run left")
        job = await self.store.update_job(
            owner,
            job_id,
            JobChange("paused", allowed_from=LIVE, status=JobStatus.PAUSED, next_run_at=None),
            now=self.clock.now(),
        )
        await self._event(job, "paused")
        log.info("job %s PAUSED", job_id, extra={"job_id": job_id})
        return job

    async def resume(self, owner: str, job_id: str) -> Job:
        """Schedule the next occurrence after now (no storm of the runs missed while paused)."""
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
        )
        await self._notify(job)
        await self._event(job, "resumed")
        log.info("job %s resumed; next run %s", job_id, nxt, extra={"job_id": job_id})
        return job

    async def cancel(self, owner: str, job_id: str) -> Job:
        """No further run starts; a running run is cancelled cooperatively (ends CANCELLED)."""
        job = await self.store.update_job(
            owner,
            job_id,
            JobChange(
                "cancelled", allowed_from=CHANGEABLE, status=JobStatus.CANCELLED, next_run_at=None
            ),
            now=self.clock.now(),
        )
        await self._mark_cancelled(job_id)
        await self._event(job, "cancelled")
        log.info("job %s CANCELLED", job_id, extra={"job_id": job_id})
        return job

    async def delete(self, owner: str, job_id: str) -> None:
        """Cancel the job's runs and delete it with its history."""
        job = await self.store.get_job(owner, job_id)
        await self._mark_cancelled(job_id)
        await self.store.delete_job(owner, job_id)
        await self._event(job, "deleted")
        log.info("job %s deleted", job_id, extra={"job_id": job_id})

    async def trigger(self, owner: str, job_id: str) -> Execution:
        """An extra run now, outside the schedule (``trigger: manual``), whatever the policies.

        Raises:
            JobStatusConflict: the job is cancelled.
        """
        job = await self.store.get_job(owner, job_id)
        if job.status == JobStatus.CANCELLED:
            raise JobStatusConflict(job_id, job.status, "triggered")
        now = self.clock.now()
        run = Execution(
            id=f"{job.id}:{isoformat_z(now)}!manual-{secrets.token_hex(4)}",
            job_id=job.id,
            owner=owner,
            task_id=job.task_id,
            queue=job.queue,
            partition=job.partition,
            status=ExecutionStatus.QUEUED,
            max_attempts=job.max_attempts,
            scheduled_for=now,
            created_at=now,
            updated_at=now,
            trigger=RunTrigger.MANUAL,
            dispatched_by="gateway",
        )
        await self.store.insert_execution(run)
        if self.bus is not None:
            await self.bus.publish_events([recorded_event(run)])
            message = RunMessage(
                execution_id=run.id,
                job_id=job.id,
                owner=owner,
                partition=job.partition,
                task_id=job.task_id,
                queue=job.queue,
                parameters=job.parameters,
                scheduled_for=now,
                published_at=now,
                max_attempts=job.max_attempts,
                timeout_seconds=job.timeout_seconds,
                trigger=RunTrigger.MANUAL,
            )
            [error] = await self.bus.publish_runs([message])
            if error is not None:
                log.warning(
                    "run %s stored; publish failed (%s): re-dispatch will send it", run.id, error
                )
        log.info("job %s triggered: run %s", job_id, run.id, extra={"job_id": job_id})
        return run

    async def patch(self, owner: str, job_id: str, patch: JobPatch) -> Job:
        """Change the schedule, parameters or options; the next run is recomputed from now when
        the schedule changes.

        Raises:
            InvalidRequest: as :meth:`create`, for the changed fields.
            JobStatusConflict: the job is finished or cancelled.
        """
        job = await self.store.get_job(owner, job_id)
        now = self.clock.now()
        spec = self.catalog.get(job.task_id)
        parameters = job.parameters if patch.parameters is None else patch.parameters
        spec.decode_params(parameters)
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
            schedule = schedules.normalize(patch.schedule, now, grace_s=grace)
            if job.status != JobStatus.PAUSED:
                next_run_at = schedules.first_run_at(schedule, now)
        max_attempts = patch.max_attempts or job.max_attempts
        self._check_attempts(max_attempts)
        new_spec = JobSpec(
            task_id=job.task_id,
            schedule=schedule,
            parameters=parameters,
            queue=patch.queue or job.queue,
            max_attempts=max_attempts,
            timeout_seconds=patch.timeout_seconds or job.timeout_seconds,
            misfire_policy=patch.misfire_policy or job.misfire_policy,
            misfire_grace_seconds=grace,
            max_catch_up=patch.max_catch_up or job.max_catch_up,
            overlap_policy=patch.overlap_policy or job.overlap_policy,
            history_limit=_patched(patch.history_limit, job.history_limit),
            history_max_age_seconds=_patched(
                patch.history_max_age_seconds, job.history_max_age_seconds
            ),
        )
        job = await self.store.update_job(
            owner,
            job_id,
            JobChange("changed", allowed_from=CHANGEABLE, spec=new_spec, next_run_at=next_run_at),
            now=now,
        )
        await self._notify(job)
        await self._event(job, "changed")
        log.info("job %s changed", job_id, extra={"job_id": job_id})
        return job

    # --- fire times ----------------------------------------------------------------------------

    async def upcoming(self, owner: str, job_id: str, count: int) -> list[datetime]:
        """The job's next ``count`` scheduled times (none while paused, cancelled or finished)."""
        job = await self.store.get_job(owner, job_id)
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

    async def _event(self, job: Job, event: JobEventType) -> None:
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
                )
            ]
        )

    async def _mark_cancelled(self, job_id: str) -> None:
        if self.markers is not None:
            await self.markers.cancel_job(job_id)


def _patched(value: T | msgspec.UnsetType | None, current: T | None) -> T | None:
    """A nullable PATCH field: absent keeps ``current``, null clears it."""
    return current if isinstance(value, msgspec.UnsetType) else value
