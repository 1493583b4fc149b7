"""core/access and core/audit: who may do what, and what an audit record says."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from core.access import READ, SCOPES, WRITE, Principal, Role, parse_role, parse_scope
from core.audit import AuditAction, audit_entry, audit_record, job_changes
from core.errors import Forbidden
from core.model import CronSchedule, Job, JobStatus

T0 = datetime(2026, 6, 1, 10, 0, tzinfo=UTC)


def test_absent_claims_mean_a_user_with_every_scope() -> None:
    assert parse_role(None) is Role.USER
    assert parse_scope(None) == SCOPES
    assert parse_scope("jobs:read") == {READ}
    assert parse_scope("jobs:write  jobs:read") == {READ, WRITE}


@pytest.mark.parametrize("claim", ["root", "Admin", "", 1, ["admin"]])
def test_an_unknown_role_is_refused(claim: object) -> None:
    with pytest.raises(ValueError, match="unknown role"):
        parse_role(claim)


@pytest.mark.parametrize(
    ("claim", "message"),
    [("jobs:admin", "unknown scope"), ("jobs:read jobs:wirte", "unknown scope"), ("", "no scope")],
)
def test_an_unknown_or_empty_scope_is_refused(claim: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_scope(claim)
    with pytest.raises(ValueError, match="string"):
        parse_scope(["jobs:read"])


def test_a_read_only_principal_can_read_but_not_write() -> None:
    reader = Principal("alice", scopes=frozenset({READ}))
    reader.require_read()
    with pytest.raises(Forbidden, match="read-only"):
        reader.require_write()
    with pytest.raises(Forbidden):
        Principal("alice", scopes=frozenset({WRITE})).require_read()


def test_only_an_admin_lists_another_users_or_everyones_records() -> None:
    alice, root = Principal("alice"), Principal("root", Role.ADMIN)
    assert alice.owner_filter(None) == "alice"
    assert alice.owner_filter("alice") == "alice"
    with pytest.raises(Forbidden):
        alice.owner_filter("bob")
    with pytest.raises(Forbidden):
        alice.owner_filter(None, all_users=True)
    assert root.owner_filter(None) == "root"
    assert root.owner_filter("bob") == "bob"
    assert root.owner_filter(None, all_users=True) is None
    with pytest.raises(Forbidden):
        root.owner_filter("bob", all_users=True)


def job(**fields: object) -> Job:
    base = Job(
        id="j1",
        owner="alice",
        task_id="generate_report",
        schedule=CronSchedule(expression="0 8 * * *"),
        parameters={"region": "ACME-42", "apiKey": "s3cret"},
        created_at=T0,
        updated_at=T0,
        next_run_at=T0 + timedelta(hours=1),
    )
    return msgspec.structs.replace(base, **fields)


def test_a_creation_records_every_field_and_redacts_parameter_values() -> None:
    changes = {c.field: c for c in job_changes(None, job())}
    assert changes["taskId"].new == "generate_report" and changes["taskId"].old is None
    assert changes["schedule"].new["expression"] == "0 8 * * *"
    assert changes["nextRunAt"].new == "2026-06-01T11:00:00Z"
    assert changes["status"].new == "SCHEDULED"
    for key in ("parameters.apiKey", "parameters.region"):
        assert changes[key].redacted and changes[key].old is None and changes[key].new is None
    assert "s3cret" not in repr(changes) and "ACME-42" not in repr(changes)


def test_a_change_records_only_what_differs() -> None:
    before = job()
    after = job(
        status=JobStatus.PAUSED,
        next_run_at=None,
        updated_at=T0 + timedelta(seconds=5),
        parameters={"region": "ACME-43", "apiKey": "s3cret", "extra": 1},
    )
    changes = job_changes(before, after)
    assert [(c.field, c.old, c.new, c.redacted) for c in changes] == [
        ("status", "SCHEDULED", "PAUSED", False),
        ("nextRunAt", "2026-06-01T11:00:00Z", None, False),
        ("parameters.extra", None, None, True),
        ("parameters.region", None, None, True),
    ]
    assert job_changes(before, None) == [], "a deletion lists nothing"


def test_a_record_names_the_actor_next_to_the_owner() -> None:
    root = Principal("root", Role.ADMIN)
    entry = audit_entry(root, AuditAction.CANCELLED, "j1", "alice", T0)
    record = audit_record(entry, job(), job(status=JobStatus.CANCELLED))
    assert (record.actor, record.actor_role, record.owner) == ("root", Role.ADMIN, "alice")
    assert record.action == AuditAction.CANCELLED and record.at == T0
    assert [c.field for c in record.changes] == ["status"]
    assert audit_entry(root, AuditAction.CANCELLED, "j1", "alice", T0).id != entry.id
