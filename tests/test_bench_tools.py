"""bench.capacity's plan and bench.report's verdicts on made-up results, without running a
benchmark (the smoke test runs both on real results files)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from bench.capacity import Cost, choose_row, costs_by_role, plan
from bench.report import Result, evaluate, load_sitting, print_report


def test_costs_of_several_processes_of_a_role_add_up() -> None:
    assert costs_by_role(
        {"scheduler1": 0.3, "scheduler2": 0.2, "worker1": 0.25, "nats-server": 0.2, "x": math.nan}
    ) == {"scheduler": 0.5, "worker": 0.25, "nats-server": 0.2}


def test_plan_gives_a_core_per_process_at_the_busy_share_and_nats_servers_of_n_cores() -> None:
    cost = Cost({"scheduler": 0.4, "worker": 0.2, "nats-server": 0.3}, 0.35, "test")
    by = {p.role: p for p in plan(cost, 10_000, busy=0.7, nats_cores=4)}
    # 10,000 runs/s x 0.4 ms = 4 cores of work, at 70 % busy: 5.7 -> 6 processes of a core
    assert (by["scheduler"].processes, by["scheduler"].cores) == (6, 6)
    assert (by["worker"].processes, by["worker"].cores) == (3, 3)
    assert (by["nats-server"].processes, by["nats-server"].cores) == (2, 5)
    assert (by["gateway"].processes, by["gateway"].cores) == (5, 5)
    recurring = {p.role: p for p in plan(cost, 10_000, posts_per_run=0)}
    assert recurring["gateway"].cores == 0


def test_plan_rejects_a_busy_share_outside_0_to_1() -> None:
    with pytest.raises(ValueError, match="busy"):
        plan(Cost({}, math.nan, "test"), 1000, busy=1.5)


def _run_row(layout: str, rate: float, started: int, **extra: Any) -> dict[str, Any]:
    return {
        "layout": layout,
        "workload": "once",
        "rate": rate,
        "duration_seconds": 60.0,
        "expected_runs": 100,
        "started_runs": started,
        "sched_to_start": {"p99": 0.05, "max": 0.5},
        "cpu_ms_per_run_drained": {"scheduler1": 0.2, "worker1": 0.1, "nats-server": 0.05},
        "nats_msgs_per_run": 9.0,
        **extra,
    }


def test_the_plan_costs_come_from_the_fastest_split_row_that_kept_up() -> None:
    rows = [
        _run_row("one", 4000, 100),
        _run_row("split", 1000, 100),
        _run_row("split", 2000, 100),
        _run_row("split", 4000, 60),
    ]
    assert choose_row(rows) == (rows[2], True)
    assert choose_row(rows[3:]) == (rows[3], False)
    with pytest.raises(ValueError, match="split"):
        choose_row(rows[:1])


def _late_row(layout: str, rate: float) -> dict[str, Any]:
    """A row whose meters started after its window began: every run started, no CPU figures."""
    nan = math.nan
    return _run_row(
        layout,
        rate,
        100,
        cpu_ms_per_run_drained={"scheduler1": nan, "worker1": nan, "nats-server": nan},
        nats_msgs_per_run=nan,
        window_late_seconds=53.6,
    )


def test_the_plan_never_takes_its_costs_from_a_row_without_cpu_figures() -> None:
    measured = _run_row("split", 2000, 100)
    assert choose_row([measured, _late_row("split", 4000)]) == (measured, True)
    with pytest.raises(ValueError, match="CPU figures"):
        choose_row([_late_row("split", 2000)])


def test_report_takes_a_cpu_figure_only_from_a_row_that_has_one() -> None:
    def cpu_check(rows: list[dict[str, Any]]) -> tuple[str, str]:
        checks = evaluate([_result("sustained", {"results": rows})])
        cpu = next(c for c in checks if c.target.startswith("CPU per run end to end at 2,000"))
        return cpu.verdict, cpu.measured

    verdict, measured = cpu_check([_late_row("split", 2000)])
    assert (verdict, measured.startswith("run python -m bench.sustained")) == (
        "not measured",
        True,
    )
    verdict, measured = cpu_check([_late_row("split", 2000), _run_row("split", 2000, 100)])
    assert (verdict, measured.split()[0]) == ("PASS", "0.35")


def _result(name: str, data: dict[str, Any]) -> Result:
    return Result(name, datetime(2026, 1, 1, tzinfo=UTC), Path(f"{name}.json"), data)


def test_report_passes_and_misses_each_target_and_names_what_was_not_measured() -> None:
    sustained = _result(
        "sustained", {"results": [_run_row("split", 2000, 100), _run_row("split", 500, 100)]}
    )
    api = _result(
        "api",
        {
            "results": [
                {
                    "mode": "post",
                    "concurrency": 50,
                    "rate_per_second": 2500.0,
                    "latency": {"p99": 0.02},
                }
            ]
        },
    )
    checks = {c.target: c for c in evaluate([sustained, api])}
    cpu = checks["CPU per run end to end at 2,000 runs/s (split) <= 0.4 ms"]
    assert (cpu.verdict, cpu.measured.split()[0]) == ("PASS", "0.35")
    sustained_target = next(c for t, c in checks.items() if t.startswith("sustained 2,000/s"))
    assert sustained_target.verdict == "PASS"
    ceiling = next(c for t, c in checks.items() if t.startswith("highest rate"))
    assert ceiling.verdict == "MISS"  # 2,000/s held, the aim is 4,000/s
    assert checks["POST /jobs at 50 clients: >= 3,000/s, p99 <= 30 ms"].verdict == "MISS"
    not_measured = {t for t, c in checks.items() if c.verdict == "not measured"}
    assert not_measured == {
        "burst 5,000 and steady 500/s beside the peers",
        "burst 20,000 (split): all started <= 4 s",
        "scheduler RSS with 1,000,000 jobs < 1 GiB",
    }


def test_a_sitting_is_the_files_within_hours_of_the_newest(tmp_path: Path) -> None:
    for name in ("api-20260101T000000Z", "burst-20260101T100000Z", "memory-20260101T200000Z"):
        (tmp_path / f"{name}.json").write_text(json.dumps({"benchmark": name.split("-")[0]}))
    (tmp_path / "notes.json").write_text("{}")
    assert [r.name for r in load_sitting(tmp_path, None, 12)] == ["burst", "memory"]
    since = datetime(2026, 1, 1, tzinfo=UTC)
    assert [r.name for r in load_sitting(tmp_path, since, 12)] == ["api", "burst", "memory"]


def test_report_prints_an_earlier_sittings_figure_beside_todays(
    capsys: pytest.CaptureFixture[str],
) -> None:
    today = _result("sustained", {"results": [_run_row("split", 2000, 100)]})
    slower = _run_row("split", 2000, 100, nats_msgs_per_run=16.0)
    slower["cpu_ms_per_run_drained"] = {"scheduler1": 0.5, "worker1": 0.2, "nats-server": 0.2}
    print_report([today], [_result("sustained", {"results": [slower]})])
    out = capsys.readouterr().out
    (cpu,) = [ln for ln in out.splitlines() if ln.startswith("CPU per run end to end at 2,000")]
    assert cpu.index("0.90 ms") < cpu.index("0.35 ms")  # before, then today
    (msgs,) = [ln for ln in out.splitlines() if "NATS messages per run at 2,000" in ln]
    assert msgs.index("16.0") < msgs.index("9.0")
