"""The ``jobsched`` commands that talk to the API: submit, patch, list, get, executions, the
controls (pause, resume, cancel, trigger, delete), preview, upcoming, explain, watch, tasks (one run
and the audit trail: :mod:`jobsched.cli_audit`).

Each finds the gateway and token in ``--url`` / ``--token`` (env ``JOBSCHED_URL`` /
``JOBSCHED_TOKEN``) or in the running ``jobsched dev``'s ``dev.json``, and prints with
``--output`` (``-o``) ``table`` (for people) or ``json`` (the API's JSON, for scripts). Exit
status: 0 done; 1 the API refused (the problem's detail is printed), the gateway is unreachable,
or ``submit --wait`` saw the run end FAILED or CANCELLED or did not see it end in time; 2 a usage
error (click's).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo

import aiohttp
import click
import msgspec

from core.concurrency import ConcurrencyPolicy
from core.model import Event, Execution, Job, JobEvent, MisfirePolicy, OverlapPolicy, Page
from core.timeutil import isoformat_z
from jobsched.client import ApiError, JobschedClient, WaitTimedOut, WatchClosed
from jobsched.notify_options import notify_field, notify_options

T = TypeVar("T")
DEV_FILE = "dev.json"
COMMANDS: list[click.Command] = []
"""The commands of this module, in help order (``jobsched.cli`` adds them to its group)."""

TERMINAL = ("SUCCEEDED", "FAILED", "SKIPPED", "CANCELLED")
"""The statuses a one-time job ends in."""


def _command(**kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    def register(f: Callable[..., Any]) -> click.Command:
        command: click.Command = click.command(**kwargs)(f)
        COMMANDS.append(command)
        return command

    return register


# --- connection and output ------------------------------------------------------------------


def _client_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--url",
        envvar="JOBSCHED_URL",
        default=None,
        help="Gateway URL [env JOBSCHED_URL; default: the running `jobsched dev`].",
    )(f)
    f = click.option(
        "--token",
        envvar="JOBSCHED_TOKEN",
        default=None,
        help="Bearer token [env JOBSCHED_TOKEN; default: the running `jobsched dev`'s].",
    )(f)
    return f


def _output_option(default: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return click.option(
        "--output",
        "-o",
        type=click.Choice(["table", "json"]),
        default=default,
        show_default=True,
        help="table: for people; json: the API's JSON, for scripts.",
    )


def endpoint(url: str | None, tok: str | None) -> tuple[str, str]:
    """The gateway URL and bearer token: the options', else the running ``jobsched dev``'s.

    Raises:
        click.ClickException: neither is known.
    """
    if url and tok:
        return url, tok
    dev_file = Path(os.environ.get("JOBSCHED_DATA_DIR", "./data")) / DEV_FILE
    dev_info: dict[str, str] = {}
    if dev_file.exists():
        dev_info = json.loads(dev_file.read_text())
    url = url or dev_info.get("url")
    tok = tok or dev_info.get("token")
    if not url or not tok:
        raise click.ClickException(
            "no gateway given: pass --url and --token (or JOBSCHED_URL / JOBSCHED_TOKEN), "
            "or start `jobsched dev` in this directory"
        )
    return url, tok


def _call(url: str | None, tok: str | None, fn: Callable[[JobschedClient], Awaitable[T]]) -> T:
    base, bearer = endpoint(url, tok)

    async def go() -> T:
        async with JobschedClient(base, bearer) as client:
            return await fn(client)

    try:
        return asyncio.run(go())
    except ApiError as e:
        raise click.ClickException(str(e)) from None
    except WaitTimedOut as e:
        raise click.ClickException(str(e)) from None
    except (OSError, TimeoutError, aiohttp.ClientError) as e:
        raise click.ClickException(f"cannot reach {base}: {e}") from None


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(msgspec.to_builtins(obj), indent=2))


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns as wide as their widest cell, two spaces apart (the last one not padded)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=True)]
        click.echo("  ".join(cells).rstrip())


def _when(t: datetime | None, now: datetime | None = None) -> str:
    """An instant as UTC with a relative hint: ``2026-12-02T08:00:00Z (in 3h)``; ``-`` for None."""
    if t is None:
        return "-"
    delta = (t - (now or datetime.now(UTC))).total_seconds()
    return f"{t.strftime('%Y-%m-%dT%H:%M:%SZ')} ({_relative(delta)})"


def _relative(seconds: float) -> str:
    magnitude = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if magnitude >= size:
            amount = f"{int(magnitude // size)}{unit}"
            break
    else:
        amount = f"{int(magnitude)}s"
    return f"in {amount}" if seconds >= 0 else f"{amount} ago"


def _schedule_words(job: Job) -> str:
    s = msgspec.to_builtins(job.schedule)
    match s.get("type"):
        case "cron":
            return f"cron {s['expression']} {s.get('timezone', 'UTC')}"
        case "interval":
            return f"every {s['everySeconds']:g}s"
        case "once":
            return f"once {isoformat_z(datetime.fromisoformat(s['executeAt']))}"
        case _:
            return "immediate"


def _show_job(job: Job, output: str) -> None:
    if output == "json":
        _echo_json(job)
        return
    spec = msgspec.to_builtins(job)
    rows = [
        ("id", job.id),
        ("name", job.name or "-"),
        ("labels", ",".join(f"{k}={v}" for k, v in sorted(job.labels.items())) or "-"),
        ("task", job.task_id),
        ("schedule", _schedule_words(job)),
        ("status", job.status),
        ("next run", _when(job.next_run_at)),
        ("last run", f"{_when(job.last_run_at)} {job.last_run_status or ''}".rstrip()),
        ("runs", str(job.run_count)),
        ("parameters", json.dumps(spec.get("parameters", {}))),
        ("queue", job.queue),
        ("attempts", str(job.max_attempts)),
        ("timeout", f"{job.timeout_seconds:g}s"),
        ("misfire", f"{job.misfire_policy} (grace {job.misfire_grace_seconds:g}s)"),
        ("overlap", str(job.overlap_policy)),
    ]
    if job.concurrency_key is not None:
        rows.append(
            (
                "concurrency",
                f"{job.concurrency_key} (max {job.max_concurrent}, {job.concurrency_policy})",
            )
        )
    _table(("FIELD", "VALUE"), rows)


def _show_runs(page: Page[Execution], output: str) -> None:
    if output == "json":
        _echo_json(page)
        return
    rows = [
        (
            e.id,
            e.status,
            f"{e.attempt}/{e.max_attempts}",
            str(e.trigger),
            _when(e.scheduled_for),
            e.worker_id or "-",
            (e.error or "")[:60],
        )
        for e in page.items
    ]
    _table(("EXECUTION", "STATUS", "ATTEMPT", "TRIGGER", "SCHEDULED FOR", "WORKER", "ERROR"), rows)
    _more(page)


def _instant(text: str | None, option: str) -> datetime | None:
    """An RFC 3339 instant with an offset, or a usage error naming ``option``."""
    if text is None:
        return None
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an RFC 3339 time", param_hint=option) from None
    if t.tzinfo is None:
        raise click.BadParameter("give an offset (Z or +01:00)", param_hint=option)
    return t


def _more(page: Page[Any]) -> None:
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}")


# --- job bodies -----------------------------------------------------------------------------


def _parse_param(values: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--param")
        try:
            out[key] = json.loads(raw)
        except json.JSONDecodeError:
            out[key] = raw
    return out


def _parse_labels(values: tuple[str, ...]) -> dict[str, str]:
    """``--label KEY=VALUE`` options as a label map (VALUE may be empty)."""
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--label")
        out[key] = value
    return out


def _naming_options(patching: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--name`` and ``--label`` (and, to patch, ``--remove-label`` and ``--clear-name``)."""

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        options = [
            click.option("--name", default=None, help="The job's name (unique among your jobs)."),
            click.option(
                "--label",
                "labels",
                multiple=True,
                metavar="KEY=VALUE",
                help="A label (Kubernetes syntax); repeatable."
                + (" Other labels are kept." if patching else ""),
            ),
        ]
        if patching:
            options += [
                click.option(
                    "--remove-label",
                    "remove_labels",
                    multiple=True,
                    metavar="KEY",
                    help="Remove this label; repeatable.",
                ),
                click.option("--clear-name", is_flag=True, help="Remove the job's name."),
            ]
        for option in reversed(options):
            f = option(f)
        return f

    return decorate


