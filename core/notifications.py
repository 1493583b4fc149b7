"""Run notifications: who is told about a finished run, how the webhook is signed, and what a
delivery attempt records.

A job's ``notify`` (or, for a job without one, its owner's default, ``PUT /me/notifications``)
names a webhook URL, the outcomes that trigger it (``on``: ``failure`` = a run that ended
FAILED, ``success`` = SUCCEEDED) and an optional signing secret. When a run ends with one of
those outcomes the notifier (:mod:`actors.notifier`) POSTs the Standard Webhooks payload
(https://www.standardwebhooks.com, spec v1)::

    {"type": "execution.failed" | "execution.succeeded", "timestamp": RFC 3339,
     "data": <the run's final execution record, as GET /jobs/{id}/executions/{eid}>}

with the headers ``webhook-id`` (the same for every attempt of one run's notification, so a
receiver can de-duplicate), ``webhook-timestamp`` (integer Unix seconds of this attempt) and,
when a secret is set, ``webhook-signature: v1,<base64(HMAC-SHA256(key, id "." timestamp "."
body))>`` where ``key`` is the secret's bytes (the base64 after ``whsec_``).

Everything here is pure (no I/O): the decisions (:func:`wanted`, :func:`target_for`), the
payload and headers (:func:`signed_headers`), the validation of what users send
(:func:`resolve`). Secrets are write-only: :func:`redacted` is what the API shows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

import msgspec

from core.egress import legacy_ipv4
from core.errors import FieldError, InvalidRequest
from core.model import ExecutionStatus, Instant, Model
from core.notify_spec import NotifyIn, NotifyTarget, Outcome

OUTCOME_OF: Mapping[ExecutionStatus, Outcome] = {
    ExecutionStatus.FAILED: "failure",
    ExecutionStatus.SUCCEEDED: "success",
}
"""The final run statuses that can be notified, and the ``on`` value that asks for each."""
EVENT_TYPE: Mapping[Outcome, str] = {
    "failure": "execution.failed",
    "success": "execution.succeeded",
}
"""The Standard Webhooks ``type`` of each outcome's payload."""

SECRET_PREFIX = "whsec_"
MIN_SECRET_BYTES, MAX_SECRET_BYTES = 24, 64
"""A secret's key length, in bytes (Standard Webhooks: 24 to 64)."""

MAX_ATTEMPTS = 8
"""Delivery attempts of one notification (the first included)."""
FIRST_RETRY_SECONDS = 5.0
"""Delay before the second attempt (seconds); doubled per attempt, with jitter."""
MAX_RETRY_SECONDS = 3600.0
"""The largest delay between two attempts (seconds)."""
RETRY_JITTER = 0.2


class NotificationDefault(Model, kw_only=True, omit_defaults=False, frozen=True):
    """``GET /me/notifications``: the caller's default webhook (None: none)."""

    notify: NotifyTarget | None = None


class NotificationDefaultIn(Model, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """``PUT /me/notifications``: the new default (null: remove it)."""

    notify: NotifyIn | None


class NotificationAttempt(Model, kw_only=True, omit_defaults=False, frozen=True):
    """One delivery attempt of a run's notification (stored in ``notification_attempts``).

    Attributes:
        id: ``<execution id>#<attempt>``.
        execution_id / job_id / owner: the run notified about (``owner`` scopes the listing).
        webhook_id: the ``webhook-id`` header (the same for every attempt).
        attempt: 1-based.
        url: where it was sent.
        event_type: the payload's ``type``.
        at: when the attempt started (UTC).
        duration_ms: how long it took (milliseconds; the refusals take ~0).
        status_code: the receiver's HTTP status; None when there was no answer.
        ok: a 2xx answer.
        error: why it failed (connection error, refused address, non-2xx); None when ok.
        next_attempt_at: when the next attempt is due; None: none will follow.
    """

    id: str
    execution_id: str
    job_id: str
    owner: str
    webhook_id: str
    attempt: int
    url: str
    event_type: str
    at: Instant
    duration_ms: float
    status_code: int | None = None
    ok: bool = False
    error: str | None = None
    next_attempt_at: Instant | None = None


def attempt_id(execution_id: str, attempt: int) -> str:
    return f"{execution_id}#{attempt}"


def webhook_id(execution_id: str) -> str:
    """The ``webhook-id`` of a run's notification: ``msg_`` + 32 hex digits of BLAKE2b of the
    execution id (stable across attempts and notifier restarts)."""
    return "msg_" + hashlib.blake2b(execution_id.encode(), digest_size=16).hexdigest()


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret.

    Raises:
        ValueError: not such a secret, or a key outside 24..64 bytes.
    """
    body = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("must be whsec_ followed by base64") from None
    if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
        raise ValueError(f"the key must be {MIN_SECRET_BYTES} to {MAX_SECRET_BYTES} bytes")
    return key


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` + base64 of HMAC-SHA256 over
    ``<msg_id>.<timestamp>.<body>`` with the secret's key (Standard Webhooks §Signature scheme).
    """
    signed = msg_id.encode() + b"." + str(timestamp).encode() + b"." + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(target: NotifyTarget, msg_id: str, at: datetime, body: bytes) -> dict[str, str]:
    """The headers of one attempt sent at ``at``: ``webhook-id``, ``webhook-timestamp``
    (integer Unix seconds), ``webhook-signature`` (with a secret only), ``content-type``."""
    timestamp = math.floor(at.timestamp())
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
    }
    if target.secret:
        headers["webhook-signature"] = signature(target.secret, msg_id, timestamp, body)
    return headers


