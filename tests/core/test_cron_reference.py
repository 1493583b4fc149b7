"""core.cron against the brute-force reference in cron_reference.py, around real DST transitions."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.cron import CronExpression, FoldPolicy, GapPolicy, parse_cron
from core.errors import InvalidCron
from tests.core.cron_reference import parse_reference, reference_fires, transitions

ZONES = (
    "America/New_York",
    "Europe/Berlin",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Chatham",
    "UTC",
    "America/Sao_Paulo",
    "America/Santiago",
    "Europe/Dublin",
)
POLICIES: tuple[tuple[GapPolicy, FoldPolicy], ...] = (
    ("shift", "once"),
    ("skip", "once"),
    ("shift", "both"),
    ("skip", "both"),
)
COUNT = 3
WINDOW = timedelta(days=4)
CASES_FILE = Path(__file__).resolve().parent.parent / "cases" / "scheduling-cases.json"


@cache
def zone_transitions(zone: str) -> tuple[datetime, ...]:
    return tuple(transitions(ZoneInfo(zone), 2024, 2027))


def assert_matches_reference(
    expression: str,
    zone: str,
    after: datetime,
    *,
    gap: GapPolicy,
    fold: FoldPolicy,
    window: timedelta = WINDOW,
) -> None:
    """core.cron's next fires equal the reference's within ``window``; prev agrees with next."""
    tz = ZoneInfo(zone)
    expected = reference_fires(
        parse_reference(expression), tz, after, limit=COUNT, window=window, gap=gap, fold=fold
    )
    cron = parse_cron(expression)
    actual = cron.fire_times(after, tz, COUNT, gap=gap, fold=fold)
    assert actual[: len(expected)] == expected
    if len(expected) < COUNT:
        assert actual[len(expected)] > after + window
    _assert_previous_consistent(cron, tz, after, actual[: len(expected)], gap=gap, fold=fold)


def _assert_previous_consistent(
    cron: CronExpression,
    tz: ZoneInfo,
    after: datetime,
    verified: list[datetime],
    *,
    gap: GapPolicy,
    fold: FoldPolicy,
) -> None:
    for earlier, later in itertools.pairwise(verified):
        assert cron.previous_at_or_before(later, tz, gap=gap, fold=fold) == later
        one_second_before = later - timedelta(seconds=1)
        assert cron.previous_at_or_before(one_second_before, tz, gap=gap, fold=fold) == earlier
    if verified:
        before = cron.previous_at_or_before(after, tz, gap=gap, fold=fold)
        if before is not None:
            assert before <= after
            assert cron.next_after(before, tz, gap=gap, fold=fold) == verified[0]


# --- the reference is itself checked against the real-world cases -------------------------------


def _walkable_case_checks() -> list[Any]:
    """The case file's cron checks whose last fire is close enough for a minute-by-minute walk."""
    params = []
    for case in json.loads(CASES_FILE.read_text(encoding="utf-8")):
        if case["input"]["type"] != "cron_next":
            continue
        expected = {check["label"]: check for check in case["expected"]["checks"]}
        for check in case["input"]["checks"]:
            fires_utc = expected[check["label"]]["fires_utc"]
            if _instant(fires_utc[-1]) - _instant(check["after"]) <= timedelta(days=120):
                params.append(pytest.param(check, fires_utc, id=check["label"]))
    return params


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize(("check", "fires_utc"), _walkable_case_checks())
def test_reference_reproduces_the_cases(check: dict[str, Any], fires_utc: list[str]) -> None:
    after = _instant(check["after"])
    last = _instant(fires_utc[-1])
    found = reference_fires(
        parse_reference(check["expression"]),
        ZoneInfo(check["timezone"]),
        after,
        limit=check["count"],
        window=last - after,
    )
    assert [f.strftime("%Y-%m-%dT%H:%M:%SZ") for f in found] == fires_utc


def test_reference_sees_the_transitions() -> None:
    assert datetime(2026, 3, 8, 7, tzinfo=UTC) in zone_transitions("America/New_York")
    assert datetime(2026, 4, 4, 15, tzinfo=UTC) in zone_transitions("Australia/Lord_Howe")
    assert zone_transitions("Asia/Kolkata") == ()


# --- a deterministic sweep over every transition of 2026 ----------------------------------------

SWEEP_EXPRESSIONS = (
    "30 2 * * *",
    "0,30 1,2 * * *",
    "45 2 * * *",
    "15 1 * * *",
    "0 0 * * *",
    "0 23 * * *",
    "*/15 * * * *",
    "0 */2 * * *",
)