def _naming(
    name: str | None,
    labels: tuple[str, ...],
    remove_labels: tuple[str, ...] = (),
    clear_name: bool = False,
) -> dict[str, Any]:
    """The ``name`` and ``labels`` fields the options give (a PATCH's labels: a merge patch,
    null removing a key)."""
    if clear_name and name is not None:
        raise click.UsageError("use --name or --clear-name, not both")
    body: dict[str, Any] = {}
    if name is not None or clear_name:
        body["name"] = name
    patch: dict[str, str | None] = {**_parse_labels(labels)}
    for key in remove_labels:
        if key in patch:
            raise click.UsageError(f"--label and --remove-label both name {key!r}")
        patch[key] = None
    if patch:
        body["labels"] = patch
    return body


def _schedule_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "--at", "execute_at", default=None, help="Once at this RFC 3339 time (with offset)."
            ),
            click.option("--cron", default=None, help="On this cron expression."),
            click.option(
                "--timezone", "tz", default=None, help="IANA time zone of --cron [default: UTC]."
            ),
            click.option(
                "--gap",
                type=click.Choice(["shift", "skip"]),
                default=None,
                help="--cron: a time in a DST gap runs when the gap ends, or not at all.",
            ),
            click.option(
                "--fold",
                type=click.Choice(["once", "both"]),
                default=None,
                help="--cron: a time a DST fold repeats runs once (the first) or twice.",
            ),
            click.option("--every", type=float, default=None, help="Every N seconds."),
            click.option(
                "--start-at", default=None, help="--cron/--every: not before this RFC 3339 time."
            ),
            click.option(
                "--end-at", default=None, help="--cron/--every: not after this RFC 3339 time."
            ),
            click.option(
                "--jitter",
                "jitter_seconds",
                type=float,
                default=None,
                help="--cron/--every: delay each run by a random 0..N seconds.",
            ),
        ]
    ):
        f = option(f)
    return f


