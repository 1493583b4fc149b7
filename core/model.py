"""The one schema: msgspec Structs for HTTP bodies, NATS messages and stored documents.

Field names are snake_case in Python and camelCase on the wire and in stored documents
(``rename="camel"``). Every instant is an aware UTC datetime truncated to milliseconds.

Policy (from STYLE.md): structs are frozen and keyword-only and omit defaults when encoded.
Only HTTP request bodies (the ``*In`` types) forbid unknown fields; NATS messages and stored
documents tolerate them so that a rolling upgrade can add fields. A new field always gets a
default, and a field never changes meaning.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar, final

import msgspec

from core.concurrency import MAX_CONCURRENT_LIMIT, MAX_TEMPLATE_CHARS, ConcurrencyPolicy
from core.ids import run_msg_id
from core.labels import JOB_NAME_PATTERN
from core.notify_spec import NotifyIn, NotifyTarget

T = TypeVar("T")


Instant = Annotated[datetime, msgspec.Meta(extra_json_schema={"format": "date-time"})]
"""An instant: aware UTC, RFC 3339 on the wire (``"2026-12-02T08:00:00Z"``); JSON Schema
``{"type": "string", "format": "date-time"}``, so generated clients get a datetime type."""


class Model(msgspec.Struct, kw_only=True, frozen=True, omit_defaults=True, rename="camel"):
    """Base of every schema type.

    Messages omit fields at their defaults (compact on the wire); resources returned by the API
    and stored as documents (jobs, executions, schedules) set ``omit_defaults=False`` so every
    field is always present, ``null`` included: clients and dashboards see one fixed shape.
    """


class JobStatus(enum.StrEnum):
    """Status of a job, as users see it.

    A one-time job (``immediate`` / ``once``) moves SCHEDULED → RUNNING → SUCCEEDED | FAILED and
    stays there; SKIPPED: it ended without running (its only run was skipped, e.g. misfired).
    A recurring job (``cron`` / ``interval``) is SCHEDULED while it waits for its next run and
    RUNNING while a run is in progress; the outcome of its latest finished run is in
    ``lastRunStatus``. A recurring job becomes SUCCEEDED, FAILED or SKIPPED (its last run's
    outcome) only when its schedule is exhausted (``endAt`` passed). PAUSED: no run starts
    until it is resumed. CANCELLED: no further run starts, ever.
    """

    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    PAUSED = "PAUSED"
    CANCELLED = "CANCELLED"


class ExecutionStatus(enum.StrEnum):
    """Status of one run: QUEUED → RUNNING → SUCCEEDED | FAILED | CANCELLED, with RETRYING between
    attempts. SKIPPED: an occurrence that did not run (overlap, misfire), with the reason."""

    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    RETRYING = "RETRYING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    CANCELLED = "CANCELLED"


TERMINAL_EXECUTION_STATUSES = frozenset(
    {
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
        ExecutionStatus.SKIPPED,
        ExecutionStatus.CANCELLED,
    }
)
ACTIVE_EXECUTION_STATUSES = frozenset(
    {ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, ExecutionStatus.RETRYING}
)
ENDED_JOB_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.SKIPPED})
"""Statuses of a job whose runs ended it (its last run's outcome, no next run)."""
FINISHED_JOB_STATUSES = ENDED_JOB_STATUSES | {JobStatus.CANCELLED}


class MisfirePolicy(enum.StrEnum):
    """What to do with occurrences that came due while the job could not be dispatched."""

    RUN_ONCE = "runOnce"
    SKIP = "skip"
    RUN_ALL = "runAll"


class OverlapPolicy(enum.StrEnum):
    """What to do when a recurring job's next run is due while its previous one still runs."""

    ALLOW = "allow"
    FORBID = "forbid"
    BUFFER_ONE = "bufferOne"
    REPLACE = "replace"


class RunTrigger(enum.StrEnum):
    """Why a run exists: its schedule, a misfire catch-up, or a user's trigger."""

    SCHEDULE = "schedule"
    CATCH_UP = "catchUp"
    MANUAL = "manual"


TERMINAL_RANK = 1_000_000


def state_rank(status: ExecutionStatus, attempt: int) -> int:
    """Order of an execution's states, so that a late or duplicate event never moves a run back.

    QUEUED < RUNNING(1) < RETRYING(1) < RUNNING(2) < … < any terminal state. A status update is
    applied only when its rank is higher than the stored one.
    """
    match status:
        case ExecutionStatus.QUEUED:
            return 0
        case ExecutionStatus.RUNNING:
            return 2 * attempt
        case ExecutionStatus.RETRYING:
            return 2 * attempt + 1
        case _:
            return TERMINAL_RANK


# --- schedules ---------------------------------------------------------------------------------

EverySeconds = Annotated[
    float,
    msgspec.Meta(
        ge=0.001, le=366 * 86400, description="seconds (run times are whole milliseconds)"
    ),
]


class ImmediateSchedule(
    Model, tag="immediate", tag_field="type", kw_only=True, omit_defaults=False, frozen=True
):
    """Run once, as soon as possible."""


class OnceSchedule(
    Model, tag="once", tag_field="type", kw_only=True, omit_defaults=False, frozen=True
):
    """Run once at ``execute_at`` (RFC 3339 with an offset; stored in UTC)."""

    execute_at: Instant


JitterSeconds = Annotated[float, msgspec.Meta(ge=0, le=3600, description="seconds")]


class CronSchedule(
    Model, tag="cron", tag_field="type", kw_only=True, omit_defaults=False, frozen=True
):
    """Run at the fire times of a cron expression evaluated in an IANA time zone.

    ``gap``: a fixed-time occurrence in a spring-forward gap runs at the first instant after the
    gap (``shift``) or not that day (``skip``). ``fold``: one in the repeated fall-back hour runs
    on its first pass (``once``) or on both (``both``). Runs happen only within
    ``[start_at, end_at]``; each is delayed by a random ``0..jitter_seconds`` (recorded on it).
    """

    expression: str
    timezone: str = "UTC"
    gap: Literal["shift", "skip"] = "shift"
    fold: Literal["once", "both"] = "once"
    start_at: Instant | None = None
    end_at: Instant | None = None
    jitter_seconds: JitterSeconds = 0.0


class IntervalSchedule(
    Model, tag="interval", tag_field="type", kw_only=True, omit_defaults=False, frozen=True
):
    """Run every ``every_seconds``: first at ``start_at`` (default: one interval after creation),
    then every interval after the previous *scheduled* time, until ``end_at``; each run delayed by
    a random ``0..jitter_seconds``."""

    every_seconds: EverySeconds
    start_at: Instant | None = None
    end_at: Instant | None = None
    jitter_seconds: JitterSeconds = 0.0


Schedule = ImmediateSchedule | OnceSchedule | CronSchedule | IntervalSchedule
RECURRING_SCHEDULES = (CronSchedule, IntervalSchedule)


# Request variants: the same fields, but unknown fields are an error (external input only).
class ImmediateScheduleIn(
    ImmediateSchedule, tag="immediate", forbid_unknown_fields=True, frozen=True
):
    pass


class OnceScheduleIn(OnceSchedule, tag="once", forbid_unknown_fields=True, frozen=True):
    pass


class CronScheduleIn(CronSchedule, tag="cron", forbid_unknown_fields=True, frozen=True):
    pass


class IntervalScheduleIn(IntervalSchedule, tag="interval", forbid_unknown_fields=True, frozen=True):
    pass


ScheduleIn = ImmediateScheduleIn | OnceScheduleIn | CronScheduleIn | IntervalScheduleIn

# --- jobs --------------------------------------------------------------------------------------

QueueName = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]{0,31}$")]
TaskId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
MAX_ATTEMPTS = 20
"""The most attempts a run may have (``maxAttempts``); also how many an execution records."""
MaxAttempts = Annotated[int, msgspec.Meta(ge=1, le=MAX_ATTEMPTS)]
TimeoutSeconds = Annotated[float, msgspec.Meta(gt=0, le=7 * 86400, description="seconds")]


