"""The real-world cron cases of tests/cases/scheduling-cases.json, checked against core.cron.

Each ``cron_next`` check becomes one test: ``fire_times(after, tz, count)`` must equal
``fires_utc``. The file's DST policy (cronie/Debian: fixed-time jobs run once per local slot,
shifted out of a spring-forward gap and on the first pass of a fall-back overlap; wildcard jobs
follow real elapsed time) is the default policy of core.cron.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from core.cron import parse_cron, resolve_timezone

CASES_FILE = Path(__file__).resolve().parent.parent / "cases" / "scheduling-cases.json"


def _load() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(CASES_FILE.read_text(encoding="utf-8"))
    return [case for case in cases if case["input"]["type"] == "cron_next"]


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _checks() -> list[Any]:
    params = []
    for case in _load():
        expected = {check["label"]: check for check in case["expected"]["checks"]}
        for check in case["input"]["checks"]:
            params.append(
                pytest.param(
                    check,
                    expected[check["label"]]["fires_utc"],
                    id=f"{case['id']}: {check['label']}",
                )
            )
    return params


def _prev_checks() -> list[Any]:
    return [
        pytest.param(case["expected"]["prev_check"], id=case["id"])
        for case in _load()
        if "prev_check" in case["expected"]
    ]


def test_every_known_cron_case_is_loaded() -> None:
    ids = {case["id"].split("-")[0] for case in _load()}
    assert {"C01", "C02", "C04", "C07", "C09", "C12"} <= ids
    assert len(_checks()) >= 20
    assert len(_prev_checks()) >= 1


@pytest.mark.parametrize(("check", "fires_utc"), _checks())
def test_cron_next_case(check: dict[str, Any], fires_utc: list[str]) -> None:
    cron = parse_cron(check["expression"])
    fires = cron.fire_times(
        _instant(check["after"]), resolve_timezone(check["timezone"]), check["count"]
    )
    assert [f.strftime("%Y-%m-%dT%H:%M:%SZ") for f in fires] == fires_utc
    assert all(f.tzinfo is UTC for f in fires)


@pytest.mark.parametrize("check", _prev_checks())
def test_cron_prev_case(check: dict[str, Any]) -> None:
    cron = parse_cron(check["expression"])
    before = _instant(check["before"])
    previous = cron.previous_at_or_before(before, resolve_timezone(check["timezone"]))
    assert previous == _instant(check["prev_fire_utc"])
    assert previous is not None
    assert previous <= before
    assert cron.next_after(previous, resolve_timezone(check["timezone"])) > before