def _spec_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        [
            click.option(
                "--param",
                "params",
                multiple=True,
                metavar="KEY=VALUE",
                help="A parameter (VALUE is parsed as JSON when it can be). Repeatable.",
            ),
            click.option("--params-json", default=None, help="All parameters as one JSON object."),
            click.option("--max-attempts", type=int, default=None),
            click.option(
                "--timeout",
                "timeout_seconds",
                type=float,
                default=None,
                help="Run timeout in seconds.",
            ),
            click.option("--queue", default=None),
            click.option(
                "--misfire-policy",
                type=click.Choice([p.value for p in MisfirePolicy]),
                default=None,
                help="What a late recurring job does with the occurrences it missed.",
            ),
            click.option(
                "--misfire-grace",
                "misfire_grace_seconds",
                type=float,
                default=None,
                help="Seconds late an occurrence may still start as scheduled.",
            ),
            click.option(
                "--max-catch-up",
                type=int,
                default=None,
                help="misfirePolicy runAll: at most this many missed runs.",
            ),
            click.option(
                "--history-limit",
                type=int,
                default=None,
                help="Keep this many finished runs [default: the deployment's].",
            ),
            click.option(
                "--history-max-age",
                "history_max_age_seconds",
                type=float,
                default=None,
                help="Keep finished runs this many seconds [default: the deployment's].",
            ),
            click.option(
                "--overlap-policy",
                type=click.Choice([p.value for p in OverlapPolicy]),
                default=None,
                help="What a recurring job does when its previous run is still active.",
            ),
            click.option(
                "--concurrency-key",
                default=None,
                metavar="TEMPLATE",
                help="Limit runs sharing this key, e.g. 'tenant-{customer}' ({name} = a "
                "parameter); '' removes it (update).",
            ),
            click.option(
                "--max-concurrent",
                type=click.IntRange(min=1),
                default=None,
                help="Most runs with the same concurrency key at once, across all workers.",
            ),
            click.option(
                "--concurrency-policy",
                type=click.Choice([p.value for p in ConcurrencyPolicy]),
                default=None,
                help="What a run does when every slot of its key is taken: wait or be skipped.",
            ),
        ]
    ):
        f = option(f)
    return f


