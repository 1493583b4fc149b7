"""Identifiers and partitioning: every id format is built and parsed here, and only here.

Partitions use CRC-32 (``zlib.crc32``), never Python's salted ``hash()``, so every process and
every restart maps a job to the same partition.

The formats (docs/data-model.md):

- execution id: ``<jobId>:<scheduledFor>`` (RFC 3339 UTC with milliseconds), a manual run's
  ``<jobId>:<at>!manual-<8 hex digits>``;
- ``Nats-Msg-Id`` of a run message: its execution id, ``|r<epoch ms>`` appended for a
  re-dispatch; of a run event: ``<execution id>|<status>|<attempt>``; of a job event:
  ``<jobId>|<event>|<at, epoch seconds>``;
- dead letter: ``<stream>:<stream sequence>:<stored at, epoch ms>``;
- run key (a run's subject token and cancel-marker key): 16 hex digits of BLAKE2b of its
  execution id.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid
import zlib
from datetime import datetime

import msgspec

from core.timeutil import isoformat_z

MANUAL_MARK = "!manual-"
"""What separates a manual run's trigger time from its random suffix in its execution id."""


def new_job_id() -> str:
    """A new random job id: 32 lowercase hex digits (UUID4)."""
    return uuid.uuid4().hex


def partition_of(job_id: str, partitions: int) -> int:
    """The partition that owns ``job_id``: ``crc32(job_id) mod partitions``."""
    return zlib.crc32(job_id.encode()) % partitions


def execution_id(job_id: str, scheduled_for: datetime) -> str:
    """Deterministic id of one scheduled occurrence of a job.

    ``"<jobId>:<scheduledFor as RFC 3339 UTC with milliseconds>"``: the same occurrence always
    gets the same id (so a re-publish is de-duplicated by JetStream's ``Nats-Msg-Id`` and by the
    store's unique key), and each occurrence a different one (case S07: an id per job alone
    would make JetStream drop the next occurrence inside its duplicate window).
    """
    return f"{job_id}:{isoformat_z(scheduled_for)}"


def manual_execution_id(job_id: str, at: datetime, nonce: str | None = None) -> str:
    """Id of a run triggered by hand at ``at``: ``"<jobId>:<at>!manual-<nonce>"``.

    ``nonce`` (default: 8 random hex digits) makes two triggers within one millisecond two runs,
    and keeps the id apart from the scheduled occurrence at the same instant.
    """
    return f"{execution_id(job_id, at)}{MANUAL_MARK}{nonce or secrets.token_hex(4)}"


def parse_execution_id(value: str) -> tuple[str, datetime] | None:
    """The job id and scheduled time of an execution id (either format; a manual run's is its
    trigger time); None if ``value`` is not one. Job ids (:func:`new_job_id`) hold no ``:``."""
    job_id, sep, rest = value.partition(":")
    if not sep:
        return None
    at = rest.partition(MANUAL_MARK)[0]
    try:
        return job_id, msgspec.convert(at, datetime)
    except msgspec.ValidationError:
        return None


def run_msg_id(execution_id: str, redispatched_at_ms: int = 0) -> str:
    """``Nats-Msg-Id`` of a run message: the execution id, plus ``|r<ms>`` for a re-dispatch.

    A re-dispatch must not reuse the original id: JetStream remembers ids for its whole
    duplicate window, even after the message was purged, and would drop the new copy.
    """
    return f"{execution_id}|r{redispatched_at_ms}" if redispatched_at_ms else execution_id


def status_msg_id(execution_id: str, status: str, attempt: int) -> str:
    """``Nats-Msg-Id`` of a run event, ``<execution id>|<status>|<attempt>``: a retried publish of
    one transition is stored once."""
    return f"{execution_id}|{status}|{attempt}"


def job_event_msg_id(job_id: str, event: str, at: datetime) -> str:
    """``Nats-Msg-Id`` of a job event, ``<jobId>|<event>|<at, epoch seconds>``."""
    return f"{job_id}|{event}|{at.timestamp()}"


def execution_id_of_msg_id(msg_id: str) -> str:
    """The execution id in a run message's or run event's ``Nats-Msg-Id``."""
    return msg_id.partition("|")[0]


def dead_letter_id(stream: str, sequence: int, stored_at_ms: int) -> str:
    """``<stream>:<stream sequence>:<stored at, ms since the epoch>``: the identity of a stored
    message, the same on every redelivery and not reused by a re-created stream."""
    return f"{stream}:{sequence}:{stored_at_ms}"


def owner_key(owner: str) -> str:
    """A NATS-subject-safe token for a user id: unpadded base64url of its UTF-8 bytes."""
    return base64.urlsafe_b64encode(owner.encode()).decode().rstrip("=") or "_"


def run_key(execution_id: str) -> str:
    """Subject token of a run (``<p>.work.<queue>.<run key>``) and the key of its cancel marker:
    16 hex digits of BLAKE2b of its execution id."""
    return hashlib.blake2b(execution_id.encode(), digest_size=8).hexdigest()
