"""The speed targets of issue 14, in one place: the benchmarks print PASS/MISS against these and
``bench.report`` checks a sitting's results files against all of them.

Two targets are relative to a peer measured in the same run of ``bench.peers`` (the burst of
jobsched split against APScheduler 4 in memory, the steady p99 of one process against Celery),
so they have no constant here.
"""

from __future__ import annotations

CPU_MS_PER_RUN = {2000: 0.4, 500: 0.8}
"""End-to-end CPU ms per run (every process, nats-server included) at these due runs/s, split."""
PEER_BURST_JOBS = 5000
BURST_ONE_SECONDS = 1.0
"""The 5,000 burst, one process: all started within this many seconds of the due instant."""
PEER_STEADY_RATE = 500.0
PEER_STEADY_SECONDS = 10.0
STEADY_MAX_SECONDS = 0.010
"""Steady 500/s, one process: schedule-to-start max."""
SUSTAINED_RATE = 2000.0
SUSTAINED_SECONDS = 60.0
SUSTAINED_P99_SECONDS = 0.100
SUSTAINED_MAX_SECONDS = 1.0
"""Sustained 2,000 runs/s for 60 s, split: every run started, p99 and max schedule-to-start."""
CEILING_P99_SECONDS = 1.0
CEILING_AIM_RATE = 4000.0
"""The highest rate whose schedule-to-start p99 stays within 1 s (aim: 4,000/s)."""
BIG_BURST_JOBS = 20_000
BIG_BURST_SECONDS = 4.0
"""A 20,000-job burst, split: all started within 4 s."""
POST_RATE = 3000.0
POST_P99_SECONDS = 0.030
POST_CLIENTS = 50
"""POST /jobs at 50 clients: at least 3,000/s with p99 at most 30 ms."""
MEMORY_JOBS = 1_000_000
MEMORY_RSS_BYTES = 1 << 30
"""The scheduler's RSS with 1,000,000 jobs in the store: under 1 GiB."""