class Payload(Model, kw_only=True, omit_defaults=False, frozen=True):
    """The webhook's body (Standard Webhooks' payload structure)."""

    type: str
    timestamp: Instant
    data: Any


_payload_encoder = msgspec.json.Encoder()


def payload(outcome: Outcome, run: object, at: datetime) -> bytes:
    """The body sent for ``run`` (an :class:`core.model.Execution`): JSON, encoded once per
    attempt (the signature covers exactly these bytes)."""
    return _payload_encoder.encode(Payload(type=EVENT_TYPE[outcome], timestamp=at, data=run))


def wanted(target: NotifyTarget | None, status: ExecutionStatus) -> Outcome | None:
    """The outcome to notify about a run that ended ``status`` under ``target``; None: none."""
    if target is None:
        return None
    outcome = OUTCOME_OF.get(status)
    return outcome if outcome is not None and outcome in target.on else None


def target_for(
    job_notify: NotifyTarget | None, default: NotifyTarget | None
) -> NotifyTarget | None:
    """The webhook of a job's runs: the job's own, else its owner's default."""
    return job_notify if job_notify is not None else default


def retry_at_attempt(attempt: int, ok: bool) -> bool:
    """Whether an attempt numbered ``attempt`` that ended ``ok`` is followed by another."""
    return not ok and attempt < MAX_ATTEMPTS


def resolve(
    given: NotifyIn | None, field: str = "notify", *, current: NotifyTarget | None = None
) -> NotifyTarget | None:
    """A user's ``notify`` as stored, checked; ``current``: the stored one a PATCH changes (its
    secret is kept when ``given`` has none).

    Raises:
        InvalidRequest: naming ``<field>.url``, ``<field>.on`` or ``<field>.secret``.
    """
    if given is None:
        return None
    errors = []
    reason = url_problem(given.url)
    if reason:
        errors.append(FieldError(f"{field}.url", reason))
    if not given.on:
        errors.append(FieldError(f"{field}.on", "must name at least one of failure, success"))
    if given.secret is not None:
        try:
            secret_key(given.secret)
        except ValueError as e:
            errors.append(FieldError(f"{field}.secret", str(e)))
    if errors:
        raise InvalidRequest(errors)
    secret = given.secret if given.secret is not None else (current.secret if current else None)
    return NotifyTarget(url=given.url, on=sorted(set(given.on)), secret=secret)


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook URL (None: it can). Where it points is checked at each
    delivery, on the resolved addresses (:mod:`core.egress`)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        return "must be an absolute http:// or https:// URL"
    authority = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    if "@" in authority:
        return "credentials in the URL are not allowed"
    if not authority or authority.startswith(":"):
        return "must name a host"
    if not authority.startswith("[") and legacy_ipv4(authority.rsplit(":", 1)[0]):
        return (
            "an IPv4 address in a legacy form (decimal, octal, hex or short): write it as four "
            "decimal numbers"
        )
    if any(c.isspace() or ord(c) < 32 for c in url):
        return "must not contain whitespace or control characters"
    return None


def redacted(target: NotifyTarget | None) -> NotifyTarget | None:
    """``target`` as the API shows it: without its secret, ``hasSecret: true`` when it has one."""
    if target is None:
        return None
    return NotifyTarget(url=target.url, on=target.on, has_secret=target.secret is not None)


class NotificationStore(Protocol):
    """The store's part of notifications (part of :class:`core.ports.JobStore`). Errors as
    the rest of the store: :class:`core.errors.StoreUnavailable` (retry)."""

    async def get_notification_default(self, owner: str) -> NotifyTarget | None:
        """``owner``'s default webhook (secret included), or None."""
        ...

    async def set_notification_default(self, owner: str, target: NotifyTarget | None) -> None:
        """Set (None: remove) ``owner``'s default webhook (idempotent)."""
        ...

    async def record_notification_attempt(self, attempt: NotificationAttempt) -> None:
        """Store one delivery attempt (idempotent: the same ``id`` again replaces it)."""
        ...

    async def notification_attempts(self, execution_id: str) -> list[NotificationAttempt]:
        """Every recorded attempt of one run's notification, by attempt number."""
        ...


class NotificationAttemptList(Model, kw_only=True, omit_defaults=False, frozen=True):
    """``GET /jobs/{id}/executions/{eid}/notifications``: the run's delivery attempts, in order."""

    items: list[NotificationAttempt]
