"""GET /schedules/preview and the cron rules through the HTTP API: every cron case of
tests/cases/scheduling-cases.json, and the 422s for expressions that cannot be used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.conftest import Api

CASES = json.loads((Path(__file__).parents[1] / "cases" / "scheduling-cases.json").read_text())
CHECKS = [
    (case["id"], check, expected["fires_utc"])
    for case in CASES
    if case["input"]["type"] == "cron_next"
    for check, expected in zip(case["input"]["checks"], case["expected"]["checks"], strict=True)
]


async def preview(api: Api, **params: Any) -> tuple[int, dict[str, Any]]:
    query = {k: str(v) for k, v in params.items()}
    async with api.session.get(
        f"{api.url}/schedules/preview", params=query, headers=api.auth()
    ) as resp:
        return resp.status, await resp.json(content_type=None)


@pytest.mark.parametrize(
    ("case_id", "check", "fires"), CHECKS, ids=[f"{c[0]}:{c[1]['label']}" for c in CHECKS]
)
async def test_cases_through_the_preview_endpoint(
    api: Api, case_id: str, check: dict[str, Any], fires: list[str]
) -> None:
    status, body = await preview(
        api,
        expression=check["expression"],
        timezone=check["timezone"],
        after=check["after"],
        count=check["count"],
    )
    assert status == 200, body
    assert body == {"fireTimes": fires}


async def test_preview_applies_the_gap_and_fold_options(api: Api) -> None:
    ny = {"expression": "30 2 * * *", "timezone": "America/New_York", "count": 2}
    _, shift = await preview(api, **ny, after="2026-03-07T12:00:00Z")
    _, skip = await preview(api, **ny, after="2026-03-07T12:00:00Z", gap="skip")
    assert shift["fireTimes"] == ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
    assert skip["fireTimes"] == ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
    fall = {
        "expression": "30 1 * * *",
        "timezone": "America/New_York",
        "count": 2,
        "after": "2026-10-31T12:00:00Z",
    }
    _, once = await preview(api, **fall)
    _, both = await preview(api, **fall, fold="both")
    assert once["fireTimes"] == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    assert both["fireTimes"] == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"expression": "* * *"}, "expression", "field"),
        ({"expression": "61 * * * *"}, "expression", "minute"),
        ({"expression": "*/0 * * * *"}, "expression", "minute"),
        ({"expression": "30-10 * * * *"}, "expression", "minute"),
        ({"expression": "0 0 * FOO *"}, "expression", "month"),
        ({"expression": "@reboot"}, "expression", "reboot"),
        ({"expression": "@every 5m"}, "expression", "every"),
        ({"expression": "CRON_TZ=UTC 0 8 * * *"}, "expression", "CRON_TZ"),
        ({"expression": ""}, "expression", ""),
        ({"expression": "0 0 30 2 *"}, "expression", "never"),
        ({"expression": "0 8 * * *", "timezone": "Mars/Olympus"}, "timezone", ""),
        ({"expression": "0 8 * * *", "after": "2026-01-01T00:00:00"}, "after", "offset"),
        ({"expression": "* * * * *", "after": "0001-01-01T00:00:00Z"}, "after", "1970"),
        ({"expression": "* * * * *", "after": "0001-01-01T00:00:00-01:00"}, "after", "1970"),
        ({"expression": "* * * * *", "after": "9999-12-31T23:59:00Z"}, "after", "9000"),
        ({"expression": "0 8 * * *", "count": "0"}, "count", ""),
        ({"expression": "0 8 * * *", "count": "1001"}, "count", ""),
        ({"expression": "0 8 * * *", "gap": "maybe"}, "gap", ""),
        ({"expression": "0 8 * * *", "fold": "twice"}, "fold", ""),
        ({"timezone": "UTC"}, "expression", "missing"),
        ({"expression": "0 8 * * *", "tz": "UTC"}, "tz", "unknown"),
    ],
)
async def test_bad_previews_are_422_naming_the_field(
    api: Api, params: dict[str, str], field: str, words: str
) -> None:
    status, body = await preview(api, **params)
    assert status == 422, body
    assert body["errors"][0]["field"] == field
    assert (
        words.lower() in body["errors"][0]["reason"].lower()
        or words.lower() in body["detail"].lower()
    )


async def test_jobs_with_unusable_cron_are_refused_naming_the_field(api: Api) -> None:
    for expression in (
        "@reboot",
        "CRON_TZ=Europe/Berlin 0 8 * * *",
        "0 0 30 2 *",
        "",
        "1 2 3 4 5 6 7",
    ):
        body = {"taskId": "noop", "schedule": {"type": "cron", "expression": expression}}
        async with api.session.post(f"{api.url}/jobs", json=body, headers=api.auth()) as resp:
            problem = await resp.json(content_type=None)
            assert resp.status == 422, (expression, problem)
            assert problem["code"] == "invalid_cron"
            assert problem["errors"][0]["field"] == "schedule.expression"


async def test_six_fields_read_seconds_first(api: Api) -> None:
    status, body = await preview(
        api, expression="15 0 12 * * *", after="2026-01-01T00:00:00Z", count=2
    )
    assert status == 200
    assert body["fireTimes"] == ["2026-01-01T12:00:15Z", "2026-01-02T12:00:15Z"]


async def test_a_rare_expression_lists_the_fire_times_the_calendar_holds(api: Api) -> None:
    """A 5th Monday of February comes every 28 years or so: 1,000 of them do not fit before
    year 9999, so the preview lists those that do instead of failing."""
    status, body = await preview(api, expression="0 0 * 2 1#5", count=1000)
    assert status == 200, body
    fires = body["fireTimes"]
    assert 200 < len(fires) < 1000
    assert all(f[5:7] == "02" for f in fires) and fires == sorted(fires)
