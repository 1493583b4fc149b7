"""The project's error hierarchy.

Every error a caller can act on derives from :class:`JobschedError` and carries a
stable ``code`` (snake_case), which the gateway puts into RFC 9457 problem bodies
and the NATS service into error replies. Messages are written for the caller:
they name the field and the reason, never a stack trace or a driver's ``repr``.
"""

from __future__ import annotations

from dataclasses import dataclass


class JobschedError(Exception):
    """Base class of every error jobsched raises on purpose.

    Attributes:
        code: stable machine-readable code, e.g. ``"job_not_found"``.
        status: the HTTP status the gateway answers with.
    """

    code = "internal_error"
    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class FieldError:
    """One invalid field of a request.

    Attributes:
        field: dotted path of the field in the request body, e.g. ``"schedule.expression"``.
        reason: what is wrong with it, for a human.
    """

    field: str
    reason: str


class InvalidRequest(JobschedError, ValueError):
    """The request is well-formed JSON but breaks a rule (HTTP 422)."""

    code = "validation_error"
    status = 422

    def __init__(self, errors: list[FieldError] | FieldError) -> None:
        self.errors = [errors] if isinstance(errors, FieldError) else list(errors)
        super().__init__("; ".join(f"{e.field}: {e.reason}" for e in self.errors))


class InvalidCron(InvalidRequest):
    """A cron expression cannot be used (HTTP 422).

    Attributes:
        cron_field: which cron field is wrong (``"minute"``, ``"day-of-week"``, ``"expression"``…).
        reason: why, for a human.
    """

    code = "invalid_cron"

    def __init__(self, cron_field: str, reason: str, *, path: str = "schedule.expression") -> None:
        self.cron_field = cron_field
        self.reason = reason
        where = reason if cron_field == "expression" else f"{cron_field} field: {reason}"
        super().__init__(FieldError(path, where))


class MalformedRequest(JobschedError, ValueError):
    """The request body is not valid JSON (HTTP 400)."""

    code = "malformed_json"
    status = 400


class UnsupportedMediaType(JobschedError):
    """The request body is not of a media type the operation takes (HTTP 415, RFC 9110
    §15.5.16): JSON bodies must say ``Content-Type: application/json``."""

    code = "unsupported_media_type"
    status = 415


class Unauthorized(JobschedError):
    """The bearer token is missing, malformed, expired or signed with another key (HTTP 401)."""

    code = "unauthorized"
    status = 401


class Forbidden(JobschedError, PermissionError):
    """The token is valid but does not allow this action (HTTP 403): a read-only token that
    tries a change, a user who asks for another user's jobs or audit records."""

    code = "forbidden"
    status = 403


class NotFound(JobschedError, LookupError):
    """The resource does not exist or belongs to another user (HTTP 404)."""

    code = "not_found"
    status = 404


class JobNotFound(NotFound):
    code = "job_not_found"


class ExecutionNotFound(NotFound):
    code = "execution_not_found"


class Conflict(JobschedError):
    """The request conflicts with the current state (HTTP 409)."""

    code = "conflict"
    status = 409


class QuotaExceeded(JobschedError):
    """A per-user quota does not allow the request now (HTTP 429, RFC 6585 §4).

    Attributes:
        limit: the quota's name, as the problem's ``limit.name`` (``activeJobs``,
            ``createsPerSecond``, ``runsPerMinute``).
        value: the quota's value (jobs, creations per second, runs per minute).
        retry_after_seconds: when a retry can succeed (seconds; HTTP ``Retry-After``), or None when
            waiting alone does not help (``activeJobs``: finish, cancel or delete jobs first).
    """

    code = "quota_exceeded"
    status = 429

    def __init__(
        self, message: str, *, limit: str, value: float, retry_after_seconds: float | None = None
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value
        self.retry_after_seconds = retry_after_seconds


class PayloadTooLarge(JobschedError):
    code = "payload_too_large"
    status = 413


class Unavailable(JobschedError, ConnectionError):
    """A dependency (store or NATS) cannot be reached now; a retry may succeed (HTTP 503).

    Adapters raise it for connection loss and timeouts so that callers retry in one place.
    """

    code = "unavailable"
    status = 503


class StoreUnavailable(Unavailable):
    code = "store_unavailable"


class StoreRejected(JobschedError):
    """The store refused one write for good: the same write can never succeed (a value the
    store cannot hold, a document over its size limit, a rule of the store's own).

    Unlike :class:`StoreUnavailable` — the store cannot be used now, so retry — this is about
    the write, not the store: a loop that serves everyone (the recorder, the scheduler) sets the
    write aside, as a dead letter, and carries on with the rest. The gateway never sends a value
    outside the stored range (:mod:`core.values`), so at the API it means a bug: HTTP 500.
    """

    code = "store_rejected"
    status = 500


class BusUnavailable(Unavailable):
    code = "bus_unavailable"


class ConsumerMissing(BusUnavailable):
    """A pull request found no consumer (its stream or the consumer itself was deleted)."""


class LeaseLost(JobschedError):
    """The lease was taken over or expired: stop using the partition at once."""

    code = "lease_lost"


class ConfigError(JobschedError, ValueError):
    """A setting is missing or invalid; raised at start-up, never while serving."""

    code = "config_error"
