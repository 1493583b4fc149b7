"""The ``jobsched`` commands for what happens after a run: ``dead-letters`` (runs that failed
their last attempt, across jobs), ``replay``, ``bulk replay|cancel|show`` and ``backfill``.

Connection, output and exit status as the job commands (:mod:`jobsched.cli_jobs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from core.backfill import BackfillResult
from core.bulk import BulkAction
from core.model import ExecutionStatus, OverlapPolicy, Page
from jobsched.cli_jobs import (
    _call,
    _client_options,
    _echo_json,
    _instant,
    _output_option,
    _show_runs,
    _table,
    _when,
)
from jobsched.client import JobschedClient

RUN_COMMANDS: list[click.Command] = []
"""The commands of this module, in help order (``jobsched.cli`` adds them to its group)."""


def _filter_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option("--task", "task_id", default=None, help="Only runs of this task."),
            click.option("--from", "from_", default=None, help="Scheduled at or after (RFC 3339)."),
            click.option("--to", default=None, help="Scheduled before (RFC 3339)."),
            click.option("--error", default=None, help="Error contains this text (any case)."),
            click.option(
                "--selector",
                "-l",
                "selector",
                default=None,
                help="Only runs of jobs matching this label selector ('team=billing,env!=dev').",
            ),
            click.option("--owner", default=None, help="Another user's runs (admins)."),
            click.option("--all-users", is_flag=True, help="Every user's runs (admins)."),
        ]
    ):
        f = option(f)
    return f


def _filters(
    task_id: str | None,
    from_: str | None,
    to: str | None,
    error: str | None,
    owner: str | None,
    all_users: bool,
    status: str | None = None,
    selector: str | None = None,
) -> dict[str, Any]:
    start, end = _instant(from_, "--from"), _instant(to, "--to")
    body: dict[str, Any] = {
        "status": status,
        "taskId": task_id,
        "from": start.isoformat() if start else None,
        "to": end.isoformat() if end else None,
        "error": error,
        "labels": selector,
        "owner": owner,
        "allUsers": True if all_users else None,
    }
    return {k: v for k, v in body.items() if v is not None}


@click.command(name="dead-letters")
@click.option(
    "--status",
    type=click.Choice([s.value for s in ExecutionStatus]),
    default="FAILED",
    show_default=True,
    help="Runs in this status (FAILED: the dead letters).",
)
@_filter_options
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--cursor", default=None, help="nextCursor of a previous page.")
@_output_option("table")
@_client_options
def dead_letters(
    status: str,
    task_id: str | None,
    from_: str | None,
    to: str | None,
    error: str | None,
    selector: str | None,
    owner: str | None,
    all_users: bool,
    limit: int,
    cursor: str | None,
    output: str,
    url: str | None,
    token: str | None,
) -> None:
    """List runs that failed their last attempt, across your jobs, newest first."""
    start, end = _instant(from_, "--from"), _instant(to, "--to")

    async def go(c: JobschedClient) -> Page[Any]:
        return await c.dead_letters(
            status=status,
            task_id=task_id,
            scheduled_from=start,
            scheduled_to=end,
            error=error,
            labels=selector,
            limit=limit,
            cursor=cursor,
            owner=owner,
            all_users=all_users,
        )

    _show_runs(_call(url, token, go), output)


RUN_COMMANDS.append(dead_letters)


@click.command()
@click.argument("job_id")
@click.argument("execution_id")
@click.option(
    "--force", is_flag=True, help="Replay it even if it was replayed already (else: 409)."
)
@_output_option("table")
@_client_options
def replay(
    job_id: str, execution_id: str, force: bool, output: str, url: str | None, token: str | None
) -> None:
    """Replay a finished run: a new run of the job now, pointing to EXECUTION_ID. A run that
    has a replay already is refused (naming the replay) unless --force."""
    run = _call(url, token, lambda c: c.replay(job_id, execution_id, force=force))
    if output == "json":
        _echo_json(run)
    else:
        _show_runs(Page(items=[run]), output)


RUN_COMMANDS.append(replay)


@click.command()
@click.argument("job_id")
@click.option("--from", "from_", required=True, help="First scheduled time (RFC 3339).")
@click.option("--to", required=True, help="End of the range, exclusive, not after now.")
@click.option("--dry-run", is_flag=True, help="List the fire times; create nothing.")
@click.option(
    "--overlap-policy",
    type=click.Choice([p.value for p in OverlapPolicy]),
    default=None,
    help="Among the backfilled runs [default: the job's].",
)
@_output_option("table")
@_client_options
def backfill(
    job_id: str,
    from_: str,
    to: str,
    dry_run: bool,
    overlap_policy: str | None,
    output: str,
    url: str | None,
    token: str | None,
) -> None:
    """Create the runs a cron or interval job would have had between --from and --to."""
    start, end = _instant(from_, "--from"), _instant(to, "--to")
    assert start is not None and end is not None
    result: BackfillResult = _call(
        url,
        token,
        lambda c: c.backfill(job_id, start, end, dry_run=dry_run, overlap_policy=overlap_policy),
    )
    if output == "json":
        _echo_json(result)
        return
    rows = [
        (_when(r.scheduled_for), r.status, "yes" if r.created else "no", r.execution_id)
        for r in result.runs
    ]
    _table(("SCHEDULED FOR", "STATUS", "CREATED", "EXECUTION"), rows)
    if result.dry_run:
        click.echo(
            f"dry run: {len(result.runs)} fire times ({result.overlap_policy}); nothing created"
        )
    else:
        click.echo(
            f"{result.queued} queued, {result.skipped} skipped, {result.existing} existed already"
        )


RUN_COMMANDS.append(backfill)


@click.group()
def bulk() -> None:
    """Replay or cancel runs in bulk by filter; show a bulk action's progress."""