def _schedule(
    execute_at: str | None,
    cron: str | None,
    tz: str | None,
    gap: str | None,
    fold: str | None,
    every: float | None,
    start_at: str | None,
    end_at: str | None,
    jitter_seconds: float | None,
) -> dict[str, Any] | None:
    """The schedule the options give (None: no schedule option at all).

    Raises:
        click.UsageError: options that do not go together.
    """
    if sum(x is not None for x in (execute_at, cron, every)) > 1:
        raise click.UsageError("use at most one of --at, --cron, --every")
    if (tz or gap or fold) and not cron:
        raise click.UsageError("--timezone, --gap and --fold go with --cron")
    window = {"startAt": start_at, "endAt": end_at, "jitterSeconds": jitter_seconds}
    window = {k: v for k, v in window.items() if v is not None}
    if window and not (cron or every is not None):
        raise click.UsageError("--start-at, --end-at and --jitter go with --cron or --every")
    if execute_at:
        return {"type": "once", "executeAt": execute_at}
    if cron:
        options = {"timezone": tz, "gap": gap, "fold": fold}
        schedule = {"type": "cron", "expression": cron}
        return schedule | {k: v for k, v in options.items() if v is not None} | window
    if every is not None:
        return {"type": "interval", "everySeconds": every} | window
    return None


def _spec(
    params: tuple[str, ...],
    params_json: str | None,
    max_attempts: int | None,
    timeout_seconds: float | None,
    queue: str | None,
    misfire_policy: str | None,
    misfire_grace_seconds: float | None,
    max_catch_up: int | None,
    history_limit: int | None,
    history_max_age_seconds: float | None,
    overlap_policy: str | None,
    concurrency_key: str | None = None,
    max_concurrent: int | None = None,
    concurrency_policy: str | None = None,
) -> dict[str, Any]:
    """The job options the options give, as API fields (absent ones left out; an empty
    ``--concurrency-key`` is null: no key)."""
    body: dict[str, Any] = {}
    if params_json or params:
        try:
            parameters = json.loads(params_json) if params_json else {}
        except json.JSONDecodeError as e:
            raise click.BadParameter(str(e), param_hint="--params-json") from None
        if not isinstance(parameters, dict):
            raise click.BadParameter("must be a JSON object", param_hint="--params-json")
        body["parameters"] = parameters | _parse_param(params)
    for key, value in (
        ("maxAttempts", max_attempts),
        ("timeoutSeconds", timeout_seconds),
        ("queue", queue),
        ("misfirePolicy", misfire_policy),
        ("misfireGraceSeconds", misfire_grace_seconds),
        ("maxCatchUp", max_catch_up),
        ("historyLimit", history_limit),
        ("historyMaxAgeSeconds", history_max_age_seconds),
        ("overlapPolicy", overlap_policy),
        ("maxConcurrent", max_concurrent),
        ("concurrencyPolicy", concurrency_policy),
    ):
        if value is not None:
            body[key] = value
    if concurrency_key is not None:
        body["concurrencyKey"] = concurrency_key or None
    return body


# --- commands -------------------------------------------------------------------------------


@_command()
@click.argument("task_id")
@_spec_options
@_naming_options(patching=False)
@_schedule_options
@notify_options
@click.option(
    "--idempotency-key",
    default=None,
    help="Create the job at most once for this key: a retry returns the same job.",
)
@click.option(
    "--wait",
    "wait_seconds",
    type=float,
    default=None,
    is_flag=False,
    flag_value=60.0,
    help="Wait up to N seconds (--wait alone: 60) for a one-time job to end; exit 1 unless it "
    "SUCCEEDED.",
)
@_output_option("json")
@_client_options
def submit(
    task_id: str,
    idempotency_key: str | None,
    wait_seconds: float | None,
    output: str,
    url: str | None,
    token: str | None,
    **options: Any,
) -> None:
    """Create a job running TASK_ID (immediately unless --at, --cron or --every)."""
    schedule = _schedule(*(options.pop(k) for k in _SCHEDULE_KEYS))
    body: dict[str, Any] = {"taskId": task_id, **_spec(*(options.pop(k) for k in _SPEC_KEYS))}
    body |= _naming(options.pop("name"), options.pop("labels"))
    body |= notify_field(options)
    if schedule is not None:
        body["schedule"] = schedule
    if (
        wait_seconds is not None
        and schedule is not None
        and schedule["type"] in ("cron", "interval")
    ):
        raise click.UsageError("--wait is for one-time jobs; a recurring job does not end")

    async def go(client: JobschedClient) -> Job:
        if idempotency_key:
            job, _ = await client.create_job_idempotent(body, idempotency_key)
        else:
            job = await client.create_job(body)
        if wait_seconds is not None:
            job = await client.wait_for_status(job.id, TERMINAL, timeout_seconds=wait_seconds)
        return job

    job = _call(url, token, go)
    _show_job(job, output)
    if wait_seconds is not None and job.status != "SUCCEEDED":
        raise click.ClickException(f"job {job.id} ended {job.status}")


