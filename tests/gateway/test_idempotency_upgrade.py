"""A keyed ``POST /jobs`` stored by the release before the instant-normalising fingerprint
(bcba2f9), retried after the upgrade (or on a gateway of the other release, during a rolling one)."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import msgspec
import pytest

from core.model import JobCreate
from gateway.service import request_fingerprint
from tests.gateway.conftest import Api

BODIES = [
    {"taskId": "noop", "schedule": {"type": "once", "executeAt": "2099-01-01T00:00:00Z"}},
    {
        "taskId": "noop",
        "schedule": {
            "type": "cron",
            "expression": "0 * * * *",
            "startAt": "2099-01-01T00:00:00.250Z",
        },
        "labels": {"team": "a", "env": "b"},
    },
]


def legacy_fingerprint(raw: dict[str, object]) -> str:
    """The digest the release before bcba2f9 stored: the decoded body, msgspec JSON with sorted
    keys, its instants as sent."""
    body = msgspec.convert(raw, JobCreate)
    return hashlib.sha256(msgspec.json.Encoder(order="sorted").encode(body)).hexdigest()


@pytest.mark.parametrize("body", BODIES)
async def test_a_keyed_create_stored_by_the_previous_release_and_retried_is_the_same_request(
    api: Api, tmp_path: Path, body: dict[str, object]
) -> None:
    """Its instants in UTC to the millisecond, as most clients write them: the digests agree (one
    written with another offset, or finer than a millisecond, does not match across the upgrade:
    the previous release hashed it as sent)."""
    headers = {**api.auth(), "Idempotency-Key": "order-7"}
    async with api.session.post(f"{api.url}/jobs", json=body, headers=headers) as resp:
        assert resp.status == 201
        job_id = (await resp.json())["id"]
    with sqlite3.connect(tmp_path / "gateway.db") as db:  # as the previous release stored it
        db.execute(
            "UPDATE jobs SET request_hash = ? WHERE id = ?", (legacy_fingerprint(body), job_id)
        )
    async with api.session.post(f"{api.url}/jobs", json=body, headers=headers) as resp:
        answer = await resp.json()
        assert (resp.status, answer.get("code"), answer.get("id")) == (200, None, job_id)


def test_an_explicit_queue_policy_hashes_as_the_previous_release_did() -> None:
    """``concurrencyPolicy: queue`` was the field's default, left out of the digest; it is
    still, now that the field has no default (a task's limit may set another)."""
    plain = {"taskId": "noop", "concurrencyKey": "k"}
    queued = {**plain, "concurrencyPolicy": "queue"}
    assert request_fingerprint(msgspec.convert(queued, JobCreate)) == request_fingerprint(
        msgspec.convert(plain, JobCreate)
    )
    skipping = {**plain, "concurrencyPolicy": "skip"}
    assert request_fingerprint(msgspec.convert(skipping, JobCreate)) != request_fingerprint(
        msgspec.convert(plain, JobCreate)
    )
