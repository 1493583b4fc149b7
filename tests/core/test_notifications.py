"""Run notifications, pure: the Standard Webhooks signature (checked with the reference
library, ``standardwebhooks``), the validation of what users send, the decisions, and the
redaction of secrets."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

import pytest
import standardwebhooks

from core import notifications as n
from core.errors import InvalidRequest
from core.model import Execution, ExecutionStatus
from core.notify_spec import NotifyIn, NotifyTarget

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()
AT = datetime(2026, 6, 1, 12, 0, 0, 250000, tzinfo=UTC)
RUN = Execution(
    id="job-1:2026-06-01T12:00:00.000Z",
    job_id="job-1",
    owner="alice",
    task_id="fail",
    status=ExecutionStatus.FAILED,
    attempt=3,
    scheduled_for=AT,
    created_at=AT,
    updated_at=AT,
    error="boom",
)


def test_the_signature_is_the_one_the_standard_webhooks_library_verifies() -> None:
    target = NotifyTarget(url="https://h.example/", secret=SECRET)
    body = n.payload("failure", RUN, AT)
    headers = n.signed_headers(target, n.webhook_id(RUN.id), AT, body)

    # the library checks the timestamp against its own clock: sign "now" for it
    now = datetime.now(UTC)
    fresh = n.signed_headers(target, headers["webhook-id"], now, body)
    verified = standardwebhooks.Webhook(SECRET).verify(body, fresh)

    assert verified["type"] == "execution.failed" and verified["data"]["id"] == RUN.id
    assert verified["data"]["status"] == "FAILED" and verified["data"]["error"] == "boom"
    assert headers["webhook-timestamp"] == str(int(AT.timestamp()))
    assert headers["webhook-signature"] == standardwebhooks.Webhook(SECRET).sign(
        headers["webhook-id"], AT, body.decode()
    )


def test_a_tampered_body_or_another_secret_fails_verification() -> None:
    now = datetime.now(UTC)
    body = n.payload("failure", RUN, now)
    headers = n.signed_headers(NotifyTarget(url="https://h/", secret=SECRET), "msg_1", now, body)
    other = "whsec_" + base64.b64encode(bytes(32)).decode()

    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(SECRET).verify(body.replace(b"boom", b"fine"), headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(other).verify(body, headers)


def test_without_a_secret_there_is_no_signature_header() -> None:
    headers = n.signed_headers(NotifyTarget(url="https://h/"), "msg_1", AT, b"{}")
    assert set(headers) == {"content-type", "webhook-id", "webhook-timestamp"}


def test_the_webhook_id_is_stable_per_run_and_differs_between_runs() -> None:
    assert n.webhook_id(RUN.id) == n.webhook_id(RUN.id)
    assert n.webhook_id(RUN.id) != n.webhook_id(RUN.id + "x")
    assert n.webhook_id(RUN.id).startswith("msg_") and "." not in n.webhook_id(RUN.id)


def test_the_payload_is_the_final_record_in_the_standard_envelope() -> None:
    doc = json.loads(n.payload("success", RUN, AT))
    assert doc["type"] == "execution.succeeded"
    assert doc["timestamp"] == "2026-06-01T12:00:00.250000Z"
    assert doc["data"]["attempt"] == 3 and doc["data"]["jobId"] == "job-1"


@pytest.mark.parametrize(
    ("given", "field"),
    [
        (NotifyIn(url="ftp://h.example/"), "notify.url"),
        (NotifyIn(url="hooks.example/x"), "notify.url"),
        (NotifyIn(url="https://user:pw@h.example/"), "notify.url"),
        (NotifyIn(url="https:///path"), "notify.url"),
        (NotifyIn(url="https://h.example/ x"), "notify.url"),
        (NotifyIn(url="http://2130706433/"), "notify.url"),
        (NotifyIn(url="http://0177.0.0.1:8080/x"), "notify.url"),
        (NotifyIn(url="https://h.example/", on=[]), "notify.on"),
        (NotifyIn(url="https://h.example/", secret="not base64!"), "notify.secret"),
        (NotifyIn(url="https://h.example/", secret="whsec_" + "QUJD"), "notify.secret"),
        (
            NotifyIn(
                url="https://h.example/", secret="whsec_" + base64.b64encode(bytes(65)).decode()
            ),
            "notify.secret",
        ),
    ],
)
def test_bad_input_names_the_field(given: NotifyIn, field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        n.resolve(given)
    assert [f.field for f in e.value.errors] == [field]


def test_resolve_keeps_the_current_secret_when_none_is_given_and_dedups_outcomes() -> None:
    current = NotifyTarget(url="https://old/", secret=SECRET)
    got = n.resolve(
        NotifyIn(url="https://new.example/", on=["success", "failure", "success"]), current=current
    )
    assert got == NotifyTarget(url="https://new.example/", on=["failure", "success"], secret=SECRET)
    assert n.resolve(None, current=current) is None


def test_what_is_notified() -> None:
    both = NotifyTarget(url="u", on=["failure", "success"])
    failure = NotifyTarget(url="u", on=["failure"])
    assert n.wanted(both, ExecutionStatus.SUCCEEDED) == "success"
    assert n.wanted(failure, ExecutionStatus.SUCCEEDED) is None
    assert n.wanted(failure, ExecutionStatus.FAILED) == "failure"
    assert n.wanted(both, ExecutionStatus.CANCELLED) is None
    assert n.wanted(both, ExecutionStatus.RETRYING) is None
    assert n.wanted(None, ExecutionStatus.FAILED) is None
    assert n.target_for(failure, both) is failure and n.target_for(None, both) is both
    assert [n.retry_at_attempt(k, ok=False) for k in (1, 7, 8)] == [True, True, False]
    assert not n.retry_at_attempt(1, ok=True)


def test_the_api_never_shows_a_secret() -> None:
    shown = n.redacted(NotifyTarget(url="u", on=["failure"], secret=SECRET))
    assert shown == NotifyTarget(url="u", on=["failure"], has_secret=True)
    assert n.redacted(NotifyTarget(url="u")) == NotifyTarget(url="u")
    assert n.redacted(None) is None