_SCHEDULE_KEYS = (
    "execute_at",
    "cron",
    "tz",
    "gap",
    "fold",
    "every",
    "start_at",
    "end_at",
    "jitter_seconds",
)
_SPEC_KEYS = (
    "params",
    "params_json",
    "max_attempts",
    "timeout_seconds",
    "queue",
    "misfire_policy",
    "misfire_grace_seconds",
    "max_catch_up",
    "history_limit",
    "history_max_age_seconds",
    "overlap_policy",
    "concurrency_key",
    "max_concurrent",
    "concurrency_policy",
)


@_command()
@click.argument("job_id")
@_spec_options
@_naming_options(patching=True)
@_schedule_options
@notify_options
@click.option("--no-notify", is_flag=True, help="Remove the job's webhook.")
@_output_option("json")
@_client_options
def patch(
    job_id: str,
    no_notify: bool,
    output: str,
    url: str | None,
    token: str | None,
    **options: Any,
) -> None:
    """Change a job's schedule, parameters or options; the rest stays as it is.

    --param KEY=VALUE changes one parameter and keeps the others; --params-json replaces them
    all (--param then applies on top). A new schedule computes the next run from now.
    --label KEY=VALUE sets one label and --remove-label KEY removes one; the others stay.
    --notify-url replaces the webhook (without --notify-secret it keeps its secret);
    --no-notify removes it.
    """
    merge = options["params"] and not options["params_json"]
    schedule = _schedule(*(options.pop(k) for k in _SCHEDULE_KEYS))
    body = _spec(*(options.pop(k) for k in _SPEC_KEYS))
    body |= _naming(*(options.pop(k) for k in ("name", "labels", "remove_labels", "clear_name")))
    body |= notify_field(options)
    if no_notify:
        if "notify" in body:
            raise click.UsageError("--no-notify goes without --notify-url")
        body["notify"] = None
    if schedule is not None:
        body["schedule"] = schedule
    if not body:
        raise click.UsageError("nothing to change: give at least one option (see --help)")

    async def go(client: JobschedClient) -> Job:
        if merge:
            current = await client.get_job(job_id)
            body["parameters"] = current.parameters | body["parameters"]
        return await client.patch_job(job_id, body)

    _show_job(_call(url, token, go), output)


@_command(name="list")
@click.option(
    "--status",
    default=None,
    help="SCHEDULED, RUNNING, SUCCEEDED, FAILED, SKIPPED, PAUSED or CANCELLED.",
)
@click.option(
    "--last-run-status", default=None, help="e.g. FAILED: recurring jobs whose latest run failed."
)
@click.option("--task", "task_id", default=None, help="Only jobs of this task.")
@click.option("--name", default=None, help="Only the job of this name.")
@click.option(
    "--selector",
    "-l",
    "selector",
    default=None,
    help="Only jobs whose labels match this selector, e.g. 'team=billing,env!=dev'.",
)
@click.option(
    "--created-after", default=None, help="Only jobs created at or after this RFC 3339 time."
)
@click.option("--created-before", default=None, help="Only jobs created before this time.")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--cursor", default=None, help="nextCursor of a previous page.")
@click.option("--owner", default=None, help="Another user's jobs (admins only).")
@click.option("--all-users", is_flag=True, help="Every user's jobs (admins only).")
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --output json.")
@_output_option("table")
@_client_options
def list_(
    status: str | None,
    last_run_status: str | None,
    task_id: str | None,
    name: str | None,
    selector: str | None,
    created_after: str | None,
    created_before: str | None,
    limit: int,
    cursor: str | None,
    owner: str | None,
    all_users: bool,
    as_json: bool,
    output: str,
    url: str | None,
    token: str | None,
) -> None:
    """List your jobs, newest first."""
    page = _call(
        url,
        token,
        lambda c: c.list_jobs(
            status=status,
            last_run_status=last_run_status,
            task_id=task_id,
            name=name,
            labels=selector,
            start_time=_instant(created_after, "--created-after"),
            end_time=_instant(created_before, "--created-before"),
            limit=limit,
            cursor=cursor,
            owner=owner,
            all_users=all_users,
        ),
    )
    if as_json or output == "json":
        _echo_json(page)
        return
    now = datetime.now(UTC)
    rows = [
        (
            j.id,
            j.name or "-",
            j.task_id,
            _schedule_words(j),
            j.status,
            _when(j.last_run_at, now),
            j.last_run_status or "-",
            _when(j.next_run_at, now),
        )
        for j in page.items
    ]
    header = ("ID", "NAME", "TASK", "SCHEDULE", "STATUS", "LAST RUN", "LAST STATUS", "NEXT RUN")
    _table(header, rows)
    _more(page)


