"""``jobsched stats overview``, ``stats upcoming`` and ``cluster`` against a real stack (gateway,
scheduler, worker on real NATS, SQLite and HTTP), JSON and table; the table of DST marks and
offset changes from a fixed heatmap."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from core.access import Role
from core.heatmap import DstMark, HeatDay, Transition, UpcomingHeatmap
from core.model import ExecutionStatus
from jobsched.cli_stats import _ranges, _show_upcoming
from tests.e2e.test_cli_audit import cli, cli_json
from tests.support import Stack, wait_executions


async def test_stats_overview_counts_the_callers_runs(stack: Stack) -> None:
    for user in ("alice", "bob"):
        job = await stack.client(user).create_job({"taskId": "noop"})
        await wait_executions(
            stack.client(user), job.id, lambda rs: [r.status for r in rs] == ["SUCCEEDED"]
        )
    mine = await cli_json(stack, "stats", "overview")
    assert mine["totals"]["SUCCEEDED"] == 1 and mine["failureRate"] == 0.0
    assert mine["delay"]["runs"] == 1 and mine["delay"]["p50Ms"] is not None
    everyone = await cli_json(
        stack, "stats", "overview", "--all-users", user="root", role=Role.ADMIN
    )
    assert everyone["totals"]["SUCCEEDED"] == 2
    bobs = await cli_json(
        stack, "stats", "overview", "--owner", "bob", user="root", role=Role.ADMIN
    )
    assert bobs["totals"]["SUCCEEDED"] == 1
    table = (await cli(stack, "stats", "overview")).stdout
    lines = table.splitlines()
    assert ["SUCCEEDED", "1"] in [line.split() for line in lines]
    assert any(line.startswith("failure rate  0.0%") for line in lines), table
    assert "p50 " in table and "p99 " in table and "no unfinished runs" in table
    refused = await cli(stack, "stats", "overview", "--all-users", code=1)
    assert "403" in refused.output


async def test_stats_upcoming_is_a_week_per_local_hour(stack: Stack) -> None:
    await stack.client().create_job(
        {
            "taskId": "noop",
            "schedule": {"type": "cron", "expression": "0 3 * * *", "timezone": "Europe/Berlin"},
        }
    )
    await stack.client("bob").create_job(
        {"taskId": "noop", "schedule": {"type": "cron", "expression": "0 * * * *"}}
    )
    data = await cli_json(stack, "stats", "upcoming", "--timezone", "Europe/Berlin")
    assert data["timezone"] == "Europe/Berlin" and data["jobs"] == 1
    assert data["fires"] in {6, 7}  # 6 when the window starts after 03:00 of its first day
    assert sum(sum(d["hours"]) for d in data["days"]) == data["fires"]
    assert {h for d in data["days"] for h, n in enumerate(d["hours"]) if n} == {3}
    bobs = await cli_json(
        stack, "stats", "upcoming", "--owner", "bob", user="root", role=Role.ADMIN
    )
    assert bobs["jobs"] == 1 and bobs["fires"] >= 24 * 7 - 1
    everyone = await cli_json(
        stack, "stats", "upcoming", "--all-users", user="root", role=Role.ADMIN
    )
    assert everyone["jobs"] == 2 and everyone["fires"] == data["fires"] + bobs["fires"]
    table = (await cli(stack, "stats", "upcoming", "--timezone", "Europe/Berlin")).stdout
    lines = table.splitlines()
    header = lines[1].split()
    assert header == ["DATE", "FIRES", *(f"{h:02d}" for h in range(24))], table
    days = [line.split() for line in lines[2 : 2 + len(data["days"])]]
    assert [d[0] for d in days] == [d["date"] for d in data["days"]]
    assert all(d[2 + 3] in {".", "1"} and d[2 + 4] == "." for d in days), table
    assert f"{data['fires']} fire times of 1 jobs" in table
    bad = await cli(stack, "stats", "upcoming", "--timezone", "Mars/Olympus", code=1)
    assert "422" in bad.output and "timezone" in bad.output
    refused = await cli(stack, "stats", "upcoming", "--owner", "bob", code=1)
    assert "403" in refused.output


async def test_cluster_shows_schedulers_queues_and_workers_to_an_admin(stack: Stack) -> None:
    job = await stack.client().create_job({"taskId": "sleep", "parameters": {"seconds": 600}})
    [run] = await wait_executions(
        stack.client(), job.id, lambda rs: [r.status for r in rs] == [ExecutionStatus.RUNNING]
    )
    view = await cli_json(stack, "cluster", user="root", role=Role.ADMIN)
    bus = view["bus"]
    leased = {lease["partition"] for lease in bus["leases"]}
    assert leased | set(view["unleased"]) == set(range(bus["partitions"]))
    assert [m["partitions"] for m in bus["members"]] == [sorted(leased)]
    assert [q["queue"] for q in bus["queues"]] == ["default"]
    [worker] = view["workers"]
    assert [r["executionId"] for r in worker["runs"]] == [run.id]
    assert worker["presence"]["heartbeat"]["queues"] == ["default"]  # live: its heartbeat
    table = (await cli(stack, "cluster", user="root", role=Role.ADMIN)).stdout
    assert "SCHEDULER" in table and "unleased partitions:" in table
    assert "WAITING PULLS" in table and run.id in table and worker["workerId"] in table
    assert "HEARTBEAT" in table
    refused = await cli(stack, "cluster", code=1)
    assert "403" in refused.output
    await stack.client().cancel_job(job.id)


def test_upcoming_table_shows_dst_marks_and_offset_changes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    at = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)
    data = UpcomingHeatmap(
        timezone="Europe/Berlin",
        window_start=at,
        window_end=at,
        days=[HeatDay(date="2026-03-29", hours=[0, 0, 0, 12, *[0] * 20])],
        fires=12,
        jobs=2,
        busiest_at=at,
        busiest_fires=12,
        marks=[
            DstMark(
                at=at, kind="shifted", rule="gap: shift", timezone="Europe/Berlin", job_ids=["j1"]
            )
        ],
        transitions=[Transition(at=at, offset_before_seconds=3600, offset_after_seconds=7200)],
    )
    _show_upcoming(data, "table")
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[2].split() == ["2026-03-29", "12", ".", ".", ".", "12", *["."] * 20]
    assert "Europe/Berlin changes UTC offset at 2026-03-29T01:00:00Z" in out
    assert "+1h -> +2h" in out
    assert lines[-2].split() == ["DST", "AT", "KIND", "RULE", "TIMEZONE", "JOBS", "JOB", "IDS"]
    assert lines[-1].split()[-6:] == ["shifted", "gap:", "shift", "Europe/Berlin", "1", "j1"]


def test_partitions_are_shown_as_ranges() -> None:
    assert _ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert _ranges([3]) == "3" and _ranges([]) == "-"