def _show_bulk(action: BulkAction, output: str) -> None:
    if output == "json":
        _echo_json(action)
        return
    f = action.filter
    rows = [
        ("id", action.id),
        ("kind", str(action.kind)),
        ("status", str(action.status)),
        ("done / skipped / failed", f"{action.done} / {action.skipped} / {action.failed}"),
        ("statuses", ", ".join(f.statuses)),
        ("task", f.task_id or "-"),
        ("from / to", f"{_when(f.scheduled_from)} / {_when(f.scheduled_to)}"),
        ("error contains", f.error or "-"),
        ("labels", f.labels or "-"),
        ("owner", f.owner or "(every user)"),
        ("actor", action.actor),
        ("created", _when(action.created_at)),
        ("finished", _when(action.finished_at)),
    ]
    _table(("FIELD", "VALUE"), rows)


def _bulk_command(kind: str, help_text: str, statuses: list[str]) -> None:
    @bulk.command(name=kind, help=help_text)
    @click.option("--status", type=click.Choice(statuses), default=None)
    @_filter_options
    @click.option("--wait", is_flag=True, help="Wait until the action finished.")
    @click.option("--timeout", type=float, default=300.0, show_default=True, help="seconds")
    @_output_option("table")
    @_client_options
    def command(
        status: str | None,
        task_id: str | None,
        from_: str | None,
        to: str | None,
        error: str | None,
        selector: str | None,
        owner: str | None,
        all_users: bool,
        wait: bool,
        timeout: float,
        output: str,
        url: str | None,
        token: str | None,
    ) -> None:
        body = _filters(task_id, from_, to, error, owner, all_users, status, selector)

        async def go(c: JobschedClient) -> BulkAction:
            create = c.bulk_replay if kind == "replay" else c.bulk_cancel
            action = await create(body)
            if wait:
                action = await c.wait_bulk(action.id, timeout_seconds=timeout)
            return action

        _show_bulk(_call(url, token, go), output)


_bulk_command(
    "replay",
    "Replay every run the filter selects (default: FAILED, the dead letters).",
    ["FAILED", "CANCELLED", "SUCCEEDED"],
)
_bulk_command(
    "cancel",
    "Cancel every run in progress the filter selects (default: QUEUED, RUNNING, RETRYING).",
    ["QUEUED", "RUNNING", "RETRYING"],
)


@bulk.command(name="show")
@click.argument("bulk_id")
@_output_option("table")
@_client_options
def show(bulk_id: str, output: str, url: str | None, token: str | None) -> None:
    """Show a bulk action: its status, counts and filter."""
    _show_bulk(_call(url, token, lambda c: c.get_bulk(bulk_id)), output)


RUN_COMMANDS.append(bulk)
