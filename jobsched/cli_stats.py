"""The ``jobsched`` commands of the dashboard's data: ``stats overview`` (``GET
/stats/overview``), ``stats upcoming`` (``GET /stats/upcoming``) and, for admins, ``cluster``
(``GET /cluster``).

Same conventions as :mod:`jobsched.cli_jobs`: ``--url`` / ``--token`` (or the running ``jobsched
dev``), ``--output table|json``, exit status 1 when the API refuses (``HTTP 403`` for a
non-admin's ``cluster``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import click

from core.cluster import ClusterView
from core.heatmap import UpcomingHeatmap
from core.stats import StatsOverview
from jobsched.cli_jobs import _call, _client_options, _echo_json, _output_option, _table, _when

COMMANDS: list[click.Command] = []
"""The commands of this module (``jobsched.cli`` adds them to its group)."""


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value} ms"


def _ranges(numbers: Sequence[int]) -> str:
    """Ascending integers as ranges: ``[0, 1, 2, 5, 7, 8]`` -> ``0-2,5,7-8``; ``-`` if none."""
    parts: list[str] = []
    run: list[int] = []
    for n in sorted(numbers):
        if run and n != run[-1] + 1:
            parts.append(_span(run))
            run = []
        run.append(n)
    if run:
        parts.append(_span(run))
    return ",".join(parts) or "-"


def _span(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"


def _earliest(times: Sequence[datetime | None]) -> datetime | None:
    known = [t for t in times if t is not None]
    return min(known) if known else None


def _show_overview(data: StatsOverview, output: str) -> None:
    if output == "json":
        _echo_json(data)
        return
    start, end = (t.strftime("%Y-%m-%dT%H:%M:%SZ") for t in (data.window_start, data.window_end))
    click.echo(f"window {start} .. {end}")
    click.echo()
    _table(("STATUS", "RUNS"), [(status, str(runs)) for status, runs in data.totals.items()])
    rate = "-" if data.failure_rate is None else f"{data.failure_rate:.1%}"
    click.echo()
    click.echo(f"failure rate  {rate}  (FAILED / (SUCCEEDED + FAILED))")
    d = data.delay
    click.echo(
        f"delay         p50 {_ms(d.p50_ms)}  p95 {_ms(d.p95_ms)}  p99 {_ms(d.p99_ms)}  "
        f"max {_ms(d.max_ms)}  ({d.runs} runs started)"
    )
    click.echo()
    if not data.queues:
        click.echo("no unfinished runs")
        return
    rows = [(q.queue, str(q.queued), str(q.running), str(q.retrying)) for q in data.queues]
    _table(("QUEUE", "QUEUED", "RUNNING", "RETRYING"), rows)


def _hours(counts: Sequence[int], width: int) -> str:
    """24 hourly counts as one aligned row, ``.`` for 0."""
    return " ".join((str(c) if c else ".").rjust(width) for c in counts)


def _show_upcoming(data: UpcomingHeatmap, output: str) -> None:
    if output == "json":
        _echo_json(data)
        return
    width = max([2, *(len(str(c)) for day in data.days for c in day.hours)])
    header = ("DATE", "FIRES", " ".join(f"{h:02d}".rjust(width) for h in range(24)))
    rows = [(day.date, str(sum(day.hours)), _hours(day.hours, width)) for day in data.days]
    click.echo(f"fire times per hour of {data.timezone}, next 7 days")
    _table(header, rows)
    click.echo()
    busiest = "-"
    if data.busiest_at is not None:
        busiest = f"{_when(data.busiest_at)}, {data.busiest_fires} fire times"
    click.echo(f"{data.fires} fire times of {data.jobs} jobs; busiest hour {busiest}")
    if data.truncated:
        click.echo("truncated: the counts are lower bounds")
    for t in data.transitions:
        before, after = t.offset_before_seconds / 3600, t.offset_after_seconds / 3600
        click.echo(
            f"{data.timezone} changes UTC offset at {_when(t.at)}: {before:+g}h -> {after:+g}h"
        )
    if data.marks:
        click.echo()
        marks = [
            (_when(m.at), str(m.kind), m.rule, m.timezone, str(m.jobs), ", ".join(m.job_ids))
            for m in data.marks
        ]
        _table(("DST AT", "KIND", "RULE", "TIMEZONE", "JOBS", "JOB IDS"), marks)


def _show_cluster(view: ClusterView, output: str) -> None:
    if output == "json":
        _echo_json(view)
        return
    bus = view.bus
    if bus is None:
        click.echo("no NATS bus: no schedulers, leases or queues to show")
    else:
        expiry = {lease.partition: lease.expires_at for lease in bus.leases}
        rows = [
            (
                m.scheduler,
                _ranges(m.partitions),
                _when(_earliest([expiry.get(p) for p in m.partitions])),
                _when(m.expires_at),
            )
            for m in bus.members
        ]
        click.echo(f"{bus.partitions} partitions, lease TTL {bus.lease_ttl_seconds:g} s")
        _table(("SCHEDULER", "PARTITIONS", "FIRST LEASE EXPIRES", "HEARTBEAT EXPIRES"), rows)
        click.echo(f"unleased partitions: {_ranges(view.unleased)}")
        click.echo()
        rows = [
            (q.queue, str(q.pending), str(q.in_flight), str(q.waiting_pulls))
            if q.exists
            else (q.queue, "-", "-", "- (no consumer yet)")
            for q in bus.queues
        ]
        _table(("QUEUE", "PENDING", "IN FLIGHT", "WAITING PULLS"), rows)
    click.echo()
    if not view.workers:
        click.echo("no worker sends a heartbeat or has a run in flight")
        return
    workers = []
    for w in view.workers:
        if (p := w.presence) is None:
            workers.append((w.worker_id, "-", str(len(w.runs)), "-", "- (no heartbeat)"))
            continue
        hb = p.heartbeat
        in_flight = f"{hb.in_flight}/{hb.concurrency}"
        workers.append(
            (w.worker_id, ",".join(hb.queues), in_flight, hb.version, _when(p.heartbeat_at))
        )
    _table(("WORKER", "QUEUES", "IN FLIGHT", "VERSION", "HEARTBEAT"), workers)
    click.echo()
    runs = [
        (w.worker_id, r.execution_id, r.task_id, r.queue, str(r.attempt), _when(r.started_at))
        for w in view.workers
        for r in w.runs
    ]
    if runs:
        _table(("WORKER", "RUN", "TASK", "QUEUE", "ATTEMPT", "STARTED"), runs)
    else:
        click.echo("no run is in flight")
    if view.truncated:
        click.echo("truncated: more runs are in flight")


def _scope_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--all-users", is_flag=True, help="Every user's runs (admins only).")(f)
    f = click.option("--owner", default=None, help="Another user's runs (admins only).")(f)
    return f


@click.group()
def stats() -> None:
    """Run statistics of the last hour, and fire times of the next 7 days."""


@stats.command()
@_scope_options
@_output_option("table")
@_client_options
def overview(
    owner: str | None, all_users: bool, output: str, url: str | None, token: str | None
) -> None:
    """The last hour: runs per final status, the failure rate, schedule-to-start delay
    percentiles (ms) and unfinished runs per queue; your own runs unless an admin asks."""
    data = _call(url, token, lambda c: c.stats_overview(owner=owner, all_users=all_users))
    _show_overview(data, output)


@stats.command()
@click.option("--timezone", default="UTC", show_default=True, help="IANA zone of the hours shown.")
@_scope_options
@_output_option("table")
@_client_options
def upcoming(
    timezone: str,
    owner: str | None,
    all_users: bool,
    output: str,
    url: str | None,
    token: str | None,
) -> None:
    """Fire times of the next 7 days per wall-clock hour of --timezone, one line per day,
    and the fire times a DST transition shifts, skips or repeats."""
    data = _call(
        url,
        token,
        lambda c: c.stats_upcoming(timezone=timezone, owner=owner, all_users=all_users),
    )
    _show_upcoming(data, output)


COMMANDS.append(stats)


@click.command()
@_output_option("table")
@_client_options
def cluster(output: str, url: str | None, token: str | None) -> None:
    """(admins) Schedulers with their partitions and lease expiry, unleased partitions, queues
    with their depth, workers with their in-flight runs."""
    _show_cluster(_call(url, token, lambda c: c.cluster()), output)


COMMANDS.append(cluster)
