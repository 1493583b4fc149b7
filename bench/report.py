"""Issue 14's targets table from the results files of one sitting: each target, the figure
measured, its limit and PASS / MISS (or "not measured", with the command that measures it).

A sitting is every ``bench/results/*.json`` written within ``--hours`` (12) before the newest one
(or from ``--since``); where several files hold a figure, the newest counts. The files used, their
commits and machines are listed first: figures from different commits are flagged.

    .venv/bin/python -m bench.report [--dir bench/results] [--since 20261203T0600Z] [--hours 12]
    .venv/bin/python -m bench.report --before /tmp/results-base   # a "before" column

With ``--before DIR`` (the files of a sitting at the base commit, e.g. ``BENCH_RESULTS_DIR=DIR``
or ``--json`` there) each target's figure of that sitting is printed beside today's: CPU per run
per process and NATS messages per run before and after.

The commands of a sitting, in order (bench/README.md "A sitting for issue 14"): bench.peers,
bench.sustained --rate 500,2000,4000 --layout split --workload once --duration 60, bench.burst
--jobs 20000 --layout split, bench.api, bench.memory, bench.scaleout.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import capacity, targets
from bench.common import RESULTS_DIR, fmt_num, fmt_seconds, table, verdict


@dataclass(frozen=True)
class Result:
    """One results file: its benchmark name, when it was written, and its content."""

    name: str
    at: datetime
    path: Path
    data: dict[str, Any]


@dataclass(frozen=True)
class Check:
    target: str
    measured: str
    limit: str
    verdict: str
    """PASS, MISS, ``-`` (a figure with no limit) or ``not measured``."""
    source: str


def stamp(path: Path) -> datetime | None:
    """The time in a results file's name (``<name>-YYYYmmddTHHMMSSZ.json``), or None."""
    try:
        return datetime.strptime(path.stem.rsplit("-", 1)[-1], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def load_sitting(directory: Path, since: datetime | None, hours: float) -> list[Result]:
    """The results files of the sitting, oldest first (see the module docstring)."""
    found = []
    for path in directory.glob("*.json"):
        at = stamp(path)
        if at is None:
            continue
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found.append(
            Result(str(data.get("benchmark", path.stem.rsplit("-", 1)[0])), at, path, data)
        )
    if not found:
        return []
    start = since or max(r.at for r in found) - timedelta(hours=hours)
    return sorted((r for r in found if r.at >= start), key=lambda r: r.at)


def rows_of(results: Sequence[Result], *names: str) -> list[tuple[Result, dict[str, Any]]]:
    """Every result row of the named benchmarks, newest file first."""
    out: list[tuple[Result, dict[str, Any]]] = []
    for r in reversed(results):
        if r.name in names:
            out.extend((r, row) for row in r.data.get("results", []))
    return out


def is_split(row: dict[str, Any]) -> bool:
    return row.get("layout") in ("split", "1 sched / 1 work")


def p99(row: dict[str, Any]) -> float:
    v = row.get("sched_to_start", {}).get("p99")
    return math.inf if v is None else float(v)


def all_started(row: dict[str, Any]) -> bool:
    return bool(row.get("expected_runs")) and row.get("started_runs") == row.get("expected_runs")


def cpu_checks(results: Sequence[Result]) -> list[Check]:
    out = []
    for rate, limit in targets.CPU_MS_PER_RUN.items():
        label = f"CPU per run end to end at {rate:,} runs/s (split) <= {limit:g} ms"
        rows = [
            (r, x)
            for r, x in rows_of(results, "sustained", "scaleout")
            if is_split(x) and float(x.get("rate", 0)) == rate and capacity.measured(x)
        ]
        msgs_label = f"  NATS messages per run at {rate:,}/s"
        if not rows:
            out.append(missing(label, f"bench.sustained --layout split --rate {rate}"))
            out.append(Check(msgs_label, "-", "", "-", ""))
            continue
        r, row = rows[0]
        per = {k: v for k, v in row.get("cpu_ms_per_run_drained", {}).items() if not math.isnan(v)}
        total = sum(per.values())
        shown = ", ".join(f"{k} {v:.2f}" for k, v in per.items() if k != "gateway")
        out.append(
            Check(
                label,
                f"{total:.2f} ms ({shown}; {row.get('workload')})",
                f"{limit:g} ms",
                verdict(total, limit),
                r.path.name,
            )
        )
        msgs = row.get("nats_msgs_per_run", math.nan)
        out.append(Check(msgs_label, f"{msgs:.1f}", "", "-", r.path.name))
    return out


def peer_checks(results: Sequence[Result]) -> list[Check]:
    peers = [r for r in reversed(results) if r.name == "peers" and r.data.get("targets")]
    if not peers:
        return [missing("burst 5,000 and steady 500/s beside the peers", "bench.peers")]
    r = peers[0]
    out = [
        Check(
            c["target"],
            fmt_seconds(c["value"]),
            fmt_seconds(c["limit"]) if c["limit"] == c["limit"] else "peer not measured",
            c["verdict"],
            r.path.name,
        )
        for c in r.data["targets"]
    ]
    raw = r.data.get("raw_nats")
    if raw:
        out.append(
            Check(
                "  raw NATS in the same run (publish + consume end to end)",
                f"{raw['pipeline_per_second']:,.0f} msg/s",
                "",
                "-",
                r.path.name,
            )
        )
    return out


def sustained_checks(results: Sequence[Result]) -> list[Check]:
    rate, seconds = targets.SUSTAINED_RATE, targets.SUSTAINED_SECONDS
    label = (
        f"sustained {rate:,.0f}/s for {seconds:g} s (split): every run started, p99 <= "
        f"{targets.SUSTAINED_P99_SECONDS * 1000:g} ms, max <= {targets.SUSTAINED_MAX_SECONDS:g} s"
    )
    rows = rows_of(results, "sustained")
    full = [
        (r, x)
        for r, x in rows
        if is_split(x)
        and float(x.get("rate", 0)) == rate
        and float(x.get("duration_seconds", 0)) >= seconds
    ]
    out = []
    if full:
        r, row = full[0]
        st = row["sched_to_start"]
        p, mx = p99(row), (math.inf if st.get("max") is None else float(st["max"]))
        ok = (
            all_started(row)
            and p <= targets.SUSTAINED_P99_SECONDS
            and mx <= targets.SUSTAINED_MAX_SECONDS
        )
        out.append(
            Check(
                label,
                f"{row['started_runs']:,}/{row['expected_runs']:,} started, p99 "
                f"{fmt_seconds(p)}, max {fmt_seconds(mx)} ({row.get('workload')})",
                "",
                "PASS" if ok else "MISS",
                r.path.name,
            )
        )
    else:
        out.append(missing(label, "bench.sustained --layout split --rate 2000 --duration 60"))
    held = [
        float(x["rate"])
        for _, x in rows
        if is_split(x) and all_started(x) and p99(x) <= targets.CEILING_P99_SECONDS
    ]
    ceiling_label = (
        f"highest rate with p99 <= {targets.CEILING_P99_SECONDS:g} s (split; aim "
        f"{targets.CEILING_AIM_RATE:,.0f}/s)"
    )
    if rows:
        best = max(held, default=math.nan)
        out.append(
            Check(
                ceiling_label,
                f"{fmt_num(best)}/s of "
                + ", ".join(
                    fmt_num(rate)
                    for rate in sorted({float(x["rate"]) for _, x in rows if is_split(x)})
                ),
                f">= {targets.CEILING_AIM_RATE:,.0f}/s",
                verdict(best, targets.CEILING_AIM_RATE, higher_is_better=True),
                "sustained",
            )
        )
    else:
        out.append(missing(ceiling_label, "bench.sustained --layout split --rate 2000,3000,4000"))
    return out


def first(
    results: Sequence[Result], name: str, match: Callable[[dict[str, Any]], bool]
) -> tuple[Result, dict[str, Any]] | None:
    return next(((r, x) for r, x in rows_of(results, name) if match(x)), None)


def burst_check(results: Sequence[Result]) -> Check:
    label = (
        f"burst {targets.BIG_BURST_JOBS:,} (split): all started <= {targets.BIG_BURST_SECONDS:g} s"
    )
    hit = first(results, "burst", lambda x: x.get("jobs") == targets.BIG_BURST_JOBS and is_split(x))
    if hit is None:
        return missing(label, "bench.burst --layout split")
    r, row = hit
    v = float(row["all_started_seconds"])
    return Check(
        label,
        fmt_seconds(v),
        f"{targets.BIG_BURST_SECONDS:g} s",
        verdict(v, targets.BIG_BURST_SECONDS),
        r.path.name,
    )


def api_check(results: Sequence[Result]) -> Check:
    label = (
        f"POST /jobs at {targets.POST_CLIENTS} clients: >= {targets.POST_RATE:,.0f}/s, p99 <= "
        f"{targets.POST_P99_SECONDS * 1000:g} ms"
    )
    hit = first(
        results,
        "api",
        lambda x: x.get("mode") == "post" and x.get("concurrency") == targets.POST_CLIENTS,
    )
    if hit is None:
        return missing(label, "bench.api")
    r, row = hit
    rate, p = float(row["rate_per_second"]), row["latency"].get("p99")
    p = math.inf if p is None else float(p)
    ok = rate >= targets.POST_RATE and p <= targets.POST_P99_SECONDS
    return Check(
        label, f"{rate:,.0f}/s, p99 {fmt_seconds(p)}", "", "PASS" if ok else "MISS", r.path.name
    )


def memory_check(results: Sequence[Result]) -> Check:
    label = f"scheduler RSS with {targets.MEMORY_JOBS:,} jobs < 1 GiB"
    hit = first(results, "memory", lambda x: x.get("jobs") == targets.MEMORY_JOBS)
    if hit is None:
        return missing(label, "bench.memory")
    r, row = hit
    peak = float(row["rss_peak"])
    return Check(
        label,
        f"peak {peak / 2**20:,.0f} MiB",
        "1,024 MiB",
        verdict(peak, targets.MEMORY_RSS_BYTES),
        r.path.name,
    )


def missing(label: str, command: str) -> Check:
    return Check(label, f"run python -m {command}", "", "not measured", "")


def evaluate(results: Sequence[Result]) -> list[Check]:
    """Every issue-14 target against the sitting's results (pure: no I/O)."""
    return [
        *cpu_checks(results),
        *peer_checks(results),
        *sustained_checks(results),
        burst_check(results),
        api_check(results),
        memory_check(results),
    ]


def print_files(label: str, results: Sequence[Result]) -> None:
    print(f"{label}: {len(results)} results file(s)")
    sources = set()
    for r in results:
        m = r.data.get("machine", {})
        sources.add(m.get("source"))
        print(
            f"  {r.path.name}: {r.name}, {m.get('source', '?')}, {m.get('nproc', '?')} cores, "
            f"{m.get('nats_server', '?')}"
        )
    if len(sources) > 1:
        names = ", ".join(sorted(map(str, sources)))
        print(f"WARNING: figures from different sources (commits): {names}")


def print_report(results: Sequence[Result], before: Sequence[Result] = ()) -> list[Check]:
    """Prints the files and the targets table; with ``before`` (an earlier sitting's files) a
    "before" column too, matched by target."""
    print_files("sitting", results)
    if before:
        print_files("before", before)
    checks = evaluate(results)
    print("\nissue 14 targets")
    if before:
        was = {
            c.target: "-" if c.verdict == "not measured" else c.measured for c in evaluate(before)
        }
        print(
            table(
                ["target", "before", "measured", "limit", "verdict", "from"],
                [
                    [c.target, was.get(c.target, "-"), c.measured, c.limit, c.verdict, c.source]
                    for c in checks
                ],
            )
        )
    else:
        print(
            table(
                ["target", "measured", "limit", "verdict", "from"],
                [[c.target, c.measured, c.limit, c.verdict, c.source] for c in checks],
            )
        )
    counted = [c for c in checks if c.verdict in ("PASS", "MISS", "not measured")]
    print(
        f"{sum(c.verdict == 'PASS' for c in counted)} PASS, "
        f"{sum(c.verdict == 'MISS' for c in counted)} MISS, "
        f"{sum(c.verdict == 'not measured' for c in counted)} not measured"
    )
    return checks


def parse_since(text: str) -> datetime:
    for fmt in ("%Y%m%dT%H%M%SZ", "%Y%m%dT%H%MZ", "%Y-%m-%dT%H:%M"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC)
        except ValueError:
            pass
    raise argparse.ArgumentTypeError(f"{text!r}: expected YYYYmmddTHHMMZ (UTC)")


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--dir", type=Path, default=RESULTS_DIR, help="results directory")
    p.add_argument("--since", type=parse_since, default=None, help="UTC, e.g. 20261203T0600Z")
    p.add_argument("--hours", type=float, default=12.0, help="sitting length before the newest")
    p.add_argument(
        "--before",
        type=Path,
        default=None,
        metavar="DIR",
        help="the results directory of an earlier sitting (e.g. at the base commit): a before "
        "column (its newest --hours)",
    )
    args = p.parse_args()
    results = load_sitting(args.dir, args.since, args.hours)
    if not results:
        raise SystemExit(f"no results files in {args.dir}")
    before = load_sitting(args.before, None, args.hours) if args.before else []
    if args.before and not before:
        raise SystemExit(f"no results files in {args.before}")
    print_report(results, before)


if __name__ == "__main__":
    main()