GraceSeconds = Annotated[float, msgspec.Meta(ge=0, le=7 * 86400, description="seconds")]
MaxCatchUp = Annotated[int, msgspec.Meta(ge=1, le=1000)]
HistoryLimit = Annotated[
    int, msgspec.Meta(ge=1, le=100_000, description="finished runs kept (the latest ones)")
]
HistoryMaxAgeSeconds = Annotated[
    float,
    msgspec.Meta(
        ge=60, le=10 * 366 * 86400, description="seconds a finished run is kept after it ended"
    ),
]
ConcurrencyKey = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_TEMPLATE_CHARS,
        description="template over the parameters: literal text and {name} placeholders",
    ),
]
MaxConcurrent = Annotated[
    int, msgspec.Meta(ge=1, le=MAX_CONCURRENT_LIMIT, description="runs with the key at once")
]


JobName = Annotated[
    str,
    msgspec.Meta(
        pattern=JOB_NAME_PATTERN,
        description="unique among the owner's jobs; letters, digits, '.', '_', '-'",
    ),
]
LabelMap = Annotated[
    dict[str, str],
    msgspec.Meta(
        description="label key -> value, Kubernetes syntax ([prefix/]name, values of at most "
        "63 characters), at most 64 labels",
    ),
]

LabelPatch = Annotated[
    dict[str, str | None],
    msgspec.Meta(
        description="a JSON merge patch (RFC 7396) of the labels: a string sets the key, null "
        "removes it, keys not named are kept",
    ),
]


