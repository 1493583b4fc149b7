"""Case S03: executeAt without an offset is refused; with an offset it is stored and echoed in
UTC, and listing by time gives the same answer whatever the process's TZ."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest

from core.clock import FakeClock
from tests.gateway.conftest import Api, start_api

NOW = datetime(2026, 9, 1, 3, 0, 0, 200_000, tzinfo=UTC)


@pytest.fixture(params=["UTC", "America/New_York", "Asia/Tokyo"])
def process_tz(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("TZ", request.param)
    time.tzset()
    yield request.param
    monkeypatch.undo()
    time.tzset()


async def test_s03_execute_at_offsets_under_every_tz(process_tz: str, tmp_path: Path) -> None:
    server, store = await start_api(tmp_path, clock=FakeClock(NOW))
    try:
        async with aiohttp.ClientSession() as session:
            api = Api(str(server.make_url("")).rstrip("/"), store, session)
            naive = {
                "taskId": "noop",
                "schedule": {"type": "once", "executeAt": "2026-09-01T03:00:00"},
            }
            async with session.post(f"{api.url}/jobs", json=naive, headers=api.auth()) as resp:
                assert resp.status == 422
                problem = await resp.json(content_type=None)
                assert problem["errors"][0]["field"] == "schedule.executeAt"
                assert "offset" in problem["errors"][0]["reason"]
            offset = {
                "taskId": "noop",
                "schedule": {"type": "once", "executeAt": "2026-09-01T05:00:00+02:00"},
            }
            async with session.post(f"{api.url}/jobs", json=offset, headers=api.auth()) as resp:
                assert resp.status == 201
                job = await resp.json()
            assert job["schedule"]["executeAt"] == "2026-09-01T03:00:00Z"
            assert job["nextRunAt"] == "2026-09-01T03:00:00Z"
            query = "startTime=2026-09-01T03:00:00Z&endTime=2026-09-01T03:00:01Z"
            async with session.get(f"{api.url}/jobs?{query}", headers=api.auth()) as resp:
                page = await resp.json()
            assert [j["id"] for j in page["items"]] == [job["id"]]
            assert datetime.fromisoformat(page["items"][0]["createdAt"]) == NOW
    finally:
        await server.close()
        await store.close()
