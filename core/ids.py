"""Identifiers and partitioning.

Partitions use CRC-32 (``zlib.crc32``), never Python's salted ``hash()``, so every process and
every restart maps a job to the same partition.
"""

from __future__ import annotations

import base64
import uuid
import zlib
from datetime import datetime

from core.timeutil import isoformat_z


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


def owner_key(owner: str) -> str:
    """A NATS-subject-safe token for a user id: unpadded base64url of its UTF-8 bytes."""
    return base64.urlsafe_b64encode(owner.encode()).decode().rstrip("=") or "_"