@_command()
@click.argument("job_id")
@click.option("--executions", "-e", is_flag=True, help="Also list its latest 50 runs.")
@_output_option("json")
@_client_options
def get(job_id: str, executions: bool, output: str, url: str | None, token: str | None) -> None:
    """Show one job (and its runs)."""

    async def go(client: JobschedClient) -> tuple[Job, Page[Execution] | None]:
        job = await client.get_job(job_id)
        return job, await client.list_executions(job_id, limit=50) if executions else None

    job, runs = _call(url, token, go)
    if output == "json" and runs is not None:
        _echo_json({"job": msgspec.to_builtins(job), "executions": msgspec.to_builtins(runs.items)})
        return
    _show_job(job, output)
    if runs is not None:
        click.echo()
        _show_runs(runs, output)


@_command()
@click.argument("job_id")
@click.option("--limit", type=int, default=20, show_default=True)
@click.option("--cursor", default=None, help="nextCursor of a previous page.")
@_output_option("table")
@_client_options
def executions(
    job_id: str, limit: int, cursor: str | None, output: str, url: str | None, token: str | None
) -> None:
    """List a job's runs (executions), newest first, a page at a time."""
    page = _call(url, token, lambda c: c.list_executions(job_id, limit=limit, cursor=cursor))
    _show_runs(page, output)


def _control(name: str, help_text: str) -> None:
    @_command(name=name, help=help_text)
    @click.argument("job_id")
    @_output_option("json")
    @_client_options
    def command(job_id: str, output: str, url: str | None, token: str | None) -> None:
        method = getattr(JobschedClient, f"{name}_job")
        result = _call(url, token, lambda c: method(c, job_id))
        if result is None:
            click.echo(f"job {job_id} deleted")
        elif isinstance(result, Job):
            _show_job(result, output)
        elif output == "json":
            _echo_json(result)
        else:
            _show_runs(Page(items=[result]), output)


_control("pause", "Pause a job: no run starts until it is resumed.")
_control("resume", "Resume a paused job from now (missed runs are not replayed).")
_control("cancel", "Cancel a job: no further runs; a running run is cancelled.")
_control("trigger", "Run a job once now, in addition to its schedule.")
_control("delete", "Delete a job and its history (its runs are cancelled).")


@_command()
@click.argument("expression")
@click.option("--timezone", "tz", default="UTC", show_default=True, help="IANA time zone.")
@click.option("--after", default=None, help="RFC 3339 instant [default: now].")
@click.option("--count", type=int, default=10, show_default=True)
@click.option("--gap", type=click.Choice(["shift", "skip"]), default="shift", show_default=True)
@click.option("--fold", type=click.Choice(["once", "both"]), default="once", show_default=True)
@_output_option("table")
@_client_options
def preview(
    expression: str,
    tz: str,
    after: str | None,
    count: int,
    gap: str,
    fold: str,
    output: str,
    url: str | None,
    token: str | None,
) -> None:
    """Print the next fire times of a cron EXPRESSION (UTC and local)."""
    start = datetime.fromisoformat(after) if after else None
    times = _call(
        url,
        token,
        lambda c: c.preview(expression, timezone=tz, after=start, count=count, gap=gap, fold=fold),
    )
    if output == "json":
        _echo_json({"fireTimes": [isoformat_z(t) for t in times]})
        return
    zone = ZoneInfo(tz)
    for t in times:
        click.echo(f"{t.strftime('%Y-%m-%dT%H:%M:%SZ')}  {t.astimezone(zone).isoformat()}")


