"""The ``jobsched`` commands and options of run notifications (README "Notifications"):
``submit --notify-url/--notify-on/--notify-secret``, ``notifications JOB EXECUTION`` (a run's
delivery attempts) and ``notify-default`` (show, set or ``--clear`` your default webhook).
(the options: :mod:`jobsched.notify_options`).
"""

from __future__ import annotations

from typing import Any

import click

from jobsched.cli_jobs import _call, _client_options, _command, _echo_json, _output_option, _table
from jobsched.notify_options import NOTIFY_KEYS, notify_body, notify_options


@_command()
@click.argument("job_id")
@click.argument("execution_id")
@_output_option("table")
@_client_options
def notifications(
    job_id: str, execution_id: str, output: str, url: str | None, token: str | None
) -> None:
    """List the webhook delivery attempts of one run's notification."""
    attempts = _call(url, token, lambda c: c.notification_attempts(job_id, execution_id))
    if output == "json":
        _echo_json({"items": attempts})
        return
    rows = [
        (
            str(a.attempt),
            a.at.isoformat().replace("+00:00", "Z"),
            "ok" if a.ok else "failed",
            "-" if a.status_code is None else str(a.status_code),
            f"{a.duration_ms:g} ms",
            a.error or "-",
        )
        for a in attempts
    ]
    _table(("ATTEMPT", "AT", "RESULT", "STATUS", "DURATION", "ERROR"), rows)


@_command(name="notify-default")
@notify_options
@click.option("--clear", is_flag=True, help="Remove your default webhook.")
@_output_option("json")
@_client_options
def notify_default(
    clear: bool, output: str, url: str | None, token: str | None, **options: Any
) -> None:
    """Show your default webhook (used by your jobs without --notify-url), or set it with
    --notify-url, or remove it with --clear."""
    notify = notify_body(*(options.pop(k) for k in NOTIFY_KEYS))
    if clear and notify is not None:
        raise click.UsageError("use --clear or --notify-url, not both")
    if clear:
        result = _call(url, token, lambda c: c.set_notification_default(None))
    elif notify is not None:
        result = _call(url, token, lambda c: c.set_notification_default(notify))
    else:
        result = _call(url, token, lambda c: c.notification_default())
    _echo_json(result)