@pytest.mark.parametrize("zone", [z for z in ZONES if zone_transitions(z)])
def test_every_2026_transition(zone: str) -> None:
    for transition in zone_transitions(zone):
        if transition.year != 2026:
            continue
        for expression in SWEEP_EXPRESSIONS:
            for gap, fold in POLICIES:
                assert_matches_reference(
                    expression,
                    zone,
                    transition - timedelta(hours=4),
                    gap=gap,
                    fold=fold,
                    window=timedelta(days=2),
                )


# --- random expressions around random transitions ------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    expression: str
    zone: str
    after: datetime
    gap: GapPolicy
    fold: FoldPolicy


def _field(
    low: int, high: int, favourites: list[int], *, star: bool, step: bool = True
) -> st.SearchStrategy[str]:
    value = st.one_of(st.sampled_from(favourites), st.integers(low, high))
    span = st.tuples(value, value).map(lambda pair: "{}-{}".format(*sorted(pair)))
    items = [value.map(str), span]
    if step:
        steps = st.integers(1, high - low + 1 if high != 7 else 7)
        items.append(st.tuples(span, steps.map(str)).map("/".join))
        items.append(st.tuples(value.map(str), steps.map(str)).map("/".join))
    plain = st.lists(st.one_of(*items), min_size=1, max_size=3).map(",".join)
    if not star:
        return plain
    starred = st.one_of(
        st.just("*"),
        st.integers(1, 7 if high == 7 else high - low + 1).map(lambda n: f"*/{n}"),
    )
    return st.one_of(starred, plain, st.tuples(starred, plain).map(",".join))


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """An expression, zone, policy and ``after`` instant close to one of the zone's transitions.

    A third of the expressions are "focused": one or two fixed minutes and hours taken from the
    wall times around the transition (including the skipped hour), every day, with ``after`` a
    few hours before it, so that gap and fold policies decide the answer.
    """
    zone = draw(st.sampled_from(ZONES))
    tz = ZoneInfo(zone)
    moments = zone_transitions(zone)
    if moments:
        pivot = draw(st.sampled_from(moments))
    else:
        pivot = datetime(2024, 1, 1, tzinfo=UTC) + timedelta(hours=draw(st.integers(0, 35_000)))
    local = [(pivot + timedelta(minutes=m)).astimezone(tz) for m in (-61, -1, 0, 61)]
    hours = sorted({t.hour for t in local} | {(local[1] + timedelta(hours=1)).hour})
    minutes = sorted({0, 15, 30, 45} | {t.minute for t in local})
    kind = draw(st.sampled_from(["focused", "fixed", "any"]))
    if kind == "focused":
        offset_min = draw(st.integers(-4 * 60, -1))
        minute = ",".join(map(str, draw(st.sets(st.sampled_from(minutes), min_size=1, max_size=2))))
        near = sorted({local[1].hour, (local[1] + timedelta(hours=1)).hour, local[2].hour})
        hour = ",".join(map(str, draw(st.sets(st.sampled_from(near), min_size=1, max_size=2))))
        day = month = weekday = "*"
    else:
        offset_min = draw(st.integers(-36 * 60, 3 * 60))
        minute = draw(_field(0, 59, minutes, star=kind == "any"))
        hour = draw(_field(0, 23, hours, star=kind == "any", step=kind == "any"))
        days = [t.day for t in local] + [31]
        day = draw(st.one_of(st.just("*"), st.just("*"), _field(1, 31, days, star=True)))
        months = [local[0].month]
        month = draw(st.one_of(st.just("*"), st.just("*"), _field(1, 12, months, star=True)))
        weekday = draw(
            st.one_of(
                st.just("*"),
                st.just("*"),
                st.sampled_from(["mon-fri", "SAT,sun", "fri-sun", "Tue"]),
                _field(0, 7, [t.isoweekday() % 7 for t in local], star=True),
            )
        )
    after = pivot + timedelta(minutes=offset_min, seconds=draw(st.sampled_from([0, 1, 59])))
    return Scenario(
        expression=" ".join((minute, hour, day, month, weekday)),
        zone=zone,
        after=after,
        gap=draw(st.sampled_from(["shift", "skip"])),
        fold=draw(st.sampled_from(["once", "both"])),
    )


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(scenarios())
def test_random_expressions_match_the_reference(scenario: Scenario) -> None:
    try:
        parse_cron(scenario.expression)
    except InvalidCron as error:
        assert error.cron_field == "expression"
        assert "never fires" in error.reason
        assert not reference_fires(
            parse_reference(scenario.expression),
            ZoneInfo(scenario.zone),
            scenario.after,
            limit=1,
            window=timedelta(days=400),
        )
        return
    assert_matches_reference(
        scenario.expression, scenario.zone, scenario.after, gap=scenario.gap, fold=scenario.fold
    )