@_command()
@click.argument("job_id")
@click.option("--count", type=int, default=10, show_default=True)
@_output_option("table")
@_client_options
def upcoming(job_id: str, count: int, output: str, url: str | None, token: str | None) -> None:
    """Print a job's next scheduled times (UTC)."""
    times = _call(url, token, lambda c: c.upcoming(job_id, count=count))
    if output == "json":
        _echo_json({"fireTimes": [isoformat_z(t) for t in times]})
        return
    for t in times:
        click.echo(t.strftime("%Y-%m-%dT%H:%M:%SZ"))


@_command()
@click.argument("job_id")
@_output_option("table")
@_client_options
def explain(job_id: str, output: str, url: str | None, token: str | None) -> None:
    """Say why a job's next run has not started (or its last expected run did not happen).

    table: one sentence per reason, most important first, each with its severity and stable
    code; json: the API's answer (GET /jobs/{id}/explain).
    """
    answer = _call(url, token, lambda c: c.explain(job_id))
    if output == "json":
        _echo_json(answer)
        return
    click.echo(f"job {answer.job_id} is {answer.status}; next run: {_when(answer.next_run_at)}")
    for reason in answer.reasons:
        click.echo(f"- {reason.severity.upper()} ({reason.code}): {reason.message}")


@_command()
@click.argument("job_id", required=False)
@click.option("--since", type=int, default=None, help="Replay from after this event id.")
@click.option("--count", type=int, default=None, help="Stop after this many events.")
@_output_option("table")
@_client_options
def watch(
    job_id: str | None,
    since: int | None,
    count: int | None,
    output: str,
    url: str | None,
    token: str | None,
) -> None:
    """Follow live events of your jobs (or of JOB_ID); reconnects without losing any.
    With -o json, one JSON object per line: {"id": …, "event": …}."""
    base, bearer = endpoint(url, token)

    async def go() -> None:
        seen, last = 0, since
        async with JobschedClient(base, bearer) as client:
            while count is None or seen < count:
                try:
                    async for event_id, event in client.watch(
                        job_ids=[job_id] if job_id else None, last_event_id=last
                    ):
                        click.echo(_event_line(event_id, event, output))
                        last, seen = event_id, seen + 1
                        if count is not None and seen >= count:
                            return
                except WatchClosed as e:
                    if e.code in (4000, 4001):
                        raise click.ClickException(str(e)) from None
                    click.echo(f"({e}; reconnecting from event {last})", err=True)
                except aiohttp.ClientError as e:
                    click.echo(f"(connection lost: {e}; reconnecting from event {last})", err=True)
                await asyncio.sleep(1.0)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(go())


def _event_line(event_id: int, event: Event, output: str = "table") -> str:
    if output == "json":
        return json.dumps({"id": event_id, "event": msgspec.to_builtins(event)})
    at = event.at.strftime("%H:%M:%S.%f")[:-3]
    if isinstance(event, JobEvent):
        return f"{event_id:>8} {at} job {event.job_id} {event.event.upper()} -> {event.status}"
    detail = f" attempt {event.attempt}" if event.attempt else ""
    if event.error:
        detail += f": {event.error}"
    return f"{event_id:>8} {at} run {event.execution_id} {event.status}{detail}"


@_command()
@_output_option("table")
@_client_options
def tasks(output: str, url: str | None, token: str | None) -> None:
    """List the tasks the deployment can run."""
    items = _call(url, token, lambda c: c.tasks())
    if output == "json":
        _echo_json({"items": items})
        return
    rows = []
    for t in items:
        schema = t["parameters"]
        defs: dict[str, dict[str, Any]] = schema.get("$defs", {})
        props = defs.get(schema.get("$ref", "").rsplit("/", 1)[-1], schema).get("properties", {})
        limit = t.get("concurrency")
        rows.append(
            (
                t["taskId"],
                t["kind"],
                ", ".join(props) or "-",
                f"{limit['key']} max {limit['maxConcurrent']} ({limit['policy']})"
                if limit
                else "-",
                t["description"],
            )
        )
    _table(("TASK", "KIND", "PARAMETERS", "CONCURRENCY", "DESCRIPTION"), rows)