class JobCreate(Model, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Body of ``POST /jobs``.

    ``max_attempts`` and ``timeout_seconds`` default to the task's defaults; ``queue`` names the
    work queue (one JetStream subject and one durable consumer per queue). The policies are
    described in the README's "Scheduling rules".
    """

    task_id: TaskId
    schedule: ScheduleIn = msgspec.field(default_factory=ImmediateScheduleIn)
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    max_attempts: MaxAttempts | None = None
    timeout_seconds: TimeoutSeconds | None = None
    queue: QueueName = "default"
    misfire_policy: MisfirePolicy = MisfirePolicy.RUN_ONCE
    misfire_grace_seconds: GraceSeconds = 60.0
    max_catch_up: MaxCatchUp = 10
    overlap_policy: OverlapPolicy = OverlapPolicy.FORBID
    history_limit: HistoryLimit | None = None
    history_max_age_seconds: HistoryMaxAgeSeconds | None = None
    name: JobName | None = None
    labels: LabelMap = msgspec.field(default_factory=dict)
    notify: NotifyIn | None = None
    concurrency_key: ConcurrencyKey | None = None
    max_concurrent: MaxConcurrent | None = None
    concurrency_policy: ConcurrencyPolicy | None = None
    """None: the task's default limit's, else ``queue`` (``TaskSpec.job_concurrency``)."""


class JobPatch(Model, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Body of ``PATCH /jobs/{id}``: the fields to change (absent = unchanged).

    ``history_limit`` and ``history_max_age_seconds`` may be null: back to the deployment's
    default. ``name`` null removes the job's name. ``labels`` is a JSON merge patch (RFC 7396)
    of the job's labels: a key with a string value is set, a key with null removed, the keys it
    does not name are kept (:func:`core.labels.merge_labels`). ``notify`` null removes the
    job's webhook; a ``notify`` without ``secret`` keeps the current secret.
    """

    schedule: ScheduleIn | None = None
    parameters: dict[str, Any] | None = None
    max_attempts: MaxAttempts | None = None
    timeout_seconds: TimeoutSeconds | None = None
    queue: QueueName | None = None
    misfire_policy: MisfirePolicy | None = None
    misfire_grace_seconds: GraceSeconds | None = None
    max_catch_up: MaxCatchUp | None = None
    overlap_policy: OverlapPolicy | None = None
    history_limit: HistoryLimit | msgspec.UnsetType | None = msgspec.UNSET
    history_max_age_seconds: HistoryMaxAgeSeconds | msgspec.UnsetType | None = msgspec.UNSET
    name: JobName | msgspec.UnsetType | None = msgspec.UNSET
    labels: LabelPatch | None = None
    notify: NotifyIn | msgspec.UnsetType | None = msgspec.UNSET
    concurrency_key: ConcurrencyKey | msgspec.UnsetType | None = msgspec.UNSET
    max_concurrent: MaxConcurrent | None = None
    concurrency_policy: ConcurrencyPolicy | None = None


class JobSpec(Model, kw_only=True, frozen=True):
    """What a job does and when: the part users set (create, PATCH), the one list of a job's
    options. :class:`Job` extends it (the same fields, flat in its JSON and stored document);
    the SQLite store keeps it as one JSON column, a change (:class:`core.ports.JobChange`) sets
    it whole.

    ``history_limit`` / ``history_max_age_seconds``: the job's retention of finished runs
    (None: the deployment's default; see :mod:`core.history`).

    ``name``: optional, unique among its owner's jobs (:data:`core.labels.JOB_NAME_PATTERN`);
    ``labels``: string keys and values with Kubernetes' syntax, at most 64
    (:mod:`core.labels`), for ``GET /jobs?labels=<selector>``. ``notify``: the webhook told
    about finished runs (None: the owner's default, if any; see :mod:`core.notifications`).
    ``concurrency_key`` (a template
    over ``parameters``; None: no limit), ``max_concurrent`` and ``concurrency_policy``: the
    job's concurrency limit (:mod:`core.concurrency`).
    """

    task_id: str
    schedule: Schedule
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    queue: str = "default"
    max_attempts: int = 3
    timeout_seconds: float = 300.0
    misfire_policy: MisfirePolicy = MisfirePolicy.RUN_ONCE
    misfire_grace_seconds: float = 60.0
    max_catch_up: int = 10
    overlap_policy: OverlapPolicy = OverlapPolicy.FORBID
    history_limit: int | None = None
    history_max_age_seconds: float | None = None
    name: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    notify: NotifyTarget | None = None
    concurrency_key: str | None = None
    max_concurrent: int = 1
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.QUEUE


SPEC_FIELDS = JobSpec.__struct_fields__
"""The names of a job's options (:class:`JobSpec`), in order."""
assert set(JobCreate.__struct_fields__) == set(SPEC_FIELDS), "POST /jobs sets every option"
assert set(JobPatch.__struct_fields__) <= set(SPEC_FIELDS), "PATCH sets options only"


class Job(JobSpec, kw_only=True, omit_defaults=False, frozen=True):
    """A configured use of a task: its :class:`JobSpec` and its state. Stored in ``jobs``;
    returned by the API.

    ``next_run_at`` is the scheduled time of the next run (None when no run is left);
    ``last_run_at`` is when the latest run started; ``last_dispatched_for`` the scheduled time of
    the latest run sent to the workers (the one an overlap policy looks at);
    ``last_scheduled_for`` the scheduled time of the latest dispatched run.
    """

    id: str
    owner: str
    status: JobStatus = JobStatus.SCHEDULED
    partition: int = 0
    created_at: Instant
    updated_at: Instant
    next_run_at: Instant | None = None
    last_run_at: Instant | None = None
    last_run_status: ExecutionStatus | None = None
    last_error: str | None = None
    last_execution_id: str | None = None
    last_scheduled_for: Instant | None = None
    last_dispatched_for: Instant | None = None
    run_count: int = 0
    idempotency_key: str | None = None

    @property
    def recurring(self) -> bool:
        return isinstance(self.schedule, RECURRING_SCHEDULES)

    @property
    def spec(self) -> JobSpec:
        """The job's options alone."""
        return JobSpec(**spec_values(self))


def spec_values(spec: JobSpec) -> dict[str, Any]:
    """The options of ``spec`` (or of a :class:`Job`) by field name: to build or replace a job
    with (``Job(**spec_values(spec), ...)``, ``msgspec.structs.replace(job, **...)``)."""
    return {name: getattr(spec, name) for name in SPEC_FIELDS}


def requested_spec(body: JobCreate, **resolved: Any) -> JobSpec:
    """The options a ``POST /jobs`` body asks for, with the values the gateway ``resolved``
    (the normalized schedule, the task's defaults for what the body leaves out)."""
    return JobSpec(**{**{name: getattr(body, name) for name in SPEC_FIELDS}, **resolved})


def patched_spec(spec: JobSpec, patch: JobPatch, **resolved: Any) -> JobSpec:
    """``spec`` with the fields a ``PATCH`` body sets, and the values the gateway ``resolved``.

    A field the body leaves out is at its default (None, or UNSET for the nullable ones, where
    null means "back to the deployment's default") and leaves the option as it is.
    """
    changes = {
        f.name: value
        for f in msgspec.structs.fields(patch)
        if (value := getattr(patch, f.name)) is not f.default
    }
    return JobSpec(**{**spec_values(spec), **changes, **resolved})


class Missed(Model, kw_only=True, omit_defaults=False, frozen=True):
    """Occurrences that did not run, recorded on a SKIPPED execution.

    Attributes:
        count: how many occurrences (exact; see README for the bound).
        first / last: the earliest and latest of them (aware UTC).
        policy: the misfire or overlap policy that applied.
    """

    count: int
    first: Instant | None = None
    last: Instant | None = None
    policy: str


class Attempt(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One attempt of a run, recorded from that attempt's status events (``attempts`` of an
    execution; see :func:`core.history.record_attempts` for how events are merged).

    Attributes:
        attempt: its number (1-based), as the run's ``attempt`` was while it ran.
        started_at: when its task started (aware UTC); None if it never started (cancelled or
            given up before it ran).
        worker_id: the worker that started it; for an attempt that never started, the worker
            that reported its outcome.
        finished_at: when it ended (aware UTC); None while it runs, and for an attempt lost with
            its worker.
        outcome: how it ended: RETRYING (it failed and another attempt follows), SUCCEEDED,
            FAILED (it failed with no attempt left, or the run was given up), CANCELLED; None
            while it runs, and for an attempt lost with its worker.
        error: its error (at most 500 characters; the execution's ``error`` keeps 2000).
        redelivered: it started because the previous attempt was lost — its worker died or
            stopped renewing the message, so JetStream redelivered it after the ack wait, or the
            store re-dispatched the run — rather than after a reported failure (RETRYING).
    """

    attempt: int
    started_at: Instant | None = None
    worker_id: str | None = None
    finished_at: Instant | None = None
    outcome: ExecutionStatus | None = None
    error: str | None = None
    redelivered: bool = False


class Execution(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One run of a job (one scheduled occurrence), through every attempt. Stored in ``executions``.

    ``id`` is deterministic, ``"<jobId>:<scheduledFor as RFC 3339 UTC with ms>"``, so a duplicate
    dispatch of the same occurrence can never create a second record; it is also the run's
    JetStream ``Nats-Msg-Id`` and the idempotency key the task receives.

    ``started_at`` is the run's *first* start, kept through retries and redeliveries (so
    ``started_at - scheduled_for`` is the delay users saw); ``worker_id`` the worker that last
    reported; ``attempts`` every attempt with its own start, worker and outcome, oldest first
    (at most :data:`MAX_ATTEMPTS`).

    ``replay_of`` is the id of the run this one replays (``POST …/executions/{id}/replay``,
    :mod:`core.bulk`); ``backfill`` marks a run created by ``POST /jobs/{id}/backfill`` for a
    past occurrence (:mod:`core.backfill`). Both are set once, when the run is recorded.
    """

    id: str
    job_id: str
    owner: str
    task_id: str
    queue: str = "default"
    partition: int = 0
    status: ExecutionStatus = ExecutionStatus.QUEUED
    state_rank: int = 0
    attempt: int = 0
    max_attempts: int = 3
    scheduled_for: Instant
    created_at: Instant
    updated_at: Instant
    published_at: Instant | None = None
    started_at: Instant | None = None
    finished_at: Instant | None = None
    next_attempt_at: Instant | None = None
    worker_id: str | None = None
    error: str | None = None
    result: Any = None
    dispatched_by: str | None = None
    trigger: RunTrigger = RunTrigger.SCHEDULE
    jitter_ms: int = 0
    skip_reason: str | None = None
    missed: Missed | None = None
    attempts: list[Attempt] = msgspec.field(default_factory=list)
    replay_of: str | None = None
    backfill: bool = False


class Page(Model, Generic[T], kw_only=True, omit_defaults=False, frozen=True):
    """A page of a listing, newest first; pass ``next_cursor`` back as ``cursor`` (None: end)."""

    items: list[T]
    next_cursor: str | None = None


class DeadLetter(Model, kw_only=True, omit_defaults=False, frozen=True):
    """A message that can never be recorded, set aside with the reason so that the messages
    behind it are (the poison-message rule). Stored in ``dead_letters``; see docs/data-model.md.

    Attributes:
        id: ``<stream>:<stream sequence>:<stored at, ms>`` of the message: a redelivery of the
            same message is stored once, a re-created stream's new message 5 is another one.
        source: the consumer that set it aside (``recorder``).
        reason: ``undecodable`` (not a message of the schema) or ``rejected`` (the store
            refuses the write for good, :class:`core.errors.StoreRejected`).
        error: what exactly, for an operator.
        subject: the message's subject.
        data: the message as received (its first :data:`DEAD_LETTER_MAX_BYTES` bytes).
        size: the message's full size (bytes).
        at: when it was set aside (aware UTC).
        execution_id / job_id / owner: the run it is about, when the message could be decoded.
    """

    id: str
    source: str
    reason: Literal["undecodable", "rejected"]
    error: str
    subject: str = ""
    data: bytes = b""
    size: int = 0
    at: Instant
    execution_id: str | None = None
    job_id: str | None = None
    owner: str | None = None


DEAD_LETTER_MAX_BYTES = 1024 * 1024
"""Most bytes of a message a dead letter keeps (NATS's default largest payload)."""


# --- NATS messages -----------------------------------------------------------------------------


class RunMessage(Model, kw_only=True, frozen=True):
    """A due run, published to the work stream subject of its queue.

    Headers: ``Nats-Msg-Id`` = :attr:`msg_id` (JetStream de-duplication within the stream's
    duplicate window). ``attempt_offset`` is the number of attempts already spent before this
    message was published (non-zero when the store re-dispatches a run whose message was lost);
    ``redispatched_at_ms`` is non-zero for such a re-dispatch: when it happened, milliseconds
    since the epoch (``redispatch`` on the wire). ``concurrency_key`` is the job's rendered
    concurrency key (None: no limit), with its ``max_concurrent`` and ``concurrency_policy``
    (:mod:`core.concurrency`).
    """

    execution_id: str
    job_id: str
    owner: str
    partition: int
    task_id: str
    queue: str
    parameters: dict[str, Any] = msgspec.field(default_factory=dict)
    scheduled_for: Instant
    published_at: Instant
    max_attempts: int = 3
    timeout_seconds: float = 300.0
    attempt_offset: int = 0
    redispatched_at_ms: int = msgspec.field(default=0, name="redispatch")
    trigger: RunTrigger = RunTrigger.SCHEDULE
    concurrency_key: str | None = None
    max_concurrent: int = 1
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.QUEUE

    @property
    def msg_id(self) -> str:
        """``Nats-Msg-Id``: :func:`core.ids.run_msg_id` of this run."""
        return run_msg_id(self.execution_id, self.redispatched_at_ms)


class StatusEvent(Model, kw_only=True, frozen=True, tag="run", tag_field="kind"):
    """A transition of one execution (``kind: "run"``), published by the actor that caused it.

    Subject ``<prefix>.status.<owner-key>.<job-id>`` of the status stream; recorded into the store
    by the recorder; the stream sequence is the event id that live clients resume from.
    """

    execution_id: str
    job_id: str
    owner: str
    partition: int
    task_id: str
    status: ExecutionStatus
    attempt: int = 0
    at: Instant
    scheduled_for: Instant
    queue: str = "default"
    max_attempts: int = 3
    published_at: Instant | None = None
    started_at: Instant | None = None
    finished_at: Instant | None = None
    next_attempt_at: Instant | None = None
    worker_id: str | None = None
    error: str | None = None
    result: Any = None

    @property
    def rank(self) -> int:
        return state_rank(self.status, self.attempt)


JobEventType = Literal["created", "changed", "paused", "resumed", "cancelled", "deleted"]


@final
class JobEvent(Model, kw_only=True, frozen=True, tag="job", tag_field="kind"):
    """A change of a job itself (``kind: "job"``), published by the gateway after the store
    accepted it, on the same subject and stream as the job's run events (for live clients; the
    store already holds the change). ``actor`` is the user who made it (an admin acting on
    another user's job differs from ``owner``).

    Final (a variant of the tagged union :data:`Event`, never subclassed): ``type(e) is JobEvent``
    tells the variants apart as ``isinstance`` does, and costs less on a msgspec Struct."""

    job_id: str
    owner: str
    partition: int
    event: JobEventType
    status: JobStatus
    at: Instant
    next_run_at: Instant | None = None
    actor: str | None = None


Event = StatusEvent | JobEvent
"""Everything on the status stream."""


class RunsFinished(Model, kw_only=True, frozen=True):
    """Core-NATS notice from a recorder: runs of these jobs reached a terminal status."""

    job_ids: list[str]


class JobNotice(Model, kw_only=True, frozen=True):
    """Core-NATS notice from a gateway to a partition's owner: a job was created or changed."""

    job_id: str
    partition: int
    next_run_at: Instant | None = None


# --- errors on the wire ------------------------------------------------------------------------


class ProblemField(Model, kw_only=True, frozen=True):
    field: str
    reason: str


class ProblemLimit(Model, kw_only=True, frozen=True):
    """The quota a 429 ``quota_exceeded`` problem is about: its name (``activeJobs``,
    ``createsPerSecond``, ``runsPerMinute``) and value (jobs, per second, per minute)."""

    name: str
    value: float


class Problem(Model, kw_only=True, frozen=True):
    """RFC 9457 problem details (``application/problem+json``), with jobsched extensions
    ``code`` (stable error code), ``requestId``, ``errors`` (one entry per invalid field),
    ``limit`` (the quota of a ``quota_exceeded`` problem) and ``replayId`` (the existing replay
    of an ``already_replayed`` problem)."""

    type: str
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    code: str
    request_id: str | None = None
    errors: list[ProblemField] | None = None
    limit: ProblemLimit | None = None
    replay_id: str | None = None
    """An ``already_replayed`` problem's existing replay (the run's latest)."""


class Health(Model, kw_only=True, frozen=True):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = msgspec.field(default_factory=dict)
