"""jobsched on a 3-node NATS cluster (R3 streams and lease bucket), with the node that leads the
lease bucket and the work stream killed: a JetStream leader election under load.

The leases must survive the election (no partition changes hands, no lease is dropped), and no
run may be lost. bench/failover.py --nats cluster measures the delays the election causes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from tests.conftest import SettingsFactory
from tests.faults.cluster import cluster, lost_and_duplicates, now
from tests.faults.natscluster import NatsCluster, nats_cluster
from tests.support import Child, env_for

pytestmark = pytest.mark.slow


@pytest.fixture
async def three_nodes(nats_binary: str, tmp_path: Path) -> AsyncIterator[NatsCluster]:
    async with nats_cluster(nats_binary, tmp_path / "nats-cluster") as c:
        yield c


async def test_a_scheduler_refuses_a_lease_ttl_too_short_for_a_cluster(
    three_nodes: NatsCluster, make_settings: SettingsFactory, tmp_path: Path
) -> None:
    settings = make_settings(nats_url=three_nodes.url, stream_replicas=3, lease_ttl_seconds=3.0)
    child = Child(["scheduler"], env_for(settings), tmp_path / "s1.log")
    try:
        code = await asyncio.to_thread(child.proc.wait, 30)
    finally:
        child.close()
    assert code != 0
    assert "JOBSCHED_LEASE_TTL_SECONDS=3 is too short for the NATS cluster 'jobsched'" in (
        child.output()
    )
    assert "Traceback" not in child.output()


async def test_leases_survive_the_election_after_the_leader_node_is_killed(
    three_nodes: NatsCluster, make_settings: SettingsFactory, tmp_path: Path, prefix: str
) -> None:
    settings = make_settings(
        nats_url=three_nodes.url,
        stream_replicas=3,
        lease_ttl_seconds=15.0,
        partitions=16,
        ack_wait_seconds=5.0,
        redispatch_after_seconds=20.0,
        log_level="INFO",
        quota_creates_per_second=0,  # one user creates 150 jobs at once
    )
    async with cluster(settings, tmp_path) as c:
        c.start("scheduler", "s1")
        c.start("scheduler", "s2")
        c.start("worker", "w1")
        before = await c.wait_balanced({"s1", "s2"}, timeout_seconds=60)
        leader = await three_nodes.leader_of(f"KV_{prefix}_leases")
        await three_nodes.move_leader(f"{prefix.upper()}_WORK", leader)
        start = now() + timedelta(seconds=2)
        jobs = await c.create_once_jobs(150, start, spread_seconds=15)
        await asyncio.sleep(max(0.0, (start + timedelta(seconds=5) - now()).total_seconds()))
        killed_at = now()
        three_nodes.nodes[leader].kill()
        runs = await c.wait_succeeded(jobs, timeout_seconds=90)
        after = await c.wait_balanced({"s1", "s2"}, timeout_seconds=30)
    lost, duplicates = lost_and_duplicates(jobs, runs)
    late = sorted(
        (r.started_at - r.scheduled_for).total_seconds()
        for r in runs
        if r.started_at and r.scheduled_for >= killed_at
    )
    published = sorted(
        (r.published_at - r.scheduled_for).total_seconds()
        for r in runs
        if r.published_at and r.scheduled_for >= killed_at
    )
    print(f"\npublish delays p50 {published[len(published) // 2]:.2f}s max {published[-1]:.2f}s")
    logs = c.children["s1"].output() + c.children["s2"].output()
    print(
        f"\nNATS leader {leader} killed: lost={lost} duplicates={duplicates}; runs due after: "
        f"{len(late)}, start delay p50 {late[len(late) // 2]:.2f}s max {late[-1]:.2f}s; "
        f"fenced and renewed: {logs.count('renewed')} time(s)"
    )
    assert lost == 0
    assert after == before, "no partition changed hands"
    assert "lease(s) to another scheduler" not in logs
