"""Scheduling rules through real scheduled runs on a fake clock: DST cases of
tests/cases/scheduling-cases.json fire at the expected instants, and the misfire policies."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from core.clock import FakeClock
from tests.conftest import SettingsFactory
from tests.support import start_stack, succeeded, wait_executions

CASES = {
    c["id"]: c
    for c in json.loads((Path(__file__).parents[1] / "cases" / "scheduling-cases.json").read_text())
}


def check(case_id: str, label: str) -> tuple[dict[str, Any], list[str]]:
    case = CASES[case_id]
    for given, expected in zip(case["input"]["checks"], case["expected"]["checks"], strict=True):
        if given["label"] == label:
            return given, expected["fires_utc"]
    raise KeyError(label)


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(
    ("case_id", "label"),
    [
        ("C01-dst-transition-day-offset", "NY 16:04 daily across 2025-03-09"),
        ("C01-dst-transition-day-offset", "Berlin weekday 08:00 across 2026-03-29"),
        ("C02-dst-gap-fixed-time", "NY 02:30 on 2026-03-08 (gap 02:00-03:00)"),
        ("C02-dst-gap-fixed-time", "wildcard-hour job is NOT caught up"),
        ("C04-dst-fallback-interval-both-passes", "LA hourly across 2026-11-01"),
        ("C04-dst-fallback-interval-both-passes", "Lord Howe every 15 min across 30-min fall-back"),
    ],
)
async def test_cron_runs_fire_at_the_case_instants(
    make_settings: SettingsFactory, case_id: str, label: str
) -> None:
    given, fires = check(case_id, label)
    clock = FakeClock(utc(given["after"]))
    async with start_stack(make_settings(), clock=clock) as stack:
        client = stack.client()
        job = await client.create_job(
            {
                "taskId": "noop",
                "overlapPolicy": "allow",
                "schedule": {
                    "type": "cron",
                    "expression": given["expression"],
                    "timezone": given["timezone"],
                },
            }
        )
        assert job.next_run_at == utc(fires[0])
        for n, fire in enumerate(fires, start=1):
            await clock.set(utc(fire) - timedelta(seconds=1))
            await clock.set(utc(fire))
            await wait_executions(client, job.id, succeeded(n))
        runs = await wait_executions(client, job.id, lambda rs: len(rs) == len(fires))
    assert sorted(r.scheduled_for for r in runs) == [utc(f) for f in fires]
    assert all(r.trigger == "schedule" for r in runs)


@pytest.mark.parametrize(
    ("policy", "ran", "missed"),
    [("skip", [], 10), ("runAll", ["10:07", "10:08", "10:09"], 7), ("runOnce", ["10:09"], 9)],
)
async def test_misfire_policies_after_downtime(
    make_settings: SettingsFactory, policy: str, ran: list[str], missed: int
) -> None:
    """A minutely job whose scheduler was down 10:00-10:09:45 (grace 30 s, maxCatchUp 3)."""
    clock = FakeClock(datetime(2026, 6, 1, 9, 59, 30, tzinfo=UTC))
    settings = make_settings()
    async with start_stack(settings, clock=clock) as stack:
        job = await stack.client().create_job(
            {
                "taskId": "noop",
                "misfirePolicy": policy,
                "misfireGraceSeconds": 30,
                "maxCatchUp": 3,
                "overlapPolicy": "allow",
                "schedule": {"type": "cron", "expression": "* * * * *"},
            }
        )
    await clock.set(datetime(2026, 6, 1, 10, 9, 45, tzinfo=UTC))
    async with start_stack(settings, clock=clock) as stack:
        client = stack.client()
        runs = await wait_executions(
            client,
            job.id,
            lambda rs: (
                len(rs) == len(ran) + 1 and all(r.status in ("SUCCEEDED", "SKIPPED") for r in rs)
            ),
        )
        current = await client.get_job(job.id)
    assert sorted(r.scheduled_for.strftime("%H:%M") for r in runs if r.status == "SUCCEEDED") == ran
    assert all(r.trigger == "catchUp" for r in runs if r.status == "SUCCEEDED")
    [record] = [r for r in runs if r.status == "SKIPPED"]
    assert record.missed is not None
    assert (record.missed.count, record.missed.policy) == (missed, policy)
    assert record.missed.first == datetime(2026, 6, 1, 10, 0, tzinfo=UTC)
    assert current.next_run_at == datetime(2026, 6, 1, 10, 10, tzinfo=UTC), (
        "no nextRunAt left in the past"
    )
