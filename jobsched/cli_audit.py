"""The ``jobsched`` commands for one run and for the audit trail: ``execution`` (``GET
/jobs/{id}/executions/{executionId}``) and ``audit`` (``GET /jobs/{id}/audit``, ``GET /audit``).

Same conventions as :mod:`jobsched.cli_jobs`: ``--url`` / ``--token`` (or the running ``jobsched
dev``), ``--output table|json``, exit status 1 when the API refuses.
"""

from __future__ import annotations

import json

import click
import msgspec

from core.audit import AuditRecord
from core.model import Execution, Page
from jobsched.cli_jobs import (
    _call,
    _client_options,
    _echo_json,
    _more,
    _output_option,
    _table,
    _when,
)

COMMANDS: list[click.Command] = []
"""The commands of this module (``jobsched.cli`` adds them to its group)."""


def _show_execution(run: Execution, output: str) -> None:
    if output == "json":
        _echo_json(run)
        return
    rows = [
        ("id", run.id),
        ("job", run.job_id),
        ("status", run.status),
        ("trigger", str(run.trigger)),
        ("attempt", f"{run.attempt}/{run.max_attempts}"),
        ("scheduled for", _when(run.scheduled_for)),
        ("published", _when(run.published_at)),
        ("started", _when(run.started_at)),
        ("finished", _when(run.finished_at)),
        ("worker", run.worker_id or "-"),
        ("error", run.error or "-"),
        ("result", json.dumps(msgspec.to_builtins(run.result))),
    ]
    if run.skip_reason:
        rows.append(("skipped", run.skip_reason))
    _table(("FIELD", "VALUE"), rows)
    attempts = [
        (
            str(a.attempt),
            _when(a.started_at),
            _when(a.finished_at),
            str(a.outcome or "-"),
            a.worker_id or "-",
            "yes" if a.redelivered else "no",
            (a.error or "")[:60],
        )
        for a in run.attempts
    ]
    if attempts:
        click.echo()
        header = ("ATTEMPT", "STARTED", "FINISHED", "OUTCOME", "WORKER", "REDELIVERED", "ERROR")
        _table(header, attempts)


@click.command()
@click.argument("job_id")
@click.argument("execution_id")
@_output_option("table")
@_client_options
def execution(
    job_id: str, execution_id: str, output: str, url: str | None, token: str | None
) -> None:
    """Show one run (EXECUTION_ID, from `jobsched executions JOB_ID`) with its attempts."""
    run = _call(url, token, lambda c: c.get_execution(job_id, execution_id))
    _show_execution(run, output)


COMMANDS.append(execution)


def _show_audit(page: Page[AuditRecord], output: str) -> None:
    if output == "json":
        _echo_json(page)
        return
    rows = [
        (
            _when(r.at),
            r.job_id,
            str(r.action),
            r.actor if r.actor_role == "user" else f"{r.actor} ({r.actor_role})",
            _short(", ".join(c.field for c in r.changes) or r.execution_id or "-"),
        )
        for r in page.items
    ]
    _table(("AT", "JOB", "ACTION", "ACTOR", "CHANGED"), rows)
    _more(page)


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


@click.command()
@click.argument("job_id", required=False)
@click.option("--actor", default=None, help="Only changes made by this user.")
@click.option("--owner", default=None, help="Another user's jobs (admins only).")
@click.option("--all-users", is_flag=True, help="Every user's jobs (admins only).")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--cursor", default=None, help="nextCursor of a previous page.")
@_output_option("table")
@_client_options
def audit(
    job_id: str | None,
    actor: str | None,
    owner: str | None,
    all_users: bool,
    limit: int,
    cursor: str | None,
    output: str,
    url: str | None,
    token: str | None,
) -> None:
    """Who changed what, when: the audit records of JOB_ID (also after it was deleted), or of
    all your jobs; newest first, a page at a time."""
    if job_id and not (actor or owner or all_users):
        page = _call(url, token, lambda c: c.job_audit(job_id, limit=limit, cursor=cursor))
    else:
        page = _call(
            url,
            token,
            lambda c: c.list_audit(
                owner=owner,
                actor=actor,
                job_id=job_id,
                all_users=all_users,
                limit=limit,
                cursor=cursor,
            ),
        )
    _show_audit(page, output)


COMMANDS.append(audit)
